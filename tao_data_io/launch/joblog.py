"""What a frame prints, kept on the host within a limit: its head and its tail, and a line that
says what was dropped between.

Why: a frame's output lands on the host's disk, outside every limit of the frame — one of 64Mi
wrote 512 MiB through stdout. So the supervisor copies each frame's output from a pipe into
segment files of ``segment`` bytes (:class:`LogWriter`): ``rank-N.log`` is the head and stays;
``rank-N.log.1``, ``.2``, … follow, and only the newest :data:`TAIL_SEGMENTS` of them are kept,
as the kubelet keeps a container's newest log files. A log never holds more than
``(1 + TAIL_SEGMENTS) * segment`` bytes on disk (the target's ``log_limit``).

Readers (:class:`JobLog`, other processes, possibly while the frame runs) see one stream of
byte positions: position ``P`` lies in segment ``P // segment``, so a follower's cursor stays a
plain offset. Where segments were dropped, the stream reads as a line naming how many bytes
were; a follower that fell behind past a dropped segment is told so once and goes on after it.
A log written before logs had segments (``segment`` None) is its one file.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..redaction import cut_note
from .backend import FOLLOW_BYTES, FOLLOW_START_BYTES, LogChunk, cursor_fields
from ..quantities import quantity_bytes

#: How many segments after the head are kept: with the head, the log's limit in four parts.
TAIL_SEGMENTS = 3
#: What a target keeps of each frame's output when it does not say (``LocalSettings.log_limit``).
DEFAULT_LOG_LIMIT = "64Mi"
#: The smallest limit a target may set: four segments of a page each.
MIN_LOG_LIMIT = 16 * 1024
#: The largest: a log is the host's disk, per rank of every job.
MAX_LOG_LIMIT = "64Gi"
_BLOCK = 1 << 16
#: The cursor's key for the rank whose line the last look cut (see :func:`follow`).
_OPEN = "open"
#: How far from a gap a line break is looked for, to drop the lines the gap cuts whole.
_EDGE_BYTES = 1 << 16


def segment_bytes(limit: str) -> int:
    """The segment size for a log limit (a binary quantity such as ``64Mi``)."""
    return quantity_bytes(limit) // (1 + TAIL_SEGMENTS)


def dropped_note(count: int, *, in_a_line: bool = False) -> bytes:
    """The line that stands where ``count`` bytes of a frame's output were dropped (on a line of
    its own: after a line break of its own when the drop began ``in_a_line``); a cut, which a mask
    knows (:data:`~tao_data_io.redaction.CUT_MARK`)."""
    note = cut_note(f"{count} bytes of this output were dropped here; the log keeps its head and tail") + "\n"
    return ("\n" if in_a_line else "").encode() + note.encode()


class LogWriter:
    """The supervisor's end of one frame's output: append, in segments, keeping the head and
    the newest :data:`TAIL_SEGMENTS` (see the module docstring). Owner-only files: a log holds
    whatever the job prints."""

    def __init__(self, path: Path, segment: int | None) -> None:
        self.path = path
        self.segment = segment
        self.position = _size(path, segment)
        self._fd: int | None = None
        self._open_index: int | None = None

    def write(self, data: bytes) -> None:
        while data:
            index, offset = self._where(self.position)
            room = len(data) if self.segment is None else self.segment - offset
            piece, data = data[:room], data[room:]
            os.write(self._file(index), piece)  # a regular file: written whole
            self.position += len(piece)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _where(self, position: int) -> tuple[int, int]:
        return (0, position) if self.segment is None else divmod(position, self.segment)

    def _file(self, index: int) -> int:
        if self._fd is not None and self._open_index == index:
            return self._fd
        self.close()
        self._fd = _open_segment(segment_path(self.path, index))
        self._open_index = index
        dropped = index - TAIL_SEGMENTS
        if dropped >= 1:
            try:
                os.unlink(segment_path(self.path, dropped))
            except FileNotFoundError:
                pass
        return self._fd


def _open_segment(path: Path) -> int:
    """A segment to append to, never through a link or into anything but a regular file: what
    is at the name and is not ours to write (planted by whoever could write the run directory)
    is removed and a file made in its place."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o600)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO):  # a symlink; a FIFO with no reader
                raise
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
        os.unlink(path)
    raise OSError(errno.EEXIST, "something keeps taking the log's place", str(path))


