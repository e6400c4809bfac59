"""The remote side of a transfer: a paginated S3 listing, streamed.

Memory does not grow with the object count: :func:`remote_objects` yields a listing's objects
page by page (:func:`read_ahead` fetches the pages in a thread, a few ahead). Keys ending in
``/`` are folder markers written by consoles and some tools; they hold no data and are not
files, so they are reported, never downloaded. The local side is :mod:`.local_walk`.
"""

from __future__ import annotations

import threading
from queue import Full, Queue
from datetime import datetime
from email.utils import parsedate_to_datetime
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..uris import S3Url

T = TypeVar("T")


@dataclass(frozen=True)
class RemoteObject:
    key: str
    #: The key relative to the listed prefix (the local relative path it maps to).
    relative: str
    size: int
    #: The ETag without its quotes.
    etag: str
    #: LastModified as the server sent it (ISO 8601 in listings, RFC 1123 in HEAD), unparsed.
    last_modified: str | None = None


def clean_etag(etag: str | None) -> str:
    return (etag or "").strip('"')


def s3_time_ns(raw: object) -> int | None:
    """Nanoseconds since the epoch for an S3 timestamp in either wire format, else None."""
    if isinstance(raw, datetime):
        return int(raw.timestamp() * 1e9)
    if not isinstance(raw, str) or not raw:
        return None
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00")) if raw[:1].isdigit() else parsedate_to_datetime(raw)
    except (ValueError, TypeError):
        return None
    return int(parsed.timestamp() * 1e9)


@dataclass
class RemoteListing:
    objects: list[RemoteObject] = field(default_factory=list)
    folder_markers: list[str] = field(default_factory=list)


def read_ahead(items: Iterable[T], depth: int = 4) -> Iterator[T]:
    """``items`` produced by a thread of their own, at most ``depth`` ahead of the consumer: the
    listing's round trips overlap the planning and the transfers of the pages before (s5cmd lists
    while it copies), and memory holds ``depth`` pages. An error of the producer is raised here,
    in its place; a consumer that stops early stops the producer at its next item."""
    queue: Queue[tuple[str, Any]] = Queue(maxsize=depth)
    stop = threading.Event()

    def put(kind: str, value: Any) -> bool:
        while not stop.is_set():
            try:
                queue.put((kind, value), timeout=0.1)
                return True
            except Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put("item", item):
                    return
            put("end", None)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put("error", exc)

    producer = threading.Thread(target=produce, name="listing", daemon=True)
    producer.start()
    try:
        while True:
            kind, value = queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()


def list_remote(client: Any, prefix: S3Url) -> RemoteListing:
    """Every object under ``prefix`` (which must be in folder form), paginated through boto3."""
    paginator = client.get_paginator("list_objects_v2")
    return listing_from_pages(paginator.paginate(Bucket=prefix.bucket, Prefix=prefix.key), prefix.key)


def listing_from_pages(pages: Iterable[Mapping[str, Any]], base: str) -> RemoteListing:
    """The objects of ListObjectsV2 pages, all of them in memory: for a caller that needs the
    whole listing (a small prefix, a cache identity). A sync streams :func:`remote_objects`."""
    listing = RemoteListing()
    listing.objects.extend(remote_objects(pages, base, listing.folder_markers.append))
    return listing


def remote_objects(pages: Iterable[Mapping[str, Any]], base: str,
                   on_folder_marker: Callable[[str], None] | None = None) -> Iterator[RemoteObject]:
    """The objects of ListObjectsV2 pages (botocore's shape, from boto3 or :mod:`signed_list`)
    listed under the key prefix ``base``, as the pages come — one page in memory at a time, in the
    listing's order (by key). Keys ending in ``/`` are folder markers, told to ``on_folder_marker``."""
    for page in pages:
        for item in page.get("Contents", ()):
            key = item["Key"]
            if key.endswith("/"):
                if on_folder_marker is not None:
                    on_folder_marker(key)
                continue
            yield RemoteObject(key, key[len(base):], int(item["Size"]), clean_etag(item.get("ETag")),
                               item.get("LastModified"))
