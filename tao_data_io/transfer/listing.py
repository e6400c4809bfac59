"""What is on each side: a paginated S3 listing and a policy-aware local scan.

Both sides stream, so memory does not grow with the object count: :func:`remote_objects` yields
a listing's objects page by page (:func:`read_ahead` fetches the pages in a thread, a few ahead),
and :func:`walk_local` yields a tree's files in key order, one directory in memory at a time.
Keys ending in ``/`` are folder markers written by consoles and some tools; they hold no data
and are not files, so they are reported, never downloaded.

Local: a walk of the tree that applies the symlink policy once, for every caller
(:func:`scan_local` is the same walk, collected):

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
  walk lists them so uploads report them, and :func:`temp_leftovers` finds a download's killed
  temp files.
"""

from __future__ import annotations

import os
import stat
import threading
from queue import Full, Queue
from datetime import datetime
from email.utils import parsedate_to_datetime
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..fs import STATE_DIR_NAME, is_temp_name
from .summary import Skipped
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
    #: Relative paths in ``files`` whose file has hard links the scan did not find inside the root.
    linked_outside: dict[str, str] = field(default_factory=dict)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def temp_leftovers(root: Path) -> list[str]:
    """Relative paths of the temp files (in-flight or killed downloads) below ``root``: a walk
    through descriptors opened with ``O_NOFOLLOW`` that reads directory entries only — no stat of
    any file, nothing kept of them — for a download that looks each file up as it plans it. One
    descriptor per level is open at a time (a directory's subdirectories are opened one by one)."""
    found: list[str] = []
    try:
        fd = os.open(root, _DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return found
    try:
        _temps_below(fd, "", 0, found)
    finally:
        os.close(fd)
    return found


def _temps_below(dir_fd: int, prefix: str, depth: int, found: list[str]) -> None:
    subdirectories = []
    try:
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if entry.name == STATE_DIR_NAME:
                    continue
                if is_temp_name(entry.name):
                    if entry.is_file(follow_symlinks=False):
                        found.append(prefix + entry.name)
                elif entry.is_dir(follow_symlinks=False) and depth + 1 < MAX_SCAN_DEPTH:
                    subdirectories.append(entry.name)
    except OSError:
        return  # unreadable: nothing of ours can be in it
    for name in subdirectories:
        try:
            child = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            continue  # gone, replaced by a link, unreadable: nothing of ours to find there
        try:
            _temps_below(child, prefix + name + "/", depth + 1, found)
        finally:
            os.close(child)


def scan_local(root: Path, *, root_fd: int | None = None, on_directory: Callable[[], None] | None = None) -> LocalScan:
    """Scan ``root`` recursively, applying the symlink, special-file and hard-link policy, and
    keep every file in memory: :func:`walk_local` collected, for a caller that needs the whole
    tree at once (an upload streams the walk instead).

    ``root_fd`` is the root already opened by the caller (e.g. without following any symlink on
    its way); otherwise the root is opened here, and a missing root is an empty scan.
    ``on_directory`` is told of each directory read (a scan of a million files takes a while)."""
    try:
        fd = os.dup(root_fd) if root_fd is not None else os.open(root, _DIRECTORY)
    except FileNotFoundError:
        return LocalScan()
    walk = LocalWalk()
    try:
        files = {item.relative: item for item in walk_local(fd, root, walk, on_directory=on_directory)
                 if isinstance(item, LocalFile)}
    finally:
        os.close(fd)
    scan = walk.held_back(root)
    scan.files = {**files, **scan.files}
    scan.skipped, scan.reserved = walk.skipped + scan.skipped, walk.reserved
    return scan


#: The deepest a scanned tree is walked: each level holds one descriptor and one frame, so a
#: tree a job nests 1,100 levels deep would end the scan (RecursionError, EMFILE) — and with it
#: every upload of its results. Deeper directories are left out, each named with the reason.
MAX_SCAN_DEPTH = 128


@dataclass
class LocalWalk:
    """What a streamed scan (:func:`walk_local`) reports besides the files it yields: the same
    policy as :func:`scan_local`, with the few entries that need the whole tree to decide (a
    symlink, a file with more than one link) kept back until the walk has seen it all."""

    skipped: list[Skipped] = field(default_factory=list)
    reserved: list[str] = field(default_factory=list)
    #: Symlinks: (relative, its target's stat or why it has none, the link's text).
    links: list[tuple[str, os.stat_result | OSError, str]] = field(default_factory=list)
    #: Regular files with more than one link: (device, inode) → (their names here, the file).
    linked: dict[tuple[int, int], list[LocalFile]] = field(default_factory=dict)

    def held_back(self, root: Path) -> LocalScan:
        """The files held back, decided now that the walk is over: a file with more links than
        the walk found names for is also reachable from outside the tree; a symlink is the file
        it points at only when the walk found that very file (device and inode) inside the root
        — looked for by its name first, and by a second walk for just those inodes otherwise."""
        scan = LocalScan()
        found: dict[tuple[int, int], list[str]] = {}
        for identity, files in self.linked.items():
            names = [local.relative for local in files]
            found[identity] = names
            for local in files:
                scan.files[local.relative] = local
            nlink = files[0].nlink
            if nlink > len(names):
                for name in names:
                    scan.linked_outside[name] = (f"a hard link to a file with {nlink} links, only {len(names)} of "
                                                 "them in this tree: it is also reachable from outside it")
        wanted = {(target.st_dev, target.st_ino) for _, target, _ in self.links
                  if not isinstance(target, OSError) and stat.S_ISREG(target.st_mode)} - found.keys()
        if wanted:
            found.update(_find_inodes(root, wanted))
        for relative, target, link in self.links:
            _add_symlink(scan, relative, target, link, found, root)
        return scan


def walk_local(root_fd: int, root: Path, walk: LocalWalk, *,
               on_directory: Callable[[], None] | None = None) -> Iterator[LocalFile | str]:
    """The regular files below the open directory ``root_fd``, in the order S3 lists their keys
    (each directory's entries by name, a directory as its name and ``/``), one directory's names
    in memory at a time; a file :class:`LocalWalk` holds back (a symlink, a file with several
    links) is yielded as its relative name only, in its place, so the caller can look its object
    up with the rest of its chunk and keep it for when the file is decided."""
    stack: list[tuple[int, str, int, Iterator[str]]] = []

    def enter(dir_fd: int, prefix: str, depth: int) -> None:
        # Names only, a directory's with its "/" (its place in S3's order): half the memory of the
        # DirEntry objects in a flat directory of a million files (~75 bytes a name, not ~150).
        with os.scandir(dir_fd) as entries:
            children = sorted(entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name
                              for entry in entries)
        if on_directory is not None:
            on_directory()
        stack.append((dir_fd, prefix, depth, iter(children)))

    enter(os.dup(root_fd), "", 0)
    try:
        while stack:
            dir_fd, prefix, depth, children = stack[-1]
            name = next(children, None)
            if name is None:
                os.close(dir_fd)
                stack.pop()
                continue
            name = name.removesuffix("/")  # what it is now is what its lstat says
            relative = prefix + name
            if name == STATE_DIR_NAME or is_temp_name(name):
                walk.reserved.append(relative)
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we looked
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= MAX_SCAN_DEPTH:
                    walk.skipped.append(Skipped(relative, f"directory more than {MAX_SCAN_DEPTH} levels deep; left out"))
                    continue
                try:
                    child = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    walk.skipped.append(Skipped(relative, f"directory cannot be read ({exc.strerror}); left out"))
                    continue
                try:
                    enter(child, relative + "/", depth + 1)
                except OSError as exc:
                    os.close(child)
                    walk.skipped.append(Skipped(relative, f"directory cannot be read ({exc.strerror}); left out"))
            elif stat.S_ISREG(st.st_mode):
                local = local_file(relative, root / relative, st)
                if st.st_nlink > 1:
                    walk.linked.setdefault((st.st_dev, st.st_ino), []).append(local)
                    yield relative
                else:
                    yield local
            elif stat.S_ISLNK(st.st_mode):
                try:
                    link = os.readlink(name, dir_fd=dir_fd)
                except OSError:
                    continue  # replaced while we looked
                try:
                    target: os.stat_result | OSError = os.stat(name, dir_fd=dir_fd)
                except OSError as exc:
                    target = exc
                walk.links.append((relative, target, link))
                yield relative
            else:
                walk.skipped.append(Skipped(relative, "special file (socket, FIFO or device); refused"))
    finally:
        for dir_fd, *_ in stack:
            os.close(dir_fd)


def _find_inodes(root: Path, wanted: set[tuple[int, int]]) -> dict[tuple[int, int], list[str]]:
    """The names the walk's policy finds below ``root`` for the regular files ``wanted``: a second
    walk, made only for symlinks (rare) whose targets are not files held back already."""
    found: dict[tuple[int, int], list[str]] = {}
    try:
        fd = os.open(root, _DIRECTORY)
    except OSError:
        return found
    try:
        for item in walk_local(fd, root, LocalWalk()):
            if isinstance(item, LocalFile) and item.identity in wanted:
                found.setdefault(item.identity, []).append(item.relative)
    finally:
        os.close(fd)
    return found


def _add_symlink(scan: LocalScan, relative: str, target: os.stat_result | OSError, link: str,
                 found: Mapping[tuple[int, int], list[str]], root: Path) -> None:
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
        scan.files[relative] = local_file(relative, root / names[0], target, names[0])
        if names[0] in scan.linked_outside:
            scan.linked_outside[relative] = scan.linked_outside[names[0]]
