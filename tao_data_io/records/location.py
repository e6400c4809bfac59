"""Where job records live: a directory (the default) or an ``s3://`` prefix, and who said so.

Why it matters who said so: an error about the location must name the knob to turn — the
``root`` argument (``--root`` on the command line), ``$TAO_DATA_IO_RECORDS``, the legacy
``$TAO_DATA_IO_JOBS_DIR``, or the default directory.

Precedence: the ``root`` argument; else ``TAO_DATA_IO_RECORDS``; else ``TAO_DATA_IO_JOBS_DIR``
(the name from before records could live in a bucket; it accepts an ``s3://`` prefix too);
else ``~/.tao-data-io/jobs``. Both variables set to different places is refused: records split
between two places are worse than either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..credentials import s3_credentials_from_env
from ..errors import UsageError
from ..uris import is_s3_url, parse_s3_url
from .storage import RecordStorage
from .directory import DirectoryStorage
from ..vocabulary import DEFAULT_RECORDS_ROOT, JOBS_DIR_VARIABLE, RECORDS_VARIABLE

DEFAULT_ROOT = Path(DEFAULT_RECORDS_ROOT)
ROOT_SHAPE = "a directory or s3://BUCKET/PREFIX/"


@dataclass(frozen=True)
class Location:
    storage: RecordStorage
    #: Who chose it: ``root``, a variable name, or ``the default location``.
    origin: str


def locate(root: Path | str | None, environ: Mapping[str, str] | None = None) -> Location:
    """The storage for ``root`` (a path, a path string or an ``s3://`` string) or, when None,
    for the environment; S3 credentials come from ``environ`` (default ``os.environ``) only."""
    env = os.environ if environ is None else environ
    if root is not None:
        origin, value = "root", root
    else:
        origin, value = _from_environment(env)
    if isinstance(value, str) and is_s3_url(value):
        from .s3 import S3Storage  # boto3 is imported only by those who store records in a bucket

        return Location(S3Storage(parse_s3_url(value, field=origin), s3_credentials_from_env(env)), origin)
    if str(value) == "":
        raise UsageError(f"{origin} '' is empty: give {ROOT_SHAPE}")
    return Location(DirectoryStorage(Path(value)), origin)


def _from_environment(env: Mapping[str, str]) -> tuple[str, Path | str]:
    new, legacy = env.get(RECORDS_VARIABLE), env.get(JOBS_DIR_VARIABLE)
    if new and legacy and new != legacy:
        raise UsageError(f"{RECORDS_VARIABLE} {new!r} and the legacy {JOBS_DIR_VARIABLE} {legacy!r} name different "
                         f"places for job records: unset {JOBS_DIR_VARIABLE} (or set both alike)")
    if new:
        return RECORDS_VARIABLE, new
    if legacy:
        return JOBS_DIR_VARIABLE, legacy
    return "the default location", DEFAULT_ROOT
