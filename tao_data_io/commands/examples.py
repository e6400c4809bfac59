"""Verb parsers whose ``--help`` ends with numbered examples, the way s5cmd's does.

Why: the flags say what is possible; an example says what to type. Each verb shows two or three
complete command lines for its common cases, kept as written (RawDescriptionHelpFormatter). The
examples are data — ``examples.toml`` beside this module, keyed by the verb as typed
(``sync``, ``record mark``) — so the verb modules hold flags and behaviour only.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

#: One example: what it does (a sentence) and the command line that does it.
Example = tuple[str, str]
CATALOGUE = Path(__file__).with_name("examples.toml")


def examples_text(examples: Sequence[Example]) -> str:
    """``Examples:`` and, for each, its number and sentence over its ``> command`` line."""
    lines = ["Examples:"]
    for number, (what, command) in enumerate(examples, 1):
        lines += [f"  {number}. {what}", f"     > {command}"]
    return "\n".join(lines) + "\n"


@cache
def catalogue() -> dict[str, list[Example]]:
    """Every verb's examples, from ``examples.toml``."""
    with CATALOGUE.open("rb") as handle:
        data = tomllib.load(handle)
    return {verb: [(entry["what"], entry["command"]) for entry in entries] for verb, entries in data.items()}


def add_verb(verbs: Any, name: str, *, help: str, epilog: str = "") -> argparse.ArgumentParser:  # noqa: A002
    """Add subcommand ``name`` to ``verbs``; its ``--help`` ends with ``epilog`` then its examples."""
    parent = verbs._prog_prefix.partition(" ")[2]  # "tao-data-io record" → "record"
    text = examples_text(catalogue().get(f"{parent} {name}".strip(), []))
    return verbs.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".",
                            epilog=f"{epilog}\n{text}" if epilog else text,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
