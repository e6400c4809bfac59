"""Verb parsers whose ``--help`` ends with numbered examples, the way s5cmd's does.

Why: the flags say what is possible; an example says what to type. Each verb shows two or three
complete command lines for its common cases, kept as written (RawDescriptionHelpFormatter).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

#: One example: what it does (a sentence) and the command line that does it.
Example = tuple[str, str]


def examples_text(examples: Sequence[Example]) -> str:
    """``Examples:`` and, for each, its number and sentence over its ``> command`` line."""
    lines = ["Examples:"]
    for number, (what, command) in enumerate(examples, 1):
        lines += [f"  {number}. {what}", f"     > {command}"]
    return "\n".join(lines) + "\n"


def add_verb(verbs: Any, name: str, *, help: str, examples: Sequence[Example],  # noqa: A002 - argparse's word
             epilog: str = "") -> argparse.ArgumentParser:
    """Add subcommand ``name`` to ``verbs``; its ``--help`` ends with ``epilog`` then the examples."""
    text = examples_text(examples)
    return verbs.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".",
                            epilog=f"{epilog}\n{text}" if epilog else text,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
