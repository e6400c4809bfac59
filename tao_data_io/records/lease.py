"""One upload of a job at a time, across pods: a lease object in the bucket.

Why a lease and not a lock: an S3 object cannot be dropped by a kernel when its holder dies,
so the holder must keep proving it is alive. The lease is ``locks/<job_id>.upload`` holding
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

A killed holder blocks others for at most ``lease_seconds``.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..transfer.client import get_or_none
from ..transfer.listing import s3_time_ns
from .conditional import delete_if, put_if

#: The longest pause between two looks at a live lease while waiting for it.
MAX_POLL_SECONDS = 5.0

log = logging.getLogger(__name__)


@contextmanager
def s3_lease(client: Any, bucket: str, key: str, *, wait: bool, on_wait: Callable[[str], None] | None,
             seconds: float, job_id: str) -> Iterator[bool]:
    """Hold the lease at ``key``; yield True once held, or False at once if live and not ``wait``."""
    holder = f"{socket.gethostname()}:{secrets.token_hex(6)}"
    body = json.dumps({"holder": holder, "job_id": job_id, "lease_seconds": seconds}).encode()
    said = f"another upload of job {job_id} holds the lease s3://{bucket}/{key}; waiting for it to finish"
    etag = _take(client, bucket, key, body, wait=wait, on_wait=None if on_wait is None else lambda: on_wait(said))
    if etag is None:
        yield False
        return
    renewal = _Renewal(client, bucket, key, body, etag, interval=seconds / 3)
    renewal.start()
    try:
        yield True
    finally:
        last = renewal.stop()
        if last is not None:
            delete_if(client, bucket, key, last)


def _take(client: Any, bucket: str, key: str, body: bytes, *, wait: bool,
          on_wait: Callable[[], None] | None) -> str | None:
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
                return etag
            continue  # another pod took it over first: look again
        if not wait:
            return None
        if not told and on_wait is not None:
            on_wait()
            told = True
        time.sleep(min(remaining, pause * random.uniform(0.5, 1.0)))
        pause = min(pause * 2, MAX_POLL_SECONDS)


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


class _Renewal:
    """Rewrites the lease every ``interval`` seconds until stopped, each write conditional on the
    previous one, so a lease taken over by another pod is never overwritten."""

    def __init__(self, client: Any, bucket: str, key: str, body: bytes, etag: str, *, interval: float) -> None:
        self._client, self._bucket, self._key, self._body = client, bucket, key, body
        self._etag: str | None = etag
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease {key}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> str | None:
        """Stop renewing; the ETag of our last write, or None if the lease was lost."""
        self._stopped.set()
        self._thread.join()
        return self._etag

    def _run(self) -> None:
        while not self._stopped.wait(self._interval) and self._etag is not None:
            try:
                self._etag = put_if(self._client, self._bucket, self._key, self._body, IfMatch=self._etag)
            except Exception as exc:  # noqa: BLE001 - a daemon thread has nobody to raise to; the next tick retries
                log.warning("could not renew the upload lease s3://%s/%s (will retry): %s", self._bucket, self._key, exc)
                continue
            if self._etag is None:
                log.warning("the upload lease s3://%s/%s was taken over by another holder: this holder stalled "
                            "longer than the lease; the other upload now runs beside this one", self._bucket, self._key)
