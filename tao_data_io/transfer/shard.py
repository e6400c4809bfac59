"""Shards: split one prefix's objects among N stagers by a stable hash of each key.

Why: a tier B stage Job may run as an Indexed Job of N pods that fill one volume together;
each pod must take a disjoint part, and together they must take everything, without talking to
each other. Shard ``i/N`` owns the keys whose SHA-256 (first 8 bytes, big-endian) is ``i``
modulo ``N`` — the same on every machine and every Python, unlike ``hash()``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ..errors import UsageError

_SHARD = re.compile(r"(\d{1,4})/(\d{1,4})")
MAX_SHARDS = 1000


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def owns(self, key: str) -> bool:
        return shard_of(key, self.count) == self.index

    @property
    def label(self) -> str:
        """For file names of per-shard state (a lock, a digest cache): ``shard-2-of-4``."""
        return f"shard-{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def shard_of(key: str, count: int) -> int:
    return int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()[:8], "big") % count


def parse_shard(text: str, *, what: str = "shard") -> Shard:
    """``"i/N"`` with 0 ≤ i < N ≤ 1000, or a :class:`UsageError` naming ``what`` and the value."""
    match = _SHARD.fullmatch(text)
    if match is None or not 0 <= int(match[1]) < int(match[2]) <= MAX_SHARDS:
        raise UsageError(f"{what} {text!r} is not INDEX/COUNT with 0 <= INDEX < COUNT <= {MAX_SHARDS}; write e.g. 0/4")
    return Shard(int(match[1]), int(match[2]))
