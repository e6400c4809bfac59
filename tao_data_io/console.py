"""Terminal output for the CLI verbs: every line redacted and made printable, optional rich
progress bar, JSON.

Why a separate object: each verb module prints through the same redactor and renders progress
the same way, and tests can capture it; the verbs stay free of terminal details.

Why printable: keys and file names are chosen by whoever wrote the bucket or the tree. Printed
raw, an escape sequence in one retitles or recolours the terminal, a carriage return overwrites
the line it is on, a newline forges a line of the report. So every line has its control
characters (C0 but line breaks and tabs, DEL, C1, bidirectional overrides) and undecodable bytes
escaped, and a name — wherever a verb prints one — has its line breaks escaped too (:func:`shown`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from .redaction import Redactor
from .reporting import Progress


#: Never sent to the terminal as is: C0 controls (line breaks and tabs aside), DEL, C1 controls,
#: bidirectional overrides, and lone surrogates (bytes of a name that are not UTF-8).
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
#: The same in a name, where a line break or tab is part of the name, not of the layout.
_UNPRINTABLE_IN_NAME = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str) -> str:
    """``text`` with everything a terminal would act on escaped (line breaks and tabs kept)."""
    return _UNPRINTABLE.sub(_escape, text)


def shown(name: str) -> str:
    """A key, a path or a reason as one printable line: line breaks and tabs escaped as well."""
    return _UNPRINTABLE_IN_NAME.sub(_escape, name)


class Console:
    def __init__(self, *, progress_mode: str = "auto", stdout: TextIO | None = None, stderr: TextIO | None = None,
                 redactor: Redactor | None = None) -> None:
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.redact = redactor or Redactor()
        self.progress_mode = progress_mode

    def out(self, text: str) -> None:
        print(printable(self.redact(text)), file=self.stdout, flush=True)

    def err(self, text: str) -> None:
        print(printable(self.redact(text)), file=self.stderr, flush=True)

    def json(self, value: Any) -> None:
        self.out(json.dumps(value, indent=2, default=str))

    @contextmanager
    def progress(self, label: str) -> Iterator[Callable[[Progress], None] | None]:
        """Yield a progress callback drawing a rich bar on stderr, or None when not wanted."""
        wanted = self.progress_mode == "always" or (self.progress_mode == "auto" and self.stderr.isatty())
        if not wanted:
            yield None
            return
        from rich.console import Console as RichConsole
        from rich.progress import (BarColumn, DownloadColumn, Progress as RichProgress, TimeRemainingColumn,
                                   TransferSpeedColumn)

        bar = RichProgress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                           TransferSpeedColumn(), TimeRemainingColumn(),
                           console=RichConsole(file=self.stderr, force_terminal=self.progress_mode == "always"))
        with bar:
            task = bar.add_task(label, total=None)

            def update(p: Progress) -> None:
                bar.update(task, total=p.bytes_total, completed=p.bytes_done,
                           description=f"{label} {p.files_done}/{p.files_total} files")

            yield update
