"""One upload of a job at a time: a lease object beside S3 records, a ``flock``ed file beside
directory records — each renewed only while the upload moves.

Why renewed only while it moves: a holder stuck in a read that never returns (a hung NFS
server, a FIFO swapped in for a file) or a send that never ends is alive, so a kernel lock or
a timer-renewed lease would be held forever, and every later upload (and ``collect --wait``)
would wait behind it. The upload's :class:`~tao_data_io.transfer.activity.Activity` beats as its
bytes move; a holder idle for ``lease_seconds`` stops renewing, and the next upload breaks the
lapsed lock, saying so (``on_wait``, and the log).

On S3 an object cannot be dropped by a kernel when its holder dies, so the holder must keep
proving it is alive. The lease is ``locks/<job_id>.upload`` holding
``{"holder": ..., "lease_seconds": N}``:

* **taken** with ``If-None-Match: *`` — of two pods, exactly one creates it;
* **alive** while the server's clock is before its ``Last-Modified`` plus ``lease_seconds``.
  Both instants come from the server (``Last-Modified`` and the ``Date`` of the answer), so
  clocks that differ between pods cannot make a live lease look expired;
* **renewed** by a daemon thread every ``lease_seconds / 3`` with ``If-Match`` on the ETag of
  the holder's last write, so a holder that lost it (stalled longer than the lease) learns so
  and never overwrites the new holder's lease;
* **taken over** once expired, with ``If-Match`` on the expired lease's ETag — of two pods
  seeing it expire, one wins;
* **released** with a ``DELETE`` conditional on the holder's ETag, so a late release never
  removes somebody else's lease.

A killed or stuck holder blocks others for at most ``lease_seconds``.

Beside directory records (:func:`directory_lease`) the lock is a ``flock`` on a file, which the
kernel drops when its holder dies; a live holder touches the file (its mtime) every
``lease_seconds / 3`` while its upload moves. A waiter finding the ``flock`` held by a file
untouched for ``lease_seconds`` unlinks it (under a second lock, after looking again) and locks
a new one; a holder checks, once its ``flock`` is granted, that the file it holds is still the
one under the name — so the stuck holder keeps a lock on a file nobody else can find.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..transfer.activity import Activity
from ..transfer.client import get_or_none
from ..transfer.listing import s3_time_ns
from .conditional import delete_if, put_if

#: The longest pause between two looks at a live lease while waiting for it.
MAX_POLL_SECONDS = 5.0

log = logging.getLogger(__name__)


@contextmanager
def s3_lease(client: Any, bucket: str, key: str, *, wait: bool, on_wait: Callable[[str], None] | None,
             seconds: float, job_id: str, activity: Activity | None = None) -> Iterator[bool]:
    """Hold the lease at ``key``; yield True once held, or False at once if live and not ``wait``."""
    holder = f"{socket.gethostname()}:{secrets.token_hex(6)}"
    body = json.dumps({"holder": holder, "job_id": job_id, "lease_seconds": seconds}).encode()
    said = f"another upload of job {job_id} holds the lease s3://{bucket}/{key}; waiting for it to finish"
    etag = _take(client, bucket, key, body, wait=wait, on_wait=None if on_wait is None else lambda: on_wait(said),
                 on_break=lambda lapsed: _broken(on_wait, job_id, f"the lease s3://{bucket}/{key}", *lapsed))
    if etag is None:
        yield False
        return
    if activity is not None:
        activity.beat()  # the lease starts now, not when this upload began to wait for it
    renewal = _Rewrite(client, bucket, key, body, etag)
    renewer = _Renewer(renewal, interval=seconds / 3, moving=_Moving(activity, seconds, f"s3://{bucket}/{key}"))
    renewer.start()
    try:
        yield True
    finally:
        renewer.stop()
        last = renewal.etag
        if last is not None:
            delete_if(client, bucket, key, last)


def _broken(on_wait: Callable[[str], None] | None, job_id: str, what: str, holder: str, seconds: float) -> None:
    """Say that a lapsed upload lock was broken: whoever waits for it, and the log."""
    said = (f"the upload lock of job {job_id} ({what}, held by {holder}) lapsed: its holder died or made no "
            f"progress for {seconds:g}s; this upload breaks it and takes over")
    log.warning("%s", said)
    if on_wait is not None:
        on_wait(said)


def _take(client: Any, bucket: str, key: str, body: bytes, *, wait: bool,
          on_wait: Callable[[], None] | None, on_break: Callable[[tuple[str, float]], None]) -> str | None:
    """The ETag of our new lease, or None when a live one exists and we may not wait."""
    pause = 0.1
    told = False
    while True:
        etag = put_if(client, bucket, key, body, IfNoneMatch="*")
        if etag is not None:
            return etag
        answer = get_or_none(client, bucket, key)
        if answer is None:
            continue  # released between our two calls: try to create it again
        current = answer["Body"].read()
        remaining = _remaining_seconds(answer, current)
        if remaining <= 0:
            etag = put_if(client, bucket, key, body, IfMatch=answer["ETag"])
            if etag is not None:
                on_break(_lease_in(current))
                return etag
            continue  # another pod took it over first: look again
        if not wait:
            return None
        if not told and on_wait is not None:
            on_wait()
            told = True
        time.sleep(min(remaining, pause * random.uniform(0.5, 1.0)))
        pause = min(pause * 2, MAX_POLL_SECONDS)


def _lease_in(body: bytes) -> tuple[str, float]:
    """(holder, lease_seconds) of a lease's body; an unreadable one counts as lapsed at once."""
    try:
        lease = json.loads(body)
        return str(lease["holder"]), float(lease["lease_seconds"])
    except (ValueError, KeyError, TypeError):
        return "an unreadable holder", 0.0