def segment_path(path: Path, index: int) -> Path:
    return path if index == 0 else path.with_name(f"{path.name}.{index}")


def _segments(path: Path) -> list[int]:
    """The segment indices of ``path``'s log on disk, in order (the head, if any, first)."""
    pattern = re.compile(re.escape(path.name) + r"(?:\.([1-9][0-9]*))?")
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return []
    found = (pattern.fullmatch(name) for name in names)
    return sorted(int(match.group(1) or 0) for match in found if match is not None)


def _held(path: Path) -> int | None:
    """How many bytes the segment at ``path`` holds; None when it is gone, or is not a regular
    file (a log is never read through a link)."""
    try:
        found = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return found.st_size if stat.S_ISREG(found.st_mode) else None


def _size(path: Path, segment: int | None) -> int:
    """Where the stream ends: the newest segment's start plus what it holds."""
    indices = _segments(path)
    if not indices:
        return 0
    last = indices[-1]
    held = _held(segment_path(path, last)) or 0
    return held if segment is None else last * segment + held


@dataclass(frozen=True)
class _Piece:
    """A run of the stream from ``start`` (a stream position): ``length`` bytes of segment
    ``index`` from its byte ``offset``, or — ``index`` None — a gap where bytes were dropped
    (``in_a_line`` when what comes before it does not end a line)."""

    start: int
    length: int
    index: int | None
    offset: int = 0
    in_a_line: bool = False


