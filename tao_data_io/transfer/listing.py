"""What is on each side: a paginated S3 listing and a policy-aware local scan.

Remote: ListObjectsV2 through boto3's paginator (so > 1,000 keys just works). Keys ending in
``/`` are folder markers written by consoles and some tools; they hold no data and are not
files, so they are reported, never downloaded.

Local: a scan of the tree that applies the symlink policy once, for every caller:

* the walk opens each directory from its parent's descriptor with ``O_NOFOLLOW``, so a directory
  swapped for a symlink while the scan runs is never entered (and one that vanishes or cannot be
  read is reported, not fatal);
* a symlink to a regular file the walk itself found inside the root is treated as that file —
  decided by (device, inode), not by resolving names that could change meanwhile;
* a symlink that leaves the root, dangles, or points at a directory is skipped and reported
  (never followed, so a tree cannot smuggle ``/etc`` into an upload or loop forever);
* sockets, FIFOs and devices are skipped and reported (reading a FIFO would hang);
* a regular file with more hard links than the walk found inside the root is also reachable from
  outside it (a link made to someone else's file): the scan names it, and uploads skip it;
* reserved names (``.tao-data-io/``, ``.tao-data-io-partial.*``) are never part of a transfer; the
  scan lists them so uploads report them and downloads can sweep their own killed temp files.
"""

from __future__ import annotations

import os
import stat
from datetime import datetime
from email.utils import parsedate_to_datetime
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..fs import STATE_DIR_NAME, is_temp_name
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
    """The objects of ListObjectsV2 pages, all of them in memory: for a caller that needs the
    whole listing (a small prefix, a cache identity). A sync streams :func:`remote_objects`."""
    listing = RemoteListing()
    listing.objects.extend(remote_objects(pages, base, listing.folder_markers))
    return listing


def remote_objects(pages: Iterable[Mapping[str, Any]], base: str, folder_markers: list[str]) -> Iterator[RemoteObject]:
    """The objects of ListObjectsV2 pages (botocore's shape, from boto3 or :mod:`signed_list`)
    listed under the key prefix ``base``, as the pages come — one page in memory at a time, in the
    listing's order (by key). Keys ending in ``/`` are folder markers, put in ``folder_markers``."""
    for page in pages:
        for item in page.get("Contents", ()):
            key = item["Key"]
            if key.endswith("/"):
                folder_markers.append(key)
                continue
            yield RemoteObject(key, key[len(base):], int(item["Size"]), clean_etag(item.get("ETag")),
                               item.get("LastModified"))


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
    nlink: int = 1

    @property
    def identity(self) -> tuple[int, int]:
        """(device, inode): what a later open must find under the scanned name (:func:`~tao_data_io.fs.open_scanned`)."""
        return self.dev, self.ino


def local_file(relative: str, path: Path, st: os.stat_result, target_relative: str | None = None) -> LocalFile:
    return LocalFile(relative, path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, target_relative,
                     st.st_nlink)


