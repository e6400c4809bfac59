"""Verb parsers whose ``--help`` ends with numbered examples, the way s5cmd's does.

Why: the flags say what is possible; an example says what to type. Each verb shows two or three
complete command lines for its common cases, kept as written (RawDescriptionHelpFormatter). The
examples are data — ``examples.toml`` beside this module, keyed by the verb as typed
(``sync``, ``record mark``) — so the verb modules hold flags and behaviour only. The catalogue
is read when a help is shown, not when a verb is added: a command line that only runs needs
none of it (tomllib and the file are ~10 ms of a process that resyncs in a few hundred).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import cache
from pathlib import Path

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
    import tomllib

    with CATALOGUE.open("rb") as handle:
        data = tomllib.load(handle)
    return {verb: [(entry["what"], entry["command"]) for entry in entries] for verb, entries in data.items()}


def add_verb(verbs: argparse._SubParsersAction[argparse.ArgumentParser], name: str, *,
             help: str,  # noqa: A002 - argparse's own keyword, passed on
             epilog: str = "") -> argparse.ArgumentParser:
    """Add subcommand ``name`` to ``verbs``; its ``--help`` ends with ``epilog`` then its examples
    (see :func:`verb_examples`)."""
    return verbs.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".", epilog=epilog or None,
                            formatter_class=argparse.RawDescriptionHelpFormatter)


def verb_examples(prog: str) -> str:
    """The examples block that ends the help of the verb parser named ``prog`` (``tao-data-io
    record open`` → the catalogue's ``record open``), or "" for a parser without examples."""
    examples = catalogue().get(prog.partition(" ")[2], [])
    return "\n" + examples_text(examples) if examples else ""
