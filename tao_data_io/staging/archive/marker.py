"""The extraction marker, beside the destination (``fs.state.state_dir_for``), never inside it: the
archive's identity, ``strip_components`` and every file with its size — and what it says about
the tree there (absent, up to date, or why it must be extracted again)."""

from __future__ import annotations

import json
import os
import stat
from importlib import metadata
from pathlib import Path
from typing import Any

from ...errors import UnsafePathError, UsageError
from ...fs.confinement import confined_path
from ...fs.state import read_state_file, state_dir_for

#: The marker beside the destination (``fs.state.state_dir_for``), which says what was extracted there.
MARKER_NAME = "extracted.json"
#: Bumped when the marker's meaning changes, so old markers cause one re-extraction.
MARKER_FORMAT = 2


def marker_path(dest: Path) -> Path:
    """Where the marker of the extraction at ``dest`` lives: beside the tree, never inside it."""
    return state_dir_for(Path(os.path.abspath(dest))) / MARKER_NAME


def read_destination(dest: Path, marker: Path) -> dict[str, Any] | None:
    """The marker of an earlier extraction at ``dest`` (``{}`` if unreadable), or None when
    ``dest`` is absent or empty. Refuses a destination extraction must not replace, and a marker
    that is not this process's own file (:func:`~tao_data_io.fs.state.read_state_file`)."""
    try:
        mode = os.lstat(dest).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        raise UsageError(f"destination {str(dest)!r} is a symlink: extraction replaces the directory by renaming, "
                         "so give the real directory path instead")
    if not stat.S_ISDIR(mode):
        raise UsageError(f"destination {str(dest)!r} exists and is not a directory; choose another path")
    if os.path.ismount(dest):
        raise UsageError(f"destination {str(dest)!r} is a mount point, which a finished tree cannot be renamed "
                         f"over; extract into a subdirectory such as {str(dest / 'data')!r}")
    try:
        text = read_state_file(marker)  # another user's marker is refused: it would vouch for a tree
    except FileNotFoundError:
        with os.scandir(dest) as entries:
            if next(entries, None) is not None:
                raise UsageError(f"destination {str(dest)!r} is not empty and has no {MARKER_NAME} marker, so it was "
                                 "not made by extract and will not be replaced; choose a new or empty "
                                 "directory") from None
        return None
    try:
        marker = json.loads(text)
    except ValueError:
        return {}
    return marker if isinstance(marker, dict) else {}


def reason_to_extract(previous: dict[str, Any] | None, identity: dict[str, Any], strip_components: int,
                       dest: Path) -> str | None:
    """Why ``dest`` must be (re)extracted, or None if it already holds this archive, complete."""
    if previous is None:
        return "first extraction"
    if previous.get("format") != MARKER_FORMAT or not isinstance(previous.get("files"), list):
        return f"the {MARKER_NAME} marker is unreadable or from another version"
    if previous.get("status") != "complete":
        return "an earlier extraction was interrupted while installing"
    if previous.get("archive") != identity:
        return "archive changed"
    if previous.get("strip_components") != strip_components:
        return "strip-components changed"
    for entry in previous["files"]:
        damage = _damage(dest, entry)
        if damage:
            return f"tree damaged: {damage}"
    return None


def _damage(dest: Path, entry: Any) -> str | None:
    """What is wrong with one marker entry's file in ``dest``, or None if it is intact."""
    try:
        path = confined_path(dest, entry["path"], what="marker entry")
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{entry['path']} is missing"
    except (KeyError, TypeError, UnsafePathError):
        return f"the {MARKER_NAME} marker has an invalid entry {entry!r}"
    if "link" in entry:
        if not stat.S_ISLNK(st.st_mode) or os.readlink(path) != entry["link"]:
            return f"{entry['path']} is no longer the symlink to {entry['link']!r}"
    elif not stat.S_ISREG(st.st_mode) or st.st_size != entry.get("size"):
        return f"{entry['path']} is not the {entry.get('size')}-byte file that was extracted"
    return None


def tool_version() -> str:
    try:
        return metadata.version("tao-data-io")
    except metadata.PackageNotFoundError:
        return "unknown"
