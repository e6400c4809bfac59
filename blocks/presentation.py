"""How every block presents itself in Prefect's UI and CLI: the logo, the documentation link and
the code example, declared once.

The logo and the documentation are the project's own ``Logo`` and ``Documentation`` URLs from its
metadata (``pyproject.toml``), so each is declared in one place. Prefect takes only an http(s)
URL of at most 2,083 characters for a logo (no ``data:`` URL; its client refuses to read a block
type with any other), so the logo is the raw URL of :data:`LOGO_FILE` in the repository — which a
browser without the internet cannot load. For such a UI, ``$TAO_DATA_IO_LOGO_URL`` names a URL
its browsers reach, read when the blocks are imported and registered: Prefect's server started
by :mod:`deployments.server` (the demo's) serves :data:`LOGO_FILE` at its ``LOGO_PATH``, and any
web server of the site can serve the file.
"""

from __future__ import annotations

import os
import warnings
from importlib.metadata import metadata
from pathlib import Path
from urllib.parse import urlsplit

from tao_data_io.vocabulary import LOGO_URL_VARIABLE

#: The logo the ``Logo`` URL serves, kept in this tree (what the standard test suite checks).
LOGO_FILE = Path(__file__).with_name("logo.png")


def _project_urls() -> dict[str, str]:
    return dict(entry.split(", ", 1) for entry in metadata("tao-data-io").get_all("Project-URL") or ())


def _logo_url() -> str:
    """``$TAO_DATA_IO_LOGO_URL`` when it is an http(s) URL, else the project's ``Logo`` URL. A
    wrong value only costs the logo (it is presentation), so it is said and passed over rather
    than failing every import of the blocks."""
    given = os.environ.get(LOGO_URL_VARIABLE, "")
    parts = urlsplit(given)
    if parts.scheme in ("http", "https") and parts.netloc and len(given) <= 2083:
        return given
    if given:
        warnings.warn(f"{LOGO_URL_VARIABLE}={given[:100]!r} is not an http(s) URL (at most 2,083 characters): the "
                      f"blocks show the project's logo URL instead; set it to a URL your users' browsers reach "
                      f"that serves blocks/logo.png, or unset it", stacklevel=2)
    return _project_urls()["Logo"]


LOGO_URL = _logo_url()
DOCUMENTATION_URL = _project_urls()["Documentation"]


def code_example(block: str, variable: str, usage: str) -> str:
    """A block's code example: import it, load a saved one, use it — as Prefect's standard test
    suite expects (``from … import Block``, ``x = Block.load("BLOCK_NAME")``). The blocks are
    imported from the project directory, where ``prefect.yaml`` and the flows are."""
    return f'```python\nfrom blocks import {block}\n\n{variable} = {block}.load("BLOCK_NAME")\n{usage}\n```'
