"""Terminal output for the CLI verbs: every line redacted, optional rich progress bar, JSON.

Why a separate object: each verb module prints through the same redactor and renders progress
the same way, and tests can capture it; the verbs stay free of terminal details.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from .credentials import Redactor
from .reporting import Progress


class Console:
    def __init__(self, *, progress_mode: str = "auto", stdout: TextIO | None = None, stderr: TextIO | None = None,
                 redactor: Redactor | None = None) -> None:
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.redact = redactor or Redactor()
        self.progress_mode = progress_mode

    def out(self, text: str) -> None:
        print(self.redact(text), file=self.stdout, flush=True)

    def err(self, text: str) -> None:
        print(self.redact(text), file=self.stderr, flush=True)

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
