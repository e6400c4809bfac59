"""Following a pod's log between looks: which lines are new since the last one shown.

Why timestamps: the API server serves a container's log from the start, the tail, or since a
number of seconds — not from an offset. With ``timestamps=true`` each line starts with the
kubelet's RFC 3339 time, so a look asks for a little more than the time since the last line it
showed (clocks differ; a margin costs a few repeated lines, which are dropped here) and keeps
only lines newer than that one. The cursor is the newest time shown per pod, kept in the job's
record, so a watcher that restarts goes on where the last one stopped.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from ...launch.backend import cursor_fields

#: Seconds asked for beyond the time since the last line shown (clock skew, a slow look).
MARGIN_SECONDS = 60
#: Lines a first look at a pod shows: the latest few, not a day of output.
FIRST_LINES = 50
#: The most lines a later look asks for: the API server applies ``sinceSeconds`` and then
#: ``tailLines``, so a pod that printed more since the last look is shown its newest lines
#: (reading the window from its start, a chatty pod's cursor would never catch up). As many as
#: a look shows (:data:`~tao_data_io.steps.MAX_LOG_LINES`), so they fit the byte limit of a read.
LOOK_LINES = 200


def stamp(text: str) -> tuple[datetime, int] | None:
    """An RFC 3339 time as the kubelet writes it (nanoseconds, trailing zeros dropped, ``Z``),
    as something that orders correctly; None when ``text`` is not one."""
    if not text.endswith("Z"):
        return None
    whole, _, fraction = text[:-1].partition(".")
    try:
        when = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    if fraction and not fraction.isdigit():
        return None
    return when, int((fraction or "0").ljust(9, "0")[:9])


def new_lines(text: str, last: str | None, *, limit: int | None = None) -> tuple[list[str], str | None]:
    """The lines of a ``timestamps=true`` log newer than ``last`` (without their time), and the
    newest time among them (``last`` when none is newer). A line cut by ``limitBytes`` (``limit``)
    at the end waits for the next look — unless no new line came whole before it: the next look's
    window starts no later (the margin re-reads what was shown), so it would come back cut for
    ever and hold back every line after it. It is passed over then, and said, never shown in part
    (a part could be half a secret)."""
    lines = text.split("\n")
    cut = None if not lines or lines[-1] == "" else lines[-1]
    lines.pop()  # "" after the last newline, or the cut line
    after = stamp(last) if last else None  # lines of one instant are all new after an older cursor
    shown: list[str] = []
    newest, newest_at = last, after
    for line in lines:
        head, _, rest = line.partition(" ")
        when = stamp(head)
        if when is None or (after is not None and when <= after):
            continue
        shown.append(rest)
        if newest_at is None or when > newest_at:
            newest, newest_at = head, when
    if not shown and cut is not None and limit is not None and len(text.encode()) >= limit:
        head = cut.partition(" ")[0]
        when = stamp(head)
        if when is not None and (after is None or when > after):
            return [f"[tao-data-io: a line too long for one look ({limit} bytes with the lines before it) was not "
                    "shown]"], head
    return shown, newest


def since_seconds(last: str | None, now: datetime) -> int | None:
    """What to ask for after ``last`` (None: a first look, which asks for the tail instead)."""
    when = stamp(last) if last else None
    if when is None:
        return None
    return max(1, math.ceil((now - when[0]).total_seconds()) + MARGIN_SECONDS)


def read_cursor(cursor: str | None) -> dict[str, str]:
    """Pod name → the newest time shown; anything else starts afresh."""
    return {k: v for k, v in cursor_fields(cursor).items() if isinstance(k, str) and isinstance(v, str)}
