"""What a TAO container says about its training: its ``status.json``, read into one small model.

Why a reader of our own: TAO's PyTorch containers append one JSON object per event to
``status.json`` in the results directory (rank 0 only):
a status (STARTED, RUNNING, SUCCESS, FAILURE, SKIPPED), a message, per-epoch fields (``epoch``,
``max_epoch``, ``time_per_epoch``, ``eta``) and KPIs (``kpi``, also ``graphical`` and
``categorical`` values). The flows show it while the job runs — how far, how long to go, the
metrics epoch by epoch — which no other orchestrator does.

The file is the job's: fields vary by network, the last line may be half written, and a line may
be anything. So the reader folds what it understands, ignores what it does not, and never
raises: a progress display must never fail the job it describes. Each text it keeps is masked
whole (a job may write what it is given), then made one printable line, then cut to a length.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from ..console import shown
from ..redaction import Redactor

#: The file TAO's containers write in the results directory.
STATUS_FILE = "status.json"
#: The newest events are at the end: a reader reads this much of the file's tail.
STATUS_TAIL_BYTES = 256 * 1024
#: Epochs kept for the KPI table, newest last.
KPI_EPOCHS = 50
#: What one KPI value may be, shown: numbers, and short strings.
_MAX_TEXT = 80
#: Longer than any training (ten years): a time beyond it is a number a job made up.
MAX_SECONDS = 10 * 365 * 86400.0
#: What masks the credentials in a text the job wrote: a :class:`~tao_data_io.redaction.Redactor`.
Mask = Callable[[str], str]


class TrainingStatus(BaseModel):
    """The training as its ``status.json`` tells it, newest values winning."""

    status: str | None = None
    message: str | None = None
    epoch: int | None = None
    max_epoch: int | None = None
    #: Seconds per epoch, when the network says it (a number, or ``H:MM:SS``).
    time_per_epoch: float | None = None
    #: Seconds left: the network's own ``eta`` when it gives one, else epochs left × time per epoch.
    eta_seconds: float | None = None
    #: The newest value of every KPI.
    kpi: dict[str, float | str] = Field(default_factory=dict)
    #: Epoch → its KPIs, for a table (the last :data:`KPI_EPOCHS` epochs).
    kpi_by_epoch: dict[int, dict[str, float | str]] = Field(default_factory=dict)
    #: When the newest event was written, as the container wrote it (its local time).
    written: str | None = None

    @property
    def percent(self) -> float | None:
        if self.status == "SUCCESS":
            return 100.0
        if self.epoch is None or not self.max_epoch:
            return None
        return max(0.0, min(100.0, 100.0 * self.epoch / self.max_epoch))

    def describe(self) -> str:
        """``epoch 8 of 40, about 12m left, loss 0.213, mAP 0.41 (RUNNING: epoch 8 done)``."""
        parts = []
        if self.epoch is not None:
            parts.append(f"epoch {self.epoch}" + (f" of {self.max_epoch}" if self.max_epoch else ""))
        if self.eta_seconds is not None and self.status not in ("SUCCESS", "FAILURE"):
            parts.append(f"about {_duration(self.eta_seconds)} left")
        parts += [f"{name} {_shown(value)}" for name, value in list(self.kpi.items())[:4]]
        said = ", ".join(parts) or "no epoch reported yet"
        state = self.status + (f": {self.message}" if self.message else "") if self.status else self.message
        return said + (f" ({state})" if state else "")


def read_training_status(data: bytes | None, *, mask: Mask | None = None) -> TrainingStatus | None:
    """The status the lines of ``data`` (the file, or its tail) tell, every text masked with
    ``mask`` (default: this process's credentials) before it is cut; None when none of them is
    an event (no file yet, an empty one, nothing but noise, or anything this reader cannot fold:
    whatever the job wrote, this never raises)."""
    try:
        return _read(data, mask or Redactor())
    except Exception:  # noqa: BLE001 - deep nesting (RecursionError) and whatever else a job can write
        return None


def _text(value: str, mask: Mask, limit: int = _MAX_TEXT) -> str:
    """A text the job wrote, as shown: masked whole, on one printable line, then cut to ``limit``."""
    return shown(mask(value))[:limit]


def _read(data: bytes | None, mask: Mask) -> TrainingStatus | None:
    if not data:
        return None
    status = TrainingStatus()
    seen = False
    lines = data.split(b"\n")
    if not data.endswith(b"\n"):
        lines = lines[:-1]  # being written: the next read sees it whole
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line cut by the tail's start, or not JSON at all
        if isinstance(event, dict):
            seen = _fold(status, event, mask) or seen
    if not seen:
        return None
    _fill_eta(status)
    return status


def _fold(status: TrainingStatus, event: dict[str, Any], mask: Mask) -> bool:
    """Fold one event into ``status``; False when it holds nothing of a status event."""
    known = False
    if isinstance(event.get("status"), str):  # a new status: the message is its event's, if any
        status.status, status.message, known = _text(event["status"], mask), None, True
    if isinstance(event.get("message"), str):
        status.message, known = _text(event["message"], mask, _MAX_TEXT * 2), True
    epoch, max_epoch = _whole(event.get("epoch")), _whole(event.get("max_epoch"))
    if epoch is not None:
        status.epoch, known = epoch, True
    if max_epoch is not None:
        status.max_epoch, known = max_epoch, True
    per_epoch = _seconds(event.get("time_per_epoch"))
    if per_epoch is not None:
        status.time_per_epoch = per_epoch
    eta = _seconds(event.get("eta"))
    if eta is not None:
        status.eta_seconds = eta
    kpis = {name: value for group in ("kpi", "graphical", "categorical")
            if isinstance(event.get(group), dict) for name, value in _values(event[group], mask).items()}
    if kpis:
        known = True
        status.kpi.update(kpis)
        if status.epoch is not None:
            status.kpi_by_epoch.setdefault(status.epoch, {}).update(kpis)
            for old in sorted(status.kpi_by_epoch)[:-KPI_EPOCHS]:
                del status.kpi_by_epoch[old]
    if known:
        written = " ".join(str(event[key]) for key in ("date", "time") if isinstance(event.get(key), str | int))
        status.written = _text(written, mask) or status.written
    return known


def _fill_eta(status: TrainingStatus) -> None:
    if status.eta_seconds is None and status.time_per_epoch is not None and status.epoch is not None \
            and status.max_epoch:
        status.eta_seconds = max(0.0, (status.max_epoch - status.epoch) * status.time_per_epoch)
    if status.eta_seconds is not None and not status.eta_seconds < MAX_SECONDS:
        status.eta_seconds = None  # no such training: an overflow, not a time


def _values(group: dict[str, Any], mask: Mask) -> dict[str, float | str]:
    values: dict[str, float | str] = {}
    for name, value in list(group.items())[:32]:
        if isinstance(value, bool) or not isinstance(name, str):
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            values[_text(name, mask)] = float(value)
        elif isinstance(value, str):
            values[_text(name, mask)] = _text(value, mask)
    return values


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 10**9 else None
    if isinstance(value, float) and value.is_integer():
        return _whole(int(value))
    if isinstance(value, str) and value.isdigit():
        return _whole(int(value))
    return None


def _seconds(value: Any) -> float | None:
    """Seconds from a number or ``[D days, ]H:MM:SS[.f]`` (how Python prints a timedelta)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if 0 <= value < MAX_SECONDS else None
    if not isinstance(value, str):
        return None
    days = 0.0
    text = value.strip()
    if " day" in text:
        head, _, text = text.partition(",")
        try:
            days = float(head.split()[0])
        except (ValueError, IndexError):
            return None
        text = text.strip()
    parts = text.split(":")
    try:
        numbers = [float(part) for part in parts]
    except ValueError:
        return None
    if not 1 <= len(numbers) <= 3 or any(not math.isfinite(n) or n < 0 for n in numbers):
        return None
    seconds = 0.0
    for number in numbers:
        seconds = seconds * 60 + number
    total = days * 86400 + seconds
    return total if total < MAX_SECONDS else None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 90:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 90:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _shown(value: float | str) -> str:
    return f"{value:.4g}" if isinstance(value, float) else value