class JobLog:
    """A frame's output as one stream (see the module docstring), read by another process."""

    def __init__(self, path: Path, segment: int | None) -> None:
        self.path = path
        self.segment = segment

    def _pieces(self) -> list[_Piece]:
        """The stream as kept: segments, and a gap wherever segments were dropped — widened to the
        whole lines it cuts (within :data:`_EDGE_BYTES` each side), so no line comes out as two
        halves of something, such as a secret no mask would then know."""
        pieces: list[_Piece] = []
        position = 0
        for index in _segments(self.path):
            start = 0 if self.segment is None else index * self.segment
            held = _held(segment_path(self.path, index))
            if held is None:  # dropped between the listing and now
                continue
            if start > position and pieces:
                kept, ends_a_line = self._through_last_newline(pieces.pop())
                after = self._from_first_newline(_Piece(start, held, index))
                gap = _Piece(kept.start + kept.length, after.start - kept.start - kept.length, None,
                             in_a_line=not ends_a_line)
                pieces += [kept, gap, after]
            else:
                pieces.append(_Piece(start, held, index))
            position = start + held
        return pieces

    def _through_last_newline(self, piece: _Piece) -> tuple[_Piece, bool]:
        """``piece`` up to its last line break in its last :data:`_EDGE_BYTES`, else without them
        (a longer line is cut far enough from the gap that no secret across it keeps a half);
        and whether it now ends a line."""
        assert piece.index is not None
        edge = min(_EDGE_BYTES, piece.length)
        newline = self._read_segment(piece.index, piece.offset + piece.length - edge, edge).rfind(b"\n")
        return _Piece(piece.start, piece.length - edge + newline + 1, piece.index, piece.offset), newline >= 0

    def _from_first_newline(self, piece: _Piece) -> _Piece:
        """``piece`` from after its first line break in its first :data:`_EDGE_BYTES`, else from
        after them."""
        assert piece.index is not None
        edge = min(_EDGE_BYTES, piece.length)
        newline = self._read_segment(piece.index, piece.offset, edge).find(b"\n")
        skip = newline + 1 if newline >= 0 else edge
        return _Piece(piece.start + skip, piece.length - skip, piece.index, piece.offset + skip)

    def size(self) -> int:
        """The stream's end: what the frame has printed so far, dropped bytes included."""
        pieces = self._pieces()
        return pieces[-1].start + pieces[-1].length if pieces else 0

    def read(self, position: int, limit: int) -> tuple[bytes, int]:
        """Up to ``limit`` bytes of the stream from ``position`` (a gap given as its note, whole,
        which may pass ``limit``), and the position after them."""
        out: list[bytes] = []
        taken = 0
        for piece in self._pieces():
            end = piece.start + piece.length
            if end <= position:
                continue
            if taken >= limit:
                break
            if piece.index is None:
                out.append(dropped_note(end - position, in_a_line=piece.in_a_line and position == piece.start))
                taken += len(out[-1])
                position = end
                continue
            data = self._read_segment(piece.index, piece.offset + position - piece.start,
                                      min(limit - taken, end - position))
            if not data:
                break
            out.append(data)
            taken += len(data)
            position += len(data)
        return b"".join(out), position

    def _read_segment(self, index: int, offset: int, count: int) -> bytes:
        """``count`` bytes of segment ``index`` from ``offset``; nothing when it is gone or is not
        a regular file (never through a link, never blocking on a FIFO)."""
        try:
            fd = os.open(segment_path(self.path, index), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return b""
        try:
            return os.pread(fd, count, offset) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)

    def text(self) -> str:
        """The whole stream as kept (head, a note for what was dropped, tail)."""
        data, _ = self.read(0, self.size())
        return data.decode("utf-8", "replace")

    def tail(self, lines: int | None, max_bytes: int) -> str:
        """The last ``lines`` lines (all for None), from at most the last ``max_bytes`` of the
        stream: read backwards in blocks, each byte once, so a log of one endless line costs no
        more than ``max_bytes``."""
        blocks: list[bytes] = []
        newlines = read = 0
        for block in self._backwards(max_bytes):
            blocks.append(block)
            read += len(block)
            newlines += block.count(b"\n")
            if lines is not None and newlines >= lines + blocks[0].endswith(b"\n"):
                break  # the newline before the first line wanted is in
        data = b"".join(reversed(blocks))
        if read >= max_bytes and self.size() > read:
            # The window begins inside a line: what it holds of it could be the end of a secret
            # no mask knows by its end alone. That line goes (its last _EDGE_BYTES when it is all
            # the window holds).
            newline = data.find(b"\n")
            data = (data[newline + 1:] if newline >= 0 else
                    (cut_note("this line began before what is shown") + "\n").encode() + data[_EDGE_BYTES:])
        kept = data.splitlines(keepends=True)
        if lines is not None:
            kept = kept[-lines:] if lines > 0 else []
        return b"".join(kept).decode("utf-8", "replace")

    def _backwards(self, budget: int) -> Iterator[bytes]:
        """The stream's bytes from its end backwards, in blocks, ``budget`` of them at most."""
        for piece in reversed(self._pieces()):
            if budget <= 0:
                return
            if piece.index is None:
                note = dropped_note(piece.length, in_a_line=piece.in_a_line)
                budget -= len(note)
                yield note
                continue
            end = piece.length
            while end > 0 and budget > 0:
                step = min(_BLOCK, end, budget)
                end -= step
                budget -= step
                block = self._read_segment(piece.index, piece.offset + end, step)
                if block:
                    yield block


def lines_since(log: JobLog, offset: int | None, *, limit: int, start_bytes: int,
                ended: bool = False) -> tuple[str, int]:
    """The whole lines of ``log`` from position ``offset`` (None: the last lines within
    ``start_bytes``) up to ``limit`` bytes, and the position after them. A line still being
    written waits for the next look, unless it alone fills ``limit`` or the frame has ``ended``
    (its last line has no end coming); a log that shrank (its run directory replaced) is read
    from its start.

    Positions are counted back from where the read ended: what is left unread at the end holds
    no newline, so no note of dropped bytes (which has one) — its bytes are the stream's own."""
    size = log.size()
    fresh = offset is None
    start = max(0, size - start_bytes) if offset is None else offset if offset <= size else 0
    data, after = log.read(start, limit)
    if fresh and start > 0:  # the first line is cut by where the look starts
        newline = data.find(b"\n")
        data = data[newline + 1:] if newline >= 0 else b""
    end = data.rfind(b"\n")
    if end < 0 and len(data) < limit and not ended:
        return "", after - len(data)
    # A line longer than the limit is cut, but not inside a UTF-8 character.
    taken = data[:end + 1] if end >= 0 else (data[:_whole_characters(data)] or data)
    return taken.decode("utf-8", "replace"), after - (len(data) - len(taken))


