"""``tao-data-io``: command-line verbs over the Prefect-free core.

Exit codes: 0 success; 2 bad input (a message on stderr starting ``error:`` that names the bad
value and the fix — a path the operating system refused included); 1 failure (a summary of what
failed); 141 when whoever reads stdout stopped reading (``| head``), quietly, as a shell reports a
command ended by SIGPIPE. Every line printed passes through the credential redactor and has its
control characters escaped. The verbs live in :mod:`tao_data_io.commands`, one module per area.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .commands import MODULES, module
from .commands.examples import Example, examples_text, verb_examples
from .commands.target import SETTING
from .console import Console
from .redaction import RedactingFilter
from .errors import UNWRITABLE_EXIT, USAGE_EXIT, UnwritableError, UsageError, os_error_message

#: The exit status of a command whose output was cut off by its reader (128 + SIGPIPE).
#: The shell's code for a command ended by Ctrl-C (128 + SIGINT).
INTERRUPTED = 130
CLOSED_OUTPUT = 141


_EXAMPLES: list[Example] = [
    ("Download a dataset prefix; a rerun moves only what changed",
     "tao-data-io sync s3://bucket/datasets/coco/ /data/coco"),
    ("Stage every input of a job request", "tao-data-io stage --request job.yaml --staging-dir /mnt/job-42"),
    ("Upload a job's new results while it runs", "tao-data-io resync --job-id dino-train-coco --results-dir /results"),
]


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line raises UsageError (exit 2, ``error:`` line) instead of
    printing usage and exiting from deep inside the parser; and a part of a verb's parser can be
    built once the verb is used (:func:`~tao_data_io.commands.target.when_used`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deferred: list[Callable[[], None]] = []

    def defer(self, build: Callable[[], None]) -> None:
        self._deferred.append(build)

    def _complete(self) -> None:
        if self._deferred:
            while self._deferred:
                self._deferred.pop(0)()
            _attach_flag_names(self)  # its new flags too

    def parse_known_args(  # type: ignore[override]  # typeshed's overloads by namespace; this forwards either
            self, args: Sequence[str] | None = None,
            namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._complete()
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()

    def format_help(self) -> str:
        self._complete()
        return super().format_help() + verb_examples(self.prog)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser, every verb's. What costs — a verb's flags made from the
    backends' settings models — waits until that verb is used
    (:func:`~tao_data_io.commands.target.when_used`); the rest of all ten is ~10 ms, under what a
    map of verbs to modules, registering only the verb named, would have to save (issue 45's
    rule: 30 ms or 5 % on a benchmark case; ``bench/README.md``, the start-up paths)."""
    parser = _Parser(prog="tao-data-io", description="Get data to and from the compute container of TAO jobs.",
                     epilog=examples_text(_EXAMPLES) + "\nEach verb's --help has its flags and more examples.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="progress bar on stderr (auto: when stderr is a terminal)")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for name in MODULES:
        module(name).register(verbs)
    _attach_flag_names(parser)
    return parser


def _attach_flag_names(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command the map parameter → flag of its own options, so a core message
    that names a parameter (``job_id 'x'``) reaches the terminal naming the flag (``--job-id 'x'``)."""
    # A yes/no setting by its yes (--allow-network).
    flags = {action.dest.removeprefix(SETTING): long[-1] for action in parser._actions
             if (long := [flag for flag in action.option_strings
                          if flag.startswith("--") and not flag.startswith("--no-")])}
    parser.set_defaults(flag_names=flags)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                _attach_flag_names(sub)


def in_cli_terms(message: str, flags: dict[str, str]) -> str:
    """``message`` with each parameter name the verb has a flag for replaced by that flag, where
    the message quotes the parameter's value (``job_id 'x'`` → ``--job-id 'x'``) or names a
    switch in parentheses (``(force)`` → ``(--force)``)."""
    for dest, flag in flags.items():
        message = re.sub(rf"(?<![\w.\-\[]){re.escape(dest)}(?= ['\"]|\))", flag, message)
    return message


def main(argv: Sequence[str] | None = None) -> int:
    console = Console()
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter(console.redact))  # library warnings pass the same redactor
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s", handlers=[handler])
    flags: dict[str, str] = {}
    try:
        arguments = sys.argv[1:] if argv is None else list(argv)
        _refuse_empty_arguments(arguments)
        args = build_parser().parse_args(arguments)
        flags = args.flag_names
        console.progress_mode = args.progress
        return int(args.run(args, console))
    except UsageError as exc:
        console.err(f"error: {in_cli_terms(str(exc), flags)}")
        return UNWRITABLE_EXIT if isinstance(exc, UnwritableError) else USAGE_EXIT
    except BrokenPipeError:
        _discard_stdout()
        return CLOSED_OUTPUT
    except OSError as exc:
        if exc.filename is None and exc.filename2 is None:  # not about a path (a dropped connection)
            return _unexpected(console, exc)
        console.err(f"error: {in_cli_terms(os_error_message(exc), flags)}")
        return USAGE_EXIT
    except KeyboardInterrupt:
        console.err("error: interrupted; complete files were kept and nothing is half-written under a final name "
                    "— run the same command again to finish")
        return INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the last line of defence: redact, then report
        return _unexpected(console, exc)


def console_main() -> NoReturn:
    """The ``tao-data-io`` command: :func:`main`, then exit without a last garbage collection.

    Why: the process ends anyway, and the interpreter's final collections walk every object the
    imports made (pydantic's schemas above all) — about 20 ms of every run, which a resync that
    a schedule or a sidecar starts every few minutes pays each time. Frozen objects are skipped;
    everything else of the shutdown (flushes, atexit) still runs.

    SIGTERM ends a verb as Ctrl-C does: what it holds is let go on the way out (an upload's lease
    on S3 deleted, not left to expire), complete files are kept. Who sends it: the results
    sidecar ending the resync in flight to start its final upload, a pod being deleted, a
    scheduler's cancel. Python's default would end the process where it stands."""
    signal.signal(signal.SIGTERM, _interrupt)
    code = main()
    gc.freeze()
    sys.exit(code)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _refuse_empty_arguments(argv: Sequence[str]) -> None:
    """No option or operand takes an empty value, and an empty one is almost always an unset
    shell variable: ``--results-dir "$RESULTS"`` would otherwise mean the current directory."""
    for index, value in enumerate(argv):
        if value == "":
            after = f" after {argv[index - 1]}" if index and argv[index - 1].startswith("-") else ""
            raise UsageError(f"argument {index + 1}{after} is empty (an unset variable?); give a value — an empty "
                             "path would mean the current directory")


def _unexpected(console: Console, exc: Exception) -> int:
    console.err(f"error: {type(exc).__name__}: {exc}")
    return 1


def _discard_stdout() -> None:
    """The reader of stdout went away (``| head``): there is no one left to tell. Point stdout at
    /dev/null so the interpreter's final flush does not print a second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    console_main()
