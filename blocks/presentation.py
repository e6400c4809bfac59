"""How every block presents itself in Prefect's UI and CLI: the logo, the documentation link and
the code example, declared once.

The logo and the documentation are the project's own ``Logo`` and ``Documentation`` URLs from its
metadata (``pyproject.toml``), so each is declared in one place. Prefect takes only an http(s)
URL of at most 2,083 characters for a logo (no ``data:`` URL), so the logo is the raw URL of
:data:`LOGO_FILE` in the repository; a UI that cannot reach it shows the block without it.
"""

from __future__ import annotations

from importlib.metadata import metadata
from pathlib import Path

#: The logo the ``Logo`` URL serves, kept in this tree (what the standard test suite checks).
LOGO_FILE = Path(__file__).with_name("logo.png")


def _project_urls() -> dict[str, str]:
    return dict(entry.split(", ", 1) for entry in metadata("tao-data-io").get_all("Project-URL") or ())


LOGO_URL = _project_urls()["Logo"]
DOCUMENTATION_URL = _project_urls()["Documentation"]


def code_example(block: str, variable: str, usage: str) -> str:
    """A block's code example: import it, load a saved one, use it — as Prefect's standard test
    suite expects (``from … import Block``, ``x = Block.load("BLOCK_NAME")``). The blocks are
    imported from the project directory, where ``prefect.yaml`` and the flows are."""
    return f'```python\nfrom blocks import {block}\n\n{variable} = {block}.load("BLOCK_NAME")\n{usage}\n```'
