"""The words docs/development.md's glossary retired stay retired in the product's code: each had
meant two things (or a thing had two words), and a word that comes back brings the confusion
back with it. The one place each may appear is where an old document is still read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("tao_data_io", "tasks", "flows", "blocks", "deployments")

#: retired word → (what replaced it, the lines that may still say it: an alias an old document needs)
RETIRED: dict[str, tuple[str, tuple[str, ...]]] = {
    r"\bplatform": ("backend (its name), declaration (what its package declares)",
                    ("calls it ``platform``", 'AliasChoices("backend", "platform")')),
    r"\b(RecordBackend|S3Backend|DirectoryBackend)\b": ("RecordStorage, S3Storage, DirectoryStorage", ()),
    r"\bVerificationError\b": ("IntegrityError (a checksum; the verify probe gives a verdict)", ()),
    r"\b(lock_owner|temp_owner|UNOWNED)\b": ("lock_tag, temp_tag, UNLOCKED (the watcher is the owner)", ()),
    r"\bcurrent_status\b": ("observe_and_record", ()),
    r'\bsource: str = "cli"|\bSOURCE\b|"--source"|\bsource=REPORTER\b|\.mark\(.*\bsource=': (
        "reporter (who reported a change; a source is an input's URI)", ()),
    r"^def look\b|\bsteps\.look\b": ("observe (a look is one poll inside a wait)", ()),
    r"\bstaging_map\.workdir\b|\bplan\.staging_root\b": ("staging_dir (one job's directory)", ()),
    r"\bclass _?Budget\b": ("WaitBudget, ExtractionBudget, _ResultsBudget", ()),
}


def _lines() -> list[tuple[str, int, str]]:
    found = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                found.append((str(path.relative_to(ROOT)), number, line))
    return found


@pytest.mark.parametrize("word", sorted(RETIRED))
def test_a_retired_word_stays_retired(word: str) -> None:
    replaced_by, allowed = RETIRED[word]
    pattern = re.compile(word)
    back = [f"{path}:{number}: {line.strip()}" for path, number, line in _lines()
            if pattern.search(line) and not any(kept in line for kept in allowed)]
    assert not back, f"{word} is retired (now: {replaced_by}); it is back at {back}"


def test_canceled_is_only_what_the_cancel_verb_found() -> None:
    """A host job's asked-for cancel is a ``CancelRequest``; ``Canceled`` is the verb's result."""
    assert [path for path, _, line in _lines() if re.match(r"class Canceled\b", line)] == ["tao_data_io/verbs.py"]