def _remaining_seconds(answer: dict[str, Any], body: bytes) -> float:
    """How long the lease in ``answer`` stays alive, by the server's clock; a lease that does not
    parse counts as expired (nobody can be renewing what nobody can read)."""
    written = s3_time_ns(answer.get("LastModified"))
    now = s3_time_ns(answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date"))
    try:
        seconds = float(json.loads(body)["lease_seconds"])
    except (ValueError, KeyError, TypeError):
        return 0.0
    if written is None or now is None:
        return seconds  # no clock to judge by: assume it was just written
    return written / 1e9 + seconds - now / 1e9


class _Rewrite:
    """One renewal of an S3 lease: rewrite it, conditional on our previous write, so a lease
    taken over by another pod is never overwritten. ``etag``: our last write's, None once lost."""

    def __init__(self, client: Any, bucket: str, key: str, body: bytes, etag: str) -> None:
        self._client, self._bucket, self._key, self._body = client, bucket, key, body
        self.etag: str | None = etag

    def __call__(self) -> bool:
        if self.etag is None:  # lost at an earlier renewal (which said so): nothing of ours to rewrite
            return False
        self.etag = put_if(self._client, self._bucket, self._key, self._body, IfMatch=self.etag)
        if self.etag is None:
            log.warning("the upload lease s3://%s/%s was taken over by another holder: this holder stalled "
                        "longer than the lease; the other upload now runs beside this one", self._bucket, self._key)
        return self.etag is not None


class _Renewer:
    """Renews a held lock every ``interval`` seconds while its upload moves, in a daemon thread,
    until stopped or ``renew`` says the lock is lost (False); a renewal that fails is retried at
    the next tick — a daemon thread has nobody to raise to."""

    def __init__(self, renew: Callable[[], bool], *, interval: float, moving: _Moving) -> None:
        self._renew, self._interval, self._moving = renew, interval, moving
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="upload lock", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            if not self._moving():
                continue
            try:
                if not self._renew():
                    return
            except Exception as exc:  # noqa: BLE001 - see the class's docstring
                log.warning("could not renew the upload lock %s (will retry): %s", self._moving.what, exc)


class _Moving:
    """Whether a holder's upload moved within its lease (always, without an :class:`Activity`);
    the first time it did not, that is logged: the lock will lapse and may be broken."""

    def __init__(self, activity: Activity | None, seconds: float, what: str) -> None:
        self._activity, self._seconds, self.what = activity, seconds, what
        self._said = False

    def __call__(self) -> bool:
        if self._activity is None:
            return True
        idle = self._activity.idle_seconds()
        if idle < self._seconds:
            self._said = False
            return True
        if not self._said:
            log.warning("the upload holding %s made no progress for %.0fs: its lock is no longer renewed, and the "
                        "next upload may break it", self.what, idle)
            self._said = True
        return False


@contextmanager
def directory_lease(path: Path, *, wait: bool, on_wait: Callable[[str], None] | None, seconds: float, job_id: str,
                    activity: Activity | None = None) -> Iterator[bool]:
    """Hold the ``flock`` on ``path`` (see the module's docstring); yield True once held, or
    False at once if a live holder has it and not ``wait``."""
    said = f"another upload of job {job_id} holds {path}; waiting for it to finish"
    told = False
    pause = 0.1
    path.parent.mkdir(parents=True, exist_ok=True)
    lease = json.dumps({"holder": f"{socket.gethostname()}:{os.getpid()}", "job_id": job_id,
                        "lease_seconds": seconds}).encode()
    while True:
        fd = _take_file(path, lease, lambda lapsed: _broken(on_wait, job_id, str(path), *lapsed))
        if fd is not None:
            break
        if not wait:
            yield False
            return
        if not told and on_wait is not None:
            on_wait(said)
            told = True
        time.sleep(pause * random.uniform(0.5, 1.0))
        pause = min(pause * 2, MAX_POLL_SECONDS)
    try:
        if activity is not None:
            activity.beat()  # the lease starts now, not when this upload began to wait for it
        renewer = _Renewer(lambda: _touched(fd), interval=seconds / 3, moving=_Moving(activity, seconds, str(path)))
        renewer.start()
        try:
            yield True
        finally:
            renewer.stop()
            os.ftruncate(fd, 0)  # released: no lease left behind for a waiter to judge a next holder by
    finally:
        os.close(fd)


def _take_file(path: Path, lease: bytes, on_break: Callable[[tuple[str, float]], None]) -> int | None:
    """The descriptor of the lock file ``path``, ``flock``ed, with our ``lease`` in it; None while
    a live holder has it. A lapsed holder's file is unlinked first (:func:`_unlink_if_lapsed`).
    The file must still be the one under the name *after* our lease is in it: a waiter that judged
    the file by the lease before ours may have unlinked it meanwhile, and then we look again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held, theirs = os.fstat(fd), _lease_of(fd)
                if theirs is not None and time.time() - held.st_mtime >= theirs[1] and _unlink_if_lapsed(
                        path, held, theirs[1]):
                    on_break(theirs)
                    continue
                return None
            os.ftruncate(fd, 0)
            os.pwrite(fd, lease, 0)  # our lease, for a waiter to judge by: it starts now (the mtime)
            if _is_under(fd, path):
                taken, fd = fd, -1
                return taken
        finally:
            if fd >= 0:
                os.close(fd)


def _lease_of(fd: int) -> tuple[str, float] | None:
    """(holder, lease_seconds) written in the lock file open at ``fd``; None when it holds none
    that reads whole — a holder of a version before leases, or one writing its lease this very
    moment — which is never broken: its ``flock`` goes when it dies."""
    holder, seconds = _lease_in(os.pread(fd, 4096, 0))
    return (holder, seconds) if seconds > 0 else None


def _is_under(fd: int, path: Path) -> bool:
    """Whether the file open at ``fd`` is still the one named ``path``."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _unlink_if_lapsed(path: Path, seen: os.stat_result, seconds: float) -> bool:
    """Unlink the lock file ``path`` if it is still the lapsed one seen (same inode, untouched for
    ``seconds``), under a second lock, so two waiters never both break — the second would unlink
    the first one's new file. True if it was broken here."""
    guard = os.open(path.with_name(path.name + ".break"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino) or time.time() - now.st_mtime < seconds:
            return False
        os.unlink(path)
        return True
    finally:
        os.close(guard)


def _touched(fd: int) -> bool:
    """Renew a directory lease: its file's mtime is when its holder last moved."""
    os.utime(fd)
    return True
