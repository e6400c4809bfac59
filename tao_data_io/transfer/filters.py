"""``--exclude`` / ``--include`` with ``aws s3 sync`` semantics.

Each pattern is an ``fnmatch`` pattern matched against the path *relative to the source root*
(POSIX separators; ``*`` also matches ``/``, so ``.tao/*`` excludes everything below
``.tao``). Rules apply in the order given and the last rule that matches decides; a path no
rule matches is included. So ``--exclude '*' --include '*.json'`` keeps only JSON files.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

Action = Literal["exclude", "include"]


@dataclass(frozen=True)
class FilterRule:
    action: Action
    pattern: str


@dataclass(frozen=True)
class PathFilter:
    """An ordered list of include/exclude rules."""

    rules: tuple[FilterRule, ...] = ()

    @classmethod
    def from_patterns(cls, excludes: Iterable[str] = (), includes: Iterable[str] = ()) -> PathFilter:
        """Excludes first, then includes — the order to use when the interleaving is unknown
        (an include can then re-admit what an exclude removed, which is what people mean)."""
        return cls(tuple(FilterRule("exclude", p) for p in excludes)
                   + tuple(FilterRule("include", p) for p in includes))

    def plus(self, *rules: FilterRule) -> PathFilter:
        return PathFilter(self.rules + rules)

    def __call__(self, relative: str) -> bool:
        """True if ``relative`` is to be transferred."""
        included = True
        for rule in self.rules:
            if fnmatchcase(relative, rule.pattern):
                included = rule.action == "include"
        return included


@dataclass(frozen=True)
class GlobFilter:
    """TensorFlow's glob rule (``tf.io.gfile.glob``) over paths relative to the folder a pattern
    lists: the pattern's components match the path's one for one — ``*`` and ``?`` within a
    component, never across ``/`` (unlike aws-cli's and s5cmd's ``*``) — so a job
    globbing the staged copy with its own pattern finds exactly what was staged."""

    pattern: str

    def __call__(self, relative: str) -> bool:
        parts, wanted = relative.split("/"), self.pattern.split("/")
        return len(parts) == len(wanted) and all(fnmatchcase(part, _literal_brackets(want))
                                                 for part, want in zip(parts, wanted))


def _literal_brackets(pattern: str) -> str:
    """``[`` and ``]`` as themselves (fnmatch would read a class): only ``*`` and ``?`` are
    metacharacters of a glob URI (:attr:`tao_data_io.uris.S3Url.is_glob`)."""
    return pattern.replace("[", "[[]").replace("]", "[]]") if "[" in pattern or "]" in pattern else pattern