def _whole_characters(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary."""
    lead = len(data) - 1
    while lead > 0 and len(data) - lead < 4 and data[lead] & 0xC0 == 0x80:
        lead -= 1
    first = data[lead] if data else 0
    size = 4 if first >= 0xF0 else 3 if first >= 0xE0 else 2 if first >= 0xC0 else 1
    return len(data) if lead + size <= len(data) else lead


def follow(logs: list[JobLog], cursor: str | None, *, ended: bool) -> LogChunk:
    """What each rank's log (``logs``, by rank) holds since ``cursor`` (a byte offset per rank;
    None: the last lines), whole lines of :data:`FOLLOW_BYTES` at most per rank, ``[rank N]``
    before each line when there are several ranks; ``ended``: the job has ended, read before the
    logs — what a look finds after it is all there is.

    A line longer than a look is shown in pieces, and a watcher masks what it is shown as one
    stream, so a piece must be followed by its line's next piece and nothing else: a cut piece
    ends a look (one rank's at most; another rank's waits), and the next look begins with its
    continuation, unprefixed (the cursor says which rank's line is open)."""
    offsets, open_rank = _cursor(cursor)

    def look(rank: int) -> str:
        text, after = lines_since(logs[rank], offsets.get(str(rank)), limit=FOLLOW_BYTES,
                                  start_bytes=FOLLOW_START_BYTES, ended=ended)
        offsets[str(rank)] = after
        return text

    if len(logs) == 1:
        return LogChunk(text=look(0), cursor=_cursor_text(offsets, None))
    ranks = sorted(range(len(logs)), key=lambda rank: rank != open_rank)  # the open line first
    shown: list[str] = []
    cut: tuple[int, str] | None = None
    for rank in ranks:
        before = offsets.get(str(rank))
        text = look(rank)
        if text.endswith("\n") or not text:
            shown.append(_prefixed(rank, text, continues=rank == open_rank))
        elif rank == open_rank:  # its line goes on past this look too: nothing else may come between
            return LogChunk(text=text, cursor=_cursor_text(offsets, rank))
        elif cut is None:
            cut = (rank, text)
        elif before is None:  # a second cut piece waits for a later look
            del offsets[str(rank)]
        else:
            offsets[str(rank)] = before
    if cut is not None:
        shown.append(_prefixed(*cut, continues=False))
    return LogChunk(text="".join(shown), cursor=_cursor_text(offsets, cut[0] if cut is not None else None))


def _cursor(cursor: str | None) -> tuple[dict[str, int], int | None]:
    """A cursor of :func:`follow` read back — each rank's offset, and the rank
    whose line the last look cut — anything else starts afresh."""
    data = cursor_fields(cursor)
    offsets = {str(k): v for k, v in data.items() if str(k).isdigit() and isinstance(v, int) and v >= 0}
    open_rank = data.get(_OPEN)
    return offsets, open_rank if isinstance(open_rank, int) and str(open_rank) in offsets else None


def _cursor_text(offsets: dict[str, int], open_rank: int | None) -> str:
    return json.dumps({**offsets, **({_OPEN: open_rank} if open_rank is not None else {})}, sort_keys=True)


def _prefixed(rank: int, text: str, *, continues: bool) -> str:
    """``text`` of ``rank`` with ``[rank N] `` before each line, but the first when it
    ``continues`` a line an earlier look cut (its start was prefixed then); a last line without
    its newline (cut) stays without one."""
    lines = text.split("\n")
    ends = lines.pop() if lines else ""  # "" after a final newline, else the cut line
    said = [("" if n == 0 and continues else f"[rank {rank}] ") + line + "\n" for n, line in enumerate(lines)]
    if ends:
        said.append(("" if not said and continues else f"[rank {rank}] ") + ends)
    return "".join(said)
