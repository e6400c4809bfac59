"""What is on each side: a paginated S3 listing and a policy-aware local scan.

Remote: ListObjectsV2 through boto3's paginator (so > 1,000 keys just works). Keys ending in
``/`` are folder markers written by consoles and some tools; they hold no data and are not
files, so they are reported, never downloaded.

Local: a scan of the tree that applies the symlink policy once, for every caller:

* a symlink to a regular file whose real path is inside the root is treated as that file;
* a symlink that leaves the root, dangles, or points at a directory is skipped and reported
  (never followed, so a tree cannot smuggle ``/etc`` into an upload or loop forever);
* sockets, FIFOs and devices are skipped and reported (reading a FIFO would hang);
* ``.tao-data-io/`` directories (our state) is never part of a transfer, and in-flight temp
  files left by an interrupted download are collected so the caller can remove them.
"""

from __future__ import annotations

import os
import stat
from datetime import datetime
from email.utils import parsedate_to_datetime
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..fs import STATE_DIR_NAME, is_temp_name, is_within
from .summary import Skipped
from ..uris import S3Url


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


def list_remote(client: Any, prefix: S3Url) -> RemoteListing:
    """Every object under ``prefix`` (which must be in folder form), paginated through boto3."""
    paginator = client.get_paginator("list_objects_v2")
    return listing_from_pages(paginator.paginate(Bucket=prefix.bucket, Prefix=prefix.key), prefix.key)


def listing_from_pages(pages: Iterable[Mapping[str, Any]], base: str) -> RemoteListing:
    """The objects of ListObjectsV2 pages (botocore's shape, from boto3 or :mod:`signed_list`)
    listed under the key prefix ``base``; keys ending in ``/`` are folder markers."""
    listing = RemoteListing()
    for page in pages:
        for item in page.get("Contents", ()):
            key = item["Key"]
            if key.endswith("/"):
                listing.folder_markers.append(key)
                continue
            listing.objects.append(RemoteObject(key, key[len(base):], int(item["Size"]), clean_etag(item.get("ETag")),
                                                item.get("LastModified")))
    return listing


@dataclass(frozen=True)
class LocalFile:
    relative: str
    #: The regular file itself: for a symlink inside the tree, its resolved target.
    path: Path
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int = 0
    #: For a symlink, its target relative to the root (filters must admit both names).
    target_relative: str | None = None


def local_file(relative: str, path: Path, st: os.stat_result, target_relative: str | None = None) -> LocalFile:
    return LocalFile(relative, path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, target_relative)


@dataclass
class LocalScan:
    files: dict[str, LocalFile] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    temp_leftovers: list[Path] = field(default_factory=list)


def scan_local(root: Path) -> LocalScan:
    """Scan ``root`` recursively, applying the symlink and special-file policy."""
    scan = LocalScan()
    if not root.exists():
        return scan
    real_root = os.path.realpath(root)
    for relative, path, entry in _walk(root, ""):
        if is_temp_name(entry.name):
            scan.temp_leftovers.append(path)
            continue
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            scan.files[relative] = local_file(relative, path, st)
        elif stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(path)
            inside = target != real_root and is_within(target, real_root, resolve=False)
            try:
                target_st = os.stat(path)
            except OSError:
                scan.skipped.append(Skipped(relative, "symlink is dangling; not followed"))
                continue
            if not inside:
                scan.skipped.append(Skipped(relative, f"symlink points outside the tree ({target}); not followed"))
            elif not stat.S_ISREG(target_st.st_mode):
                scan.skipped.append(Skipped(relative, "symlink to a directory or special file; not followed"))
            else:
                target_relative = os.path.relpath(target, real_root).replace(os.sep, "/")
                scan.files[relative] = local_file(relative, Path(target), target_st, target_relative)
        else:
            scan.skipped.append(Skipped(relative, "special file (socket, FIFO or device); refused"))
    return scan


def _walk(directory: Path, prefix: str) -> Iterator[tuple[str, Path, os.DirEntry[str]]]:
    """Yield (relative, path, entry) for every non-directory below ``directory``; real
    directories are descended, symlinked directories are yielded (and then refused)."""
    with os.scandir(directory) as entries:
        children = sorted(entries, key=lambda e: e.name)
    for entry in children:
        relative = prefix + entry.name
        if entry.is_dir(follow_symlinks=False):
            if entry.name == STATE_DIR_NAME or is_temp_name(entry.name):
                continue  # our state, or another operation's in-flight directory (archive extraction)
            yield from _walk(Path(entry.path), relative + "/")
        else:
            yield relative, Path(entry.path), entry
