"""What one archive may expand to: the limits (each raised by its environment variable) and the
budget an extraction spends as it writes, so a bomb is stopped at the first byte over."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ...errors import UsageError

MAX_BYTES_VARIABLE = "TAO_DATA_IO_ARCHIVE_MAX_BYTES"
MAX_RATIO_VARIABLE = "TAO_DATA_IO_ARCHIVE_MAX_RATIO"
MAX_MEMBERS_VARIABLE = "TAO_DATA_IO_ARCHIVE_MAX_MEMBERS"


@dataclass(frozen=True)
class ArchiveLimits:
    """What one archive may expand to, checked *while* extracting (a bomb is stopped at the first
    byte over, and the half-written tree is removed). Defaults are generous for real datasets —
    images and checkpoints barely compress — and fatal to a 700 KB file that inflates to 700 MiB.
    Each can be raised through its environment variable."""

    max_bytes: int = 256 * 1024**3
    #: Expanded bytes per archive byte; archives smaller than ``ratio_floor`` may always expand
    #: to that floor (a tiny archive of a few text files compresses well).
    max_ratio: int = 200
    ratio_floor: int = 64 * 1024**2
    max_members: int = 200_000

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ArchiveLimits:
        env = os.environ if environ is None else environ
        defaults = cls()
        values = {}
        for name, variable in (("max_bytes", MAX_BYTES_VARIABLE), ("max_ratio", MAX_RATIO_VARIABLE),
                               ("max_members", MAX_MEMBERS_VARIABLE)):
            raw = env.get(variable)
            if raw:
                if not raw.isdigit() or int(raw) <= 0:
                    raise UsageError(f"{variable} {raw!r} must be a positive whole number")
                values[name] = int(raw)
        return cls(**{**{n: getattr(defaults, n) for n in ("max_bytes", "max_ratio", "ratio_floor", "max_members")},
                      **values})

    def budget(self, archive_size: int, label: str) -> ExtractionBudget:
        by_ratio = max(self.max_ratio * archive_size, self.ratio_floor)
        if by_ratio < self.max_bytes:
            limit, why = by_ratio, (f"{self.max_ratio}× its {archive_size:,} bytes ({MAX_RATIO_VARIABLE} raises the "
                                     "ratio)")
        else:
            limit, why = self.max_bytes, f"the limit of {self.max_bytes:,} bytes ({MAX_BYTES_VARIABLE} raises it)"
        return ExtractionBudget(label, limit, why, self.max_members)


@dataclass
class ExtractionBudget:
    label: str
    max_bytes: int
    why: str
    max_members: int
    bytes: int = 0
    members: int = 0

    def member(self) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise UsageError(f"archive {self.label!r} has more than {self.max_members:,} members "
                             f"({MAX_MEMBERS_VARIABLE} raises the limit); extraction stopped and nothing was kept")

    def spend(self, count: int) -> None:
        self.bytes += count
        if self.bytes > self.max_bytes:
            raise UsageError(f"archive {self.label!r} expands beyond {self.why}; extraction stopped at "
                             f"{self.bytes:,} bytes and nothing was kept")
