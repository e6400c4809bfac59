"""The words and defaults that ``--help`` shows, in a module that imports nothing heavy.

Why a module of its own: argparse registration runs for every command, so whatever a verb's
flags and help text name — job states, storage tiers, formats, defaults — must be importable
without the modules that use it, which pull in pydantic (the record), botocore or pandas. Those
modules import these names from here, so each value is written once.
"""

from __future__ import annotations

from typing import Literal, get_args

from .errors import UsageError

# ----------------------------------------------------------------- the job record
State = Literal["PENDING", "RUNNING", "COMPLETE", "ERROR", "CANCELED"]
STATES: tuple[str, ...] = get_args(State)
#: A job in one of these states is finished; a report of any other state is refused.
TERMINAL_STATES = frozenset({"COMPLETE", "ERROR", "CANCELED"})
StorageTier = Literal["A", "B", "C"]
STORAGE_TIERS: tuple[str, ...] = get_args(StorageTier)
#: Where job records live: this variable (a directory or ``s3://bucket/prefix/``), the legacy
#: directory variable, or the default directory.
RECORDS_VARIABLE = "TAO_DATA_IO_RECORDS"
JOBS_DIR_VARIABLE = "TAO_DATA_IO_JOBS_DIR"
DEFAULT_RECORDS_ROOT = "~/.tao-data-io/jobs"

# ----------------------------------------------------------------- results
#: TAO's own state directory inside a results directory; never uploaded.
ALWAYS_EXCLUDED = ".tao/*"
#: How long a file must be left alone before a run that overlaps the job uploads it.
DEFAULT_SETTLE_SECONDS = 30.0
SETTLE_SECONDS_BOUNDS = (0.0, 86400.0)

# ----------------------------------------------------------------- transfers and staging
#: The staging map's file name under a staging root.
STAGING_MAP_NAME = "staging-map.json"
#: Objects in flight at once in one engine.
DEFAULT_CONCURRENCY = 128
#: What ``extract`` reads.
ARCHIVE_FORMATS = "tar, tar.gz/tgz, tar.bz2, tar.xz and zip"
#: What ``selective-download`` reads references from.
ANNOTATION_FORMATS = ("parquet", "jsonl", "json", "csv")
#: What ``selective-download`` does about a referenced object that does not exist.
MISSING_MODES = ("error", "skip")

# ----------------------------------------------------------------- the Prefect layer
#: Where the blocks' logo is, for a UI whose browsers cannot load the project's own ``Logo`` URL
#: (``blocks/presentation.py``). Here, below Prefect, so the demo names it before importing Prefect
#: (whose settings are read from the environment when it is first imported).
LOGO_URL_VARIABLE = "TAO_DATA_IO_LOGO_URL"

# ----------------------------------------------------------------- jobs on a backend
#: Where the CLI keeps per-job working directories (staging root, the local frame's run and
#: results directories) unless told otherwise.
WORKDIR_VARIABLE = "TAO_DATA_IO_WORKDIR"
DEFAULT_WORKDIR = "~/.tao-data-io/work"
#: The longest pause between two looks at a job while collect waits for its end: TAO jobs train
#: for hours and may sit PENDING for long (a GPU to free up, an image to pull), so a few calls a
#: minute is plenty. The pauses start at :data:`FIRST_POLL_SECONDS` and double up to it, so a job
#: that ends in seconds (a local one, a failed start) is seen in seconds.
DEFAULT_POLL_SECONDS = 30.0
FIRST_POLL_SECONDS = 1.0
#: Faster polling only loads the backend and the record store; slower leaves a job's end unseen.
POLL_SECONDS_BOUNDS = (0.01, 3600.0)


def seconds_within(value: float, bounds: tuple[float, float], *, name: str) -> float:
    """``value`` when it is a number of seconds within ``bounds`` (NaN is not); otherwise a
    :class:`UsageError` naming ``name``, the value and the bounds. Checked where the number is used,
    so every caller (a flag, a flow parameter) gets the same rule."""
    low, high = bounds
    if isinstance(value, bool) or not (isinstance(value, int | float) and low <= value <= high):
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10**18 else "a huge integer"
        raise UsageError(f"{name} {shown} must be a number of seconds from {low:g} to {high:g}")
    return float(value)