@dataclass
class LocalScan:
    files: dict[str, LocalFile] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    #: Entries with a reserved name (our state directory, temp names), relative to the root.
    reserved: list[str] = field(default_factory=list)
    #: Relative paths of regular files with a temp name (in-flight or killed downloads).
    temp_leftovers: list[str] = field(default_factory=list)
    #: Relative paths in ``files`` whose file has hard links the scan did not find inside the root.
    linked_outside: dict[str, str] = field(default_factory=dict)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def temp_leftovers(root: Path) -> list[str]:
    """Relative paths of the temp files (in-flight or killed downloads) below ``root``: a walk
    through descriptors opened with ``O_NOFOLLOW`` that reads directory entries only — no stat of
    any file, nothing kept of them — for a download that looks each file up as it plans it."""
    found: list[str] = []
    try:
        fd = os.open(root, _DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return found
    pending = [(fd, "", 0)]
    while pending:
        dir_fd, prefix, depth = pending.pop()
        try:
            with os.scandir(dir_fd) as entries:
                for entry in entries:
                    if entry.name == STATE_DIR_NAME:
                        continue
                    if is_temp_name(entry.name):
                        if entry.is_file(follow_symlinks=False):
                            found.append(prefix + entry.name)
                    elif entry.is_dir(follow_symlinks=False) and depth + 1 < MAX_SCAN_DEPTH:
                        try:
                            child = os.open(entry.name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                        except OSError:
                            continue  # gone, replaced by a link, unreadable: nothing of ours to find there
                        pending.append((child, prefix + entry.name + "/", depth + 1))
        except OSError:
            pass
        finally:
            os.close(dir_fd)
    return found


def scan_local(root: Path, *, root_fd: int | None = None, on_directory: Callable[[], None] | None = None) -> LocalScan:
    """Scan ``root`` recursively, applying the symlink, special-file and hard-link policy.

    ``root_fd`` is the root already opened by the caller (e.g. without following any symlink on
    its way); otherwise the root is opened here, and a missing root is an empty scan.
    ``on_directory`` is told of each directory read (a scan of a million files takes a while)."""
    scan = LocalScan()
    try:
        fd = os.dup(root_fd) if root_fd is not None else os.open(root, _DIRECTORY)
    except FileNotFoundError:
        return scan
    links: list[tuple[str, os.stat_result | OSError, str]] = []
    try:
        _walk(fd, "", root, scan, links, on_directory=on_directory)
    finally:
        os.close(fd)
    found: dict[tuple[int, int], list[str]] = {}
    for local in scan.files.values():
        found.setdefault((local.dev, local.ino), []).append(local.relative)
    for names in found.values():
        nlink = scan.files[names[0]].nlink
        if nlink > len(names):
            for name in names:
                scan.linked_outside[name] = (f"a hard link to a file with {nlink} links, only {len(names)} of them in "
                                             "this tree: it is also reachable from outside it")
    for relative, target, link in links:
        _add_symlink(scan, relative, target, link, found)
    return scan


#: The deepest a scanned tree is walked: each level holds one descriptor and one frame, so a
#: tree a job nests 1,100 levels deep would end the scan (RecursionError, EMFILE) — and with it
#: every upload of its results. Deeper directories are left out, each named with the reason.
MAX_SCAN_DEPTH = 128


def _walk(dir_fd: int, prefix: str, root: Path, scan: LocalScan,
          links: list[tuple[str, os.stat_result | OSError, str]], depth: int = 0,
          on_directory: Callable[[], None] | None = None) -> None:
    """Record every entry below the directory ``dir_fd``; real directories are descended through
    descriptors opened with ``O_NOFOLLOW``, symlinks are collected for :func:`_add_symlink`."""
    with os.scandir(dir_fd) as entries:
        children = sorted(entries, key=lambda e: e.name)
    if on_directory is not None:
        on_directory()
    for entry in children:
        relative = prefix + entry.name
        if entry.name == STATE_DIR_NAME or is_temp_name(entry.name):
            scan.reserved.append(relative)
            if is_temp_name(entry.name) and entry.is_file(follow_symlinks=False):
                scan.temp_leftovers.append(relative)
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while we looked
        if stat.S_ISDIR(st.st_mode):
            if depth + 1 >= MAX_SCAN_DEPTH:
                scan.skipped.append(Skipped(relative, f"directory more than {MAX_SCAN_DEPTH} levels deep; left out"))
                continue
            try:
                child = os.open(entry.name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                scan.skipped.append(Skipped(relative, f"directory cannot be read ({exc.strerror}); left out"))
                continue
            try:
                _walk(child, relative + "/", root, scan, links, depth + 1, on_directory)
            except OSError as exc:
                scan.skipped.append(Skipped(relative, f"directory cannot be read ({exc.strerror}); left out"))
            finally:
                os.close(child)
        elif stat.S_ISREG(st.st_mode):
            scan.files[relative] = local_file(relative, root / relative, st)
        elif stat.S_ISLNK(st.st_mode):
            try:
                link = os.readlink(entry.name, dir_fd=dir_fd)
            except OSError:
                continue  # replaced while we looked
            try:
                target: os.stat_result | OSError = os.stat(entry.name, dir_fd=dir_fd)
            except OSError as exc:
                target = exc
            links.append((relative, target, link))
        else:
            scan.skipped.append(Skipped(relative, "special file (socket, FIFO or device); refused"))


def _add_symlink(scan: LocalScan, relative: str, target: os.stat_result | OSError, link: str,
                 found: Mapping[tuple[int, int], list[str]]) -> None:
    """Admit a symlink as the file it points at only when the walk found that very file (same
    device and inode) inside the root; anything else is reported and never followed."""
    if isinstance(target, FileNotFoundError):
        scan.skipped.append(Skipped(relative, "symlink is dangling; not followed"))
    elif isinstance(target, OSError):
        scan.skipped.append(Skipped(relative, f"symlink cannot be followed ({target.strerror}); not followed"))
    elif not stat.S_ISREG(target.st_mode):
        scan.skipped.append(Skipped(relative, "symlink to a directory or special file; not followed"))
    elif (names := found.get((target.st_dev, target.st_ino))) is None:
        scan.skipped.append(Skipped(relative, f"symlink points outside the tree ({link}); not followed"))
    else:
        scan.files[relative] = local_file(relative, scan.files[names[0]].path, target, names[0])
        if names[0] in scan.linked_outside:
            scan.linked_outside[relative] = scan.linked_outside[names[0]]
