"""A job's run directory on this host, for backends that keep each job's state here (the local
frame's supervisor records, the Docker backend's decisions and saved logs): owner-only, each
record a JSON file written whole, and earlier attempts put away beside the current one.

Why shared: what the directory must guarantee — no reader ever sees half a record, no other user
reads a log of the job's output, an attempt's files never mix with the next one's — is the same
whichever backend writes the records in it; what records it holds is each backend's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from ..errors import UsageError
from ..fs.atomic import atomic_write
from ..vocabulary import TERMINAL_STATES

Model = TypeVar("Model", bound=BaseModel)
ATTEMPTS = "attempts"


class RunFiles:
    """``<run root>/<job id>/run``: its lock, its launch record, and the records a backend adds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = path / ".lock"
        self.launch_file = path / "launch.json"

    def create(self) -> None:
        """Owner-only: the logs hold whatever the job prints."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)

    def write(self, path: Path, record: BaseModel) -> None:
        """Whole or not at all; not ``durable`` (no directory fsync): the processes a record
        describes do not survive a power loss either."""
        atomic_write(path, record.model_dump_json(indent=2).encode() + b"\n", mode=0o600)

    def put_away(self, attempt: int, state: str, ref: str) -> None:
        """Move attempt ``attempt``'s files into ``attempts/<n>/`` for the next attempt to start
        clean (its results directory, elsewhere, stays: the next attempt continues in it). Only
        once it has ended (``state``): two attempts of one job never run at once."""
        if state not in TERMINAL_STATES:
            raise UsageError(f"attempt {attempt} of {ref} is still {state}; cancel it before launching the next "
                             "attempt")
        kept = self.path / ATTEMPTS / str(attempt)
        kept.mkdir(parents=True, exist_ok=True)
        for entry in self.path.iterdir():
            if entry.name not in (self.lock.name, ATTEMPTS):
                entry.rename(kept / entry.name)


def read_record(path: Path, model: type[Model]) -> Model | None:
    """The record at ``path``, or None when there is none yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return model.model_validate_json(data)
