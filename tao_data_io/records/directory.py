"""Job records as files in one directory: the default, and what a single machine needs.

* one JSON document per job (``<root>/<job_id>.json``, mode 0600, directory 0700), written
  atomically (temp file in the same directory, fsync, ``os.replace``, fsync of the directory)
  so a crash at any instant leaves either the old or the new document;
* every read-modify-write under an exclusive ``flock`` on a per-job lock file
  (``.<job_id>.lock``), so concurrent writers never lose each other's updates. The lock is
  what serialises writers, so documents carry no version. The kernel drops a lock when its
  holder dies, so a killed writer never wedges the job.

There is no index: listing by state reads every file (local reads are cheap) and the store
keeps the records in the asked state.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from ..transfer.activity import Activity
from ..fs.atomic import atomic_write
from ..fs.locks import file_lock
from ..fs.temp import lock_tag, remove_stale_temps
from ..names import is_job_id
from .storage import RECORD_SUFFIX, Document, read_capped
from .lease import directory_lease


class DirectoryStorage:
    def __init__(self, root: Path) -> None:
        self.root = root.expanduser()

    def describe(self) -> str:
        return str(self.root)

    def where(self, job_id: str) -> str:
        return str(self._path(job_id))

    def exists(self) -> bool:
        return self.root.is_dir()

    @contextmanager
    def serialised(self, job_id: str, *, create: bool = False) -> Iterator[None]:
        # A separate lock file, because a replace swaps the record's inode and a lock on the
        # old inode would protect nothing.
        if create:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with file_lock(self._lock_path(job_id)):
            yield

    def read(self, job_id: str) -> Document | None:
        try:
            with self._path(job_id).open("rb") as handle:
                return Document(read_capped(self.where(job_id), os.fstat(handle.fileno()).st_size, handle.read), None)
        except FileNotFoundError:
            return None

    def create(self, job_id: str, data: bytes) -> bool:
        if self._path(job_id).exists():
            return False
        self._write(job_id, data)
        return True

    def replace(self, job_id: str, data: bytes, version: str | None) -> bool:
        self._write(job_id, data)  # the job's lock is held: nobody wrote since our read
        return True

    def job_ids(self, state: str | None = None) -> list[str]:
        names = (path.name[: -len(RECORD_SUFFIX)] for path in self.root.glob(f"*{RECORD_SUFFIX}"))
        return sorted(name for name in names if is_job_id(name))  # anything else is not ours

    def index(self, job_id: str, state: str, *, previous: str | None) -> None:
        """No index to maintain: a listing reads every file."""

    def unindex(self, job_id: str, state: str) -> None:
        """No index to maintain: a listing reads every file."""

    def reconcile(self, states: Mapping[str, str | None]) -> None:
        """No index to maintain: a listing reads every file."""

    def upload_lock(self, job_id: str, *, wait: bool, on_wait: Callable[[str], None] | None,
                    lease_seconds: float, activity: Activity | None) -> AbstractContextManager[bool]:
        """A ``flock`` on ``.<job_id>.upload.lock``, which the kernel drops when its holder dies,
        and whose file a live holder keeps fresh while it moves (:func:`.lease.directory_lease`)."""
        return directory_lease(self.root / f".{job_id}.upload.lock", wait=wait, on_wait=on_wait, seconds=lease_seconds,
                               job_id=job_id, activity=activity)

    def _path(self, job_id: str) -> Path:
        return self.root / f"{job_id}{RECORD_SUFFIX}"

    def _lock_path(self, job_id: str) -> Path:
        return self.root / f".{job_id}.lock"

    def _write(self, job_id: str, data: bytes) -> None:
        """Replace the record's file atomically and durably. Called with the job's lock held, so
        any temp file of this job's lock still present was left by a killed writer and is removed."""
        final = self._path(job_id)
        tag = lock_tag(self._lock_path(job_id))
        remove_stale_temps(final, tag)
        atomic_write(final, data, mode=0o600, durable=True, tag=tag)
