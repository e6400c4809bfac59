"""A rank's output as the daemon keeps it, read from a cursor: whole lines, none lost or shown
twice across looks, whoever looks (another process, a restarted worker).

Why timestamps: the Engine API reads a container's log from a time (``since``), not an offset,
and stamps each line with the nanosecond it was printed (``timestamps``). A cursor is the stamp
of the last line shown and how many lines carried that very stamp, so the next look asks from
that time and skips what was shown. The same cursor reads the saved copy of the log once the
container is gone (:meth:`Stamped.after` over its text), so a job's log reads the same before
and after collect removed its containers.
"""

from __future__ import annotations

import calendar
import re
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

#: A stamp the daemon writes: RFC 3339 with up to nine digits of fraction, in UTC.
_STAMP_FORMAT = "%Y-%m-%dT%H:%M:%S"
#: The most of a line the daemon keeps as one log message (moby's ``bufio`` reader, 16 KiB): a
#: longer line is several messages, each stamped where it begins.
PIECE = 16 * 1024
_INNER_STAMP = re.compile(rb"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?Z ")


@dataclass(frozen=True)
class Position:
    """Where a rank's log was last read: the last stamp shown (ns since the epoch) and how many
    lines with that stamp were shown."""

    stamp: int = 0
    count: int = 0

    def since(self) -> float | None:
        """What to ask the daemon from: a little before the stamp (a float loses nanoseconds)."""
        return None if self.stamp == 0 else max(self.stamp / 1e9 - 1e-3, 1e-9)


def stamp_ns(text: str) -> int | None:
    """``2026-12-06T02:31:54.123456789Z`` → nanoseconds since the epoch; None if it is not one."""
    if not text.endswith("Z"):
        return None
    whole, _, fraction = text[:-1].partition(".")
    try:
        seconds = calendar.timegm(time.strptime(whole, _STAMP_FORMAT))
    except ValueError:
        return None
    if not fraction.isdigit() and fraction:
        return None
    return seconds * 1_000_000_000 + int((fraction + "000000000")[:9])


@dataclass(frozen=True)
class Line:
    stamp: int
    text: str  # with its newline, when it had one


def lines(raw: bytes) -> Iterator[Line]:
    """The stamped lines of ``raw`` (what the daemon sends with ``timestamps``, or a saved copy).
    The daemon keeps a line longer than :data:`PIECE` in pieces and stamps each where it begins,
    inside the line: those stamps are taken out, so a long line reads back whole."""
    for piece in raw.splitlines(keepends=True):
        head, _, text = piece.partition(b" ")
        stamp = stamp_ns(head.decode("ascii", "replace"))
        if stamp is None:
            continue
        at = PIECE
        while len(text) > at and (inner := _INNER_STAMP.match(text, at)) is not None:
            text = text[:at] + text[inner.end():]
            at += PIECE
        yield Line(stamp, text.decode("utf-8", "replace"))


def after(found: Iterable[Line], position: Position, limit: int) -> tuple[str, Position]:
    """The text of the lines of ``found`` past ``position``, at most ``limit`` bytes of them (at
    least one line, so a look always moves), and the position after the last one shown."""
    shown: list[str] = []
    size = 0
    stamp, count = position.stamp, position.count
    seen_at_stamp = 0
    for line in found:
        if line.stamp < position.stamp:
            continue
        if line.stamp == position.stamp:
            seen_at_stamp += 1
            if seen_at_stamp <= position.count:
                continue
        length = len(line.text.encode())
        if shown and size + length > limit:
            break
        shown.append(line.text)
        size += length
        count = count + 1 if line.stamp == stamp else 1
        stamp = line.stamp
    return "".join(shown), Position(stamp, count)


def last(found: Iterable[Line], count: int) -> tuple[str, Position]:
    """The last ``count`` lines of ``found`` and the position after them."""
    kept: deque[Line] = deque(maxlen=max(count, 1))
    same = 0  # how many lines in a row, up to the last, carry the last one's stamp
    for line in found:
        same = same + 1 if kept and kept[-1].stamp == line.stamp else 1
        kept.append(line)
    if not kept:
        return "", Position()
    return "".join(line.text for line in kept) if count > 0 else "", Position(kept[-1].stamp, same)
