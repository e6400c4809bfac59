"""Where a job runs, from the command line: ``--backend NAME``, ``--target FILE`` (the backend's
settings as YAML or JSON, the same mapping a target block's ``settings`` holds) and one flag per
setting of every backend, made from the settings models the registry finds.

Why made, not written: a backend's settings are declared once (its model); a flag written by hand
per setting reached 7 of the Kubernetes backend's 26, and a new backend would have needed its own
group here. A scalar setting is a flag (``pvc_claim`` → ``--pvc-claim V``; a yes/no one is
``--allow-network``/``--no-allow-network``); a list of names is a repeated flag; a map of names is
a repeated ``--labels KEY=VALUE``; anything deeper (Kubernetes tolerations) is in ``--target``.
The model checks every value, so a refusal names the field (shown as its flag) and the fix.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import UsageError
from ..reporting import said_list

if TYPE_CHECKING:
    from ..launch.declaration import Declaration

#: The backend a command line that names none runs on: the embedded default.
DEFAULT_BACKEND = "local"


def when_used(sub: argparse.ArgumentParser, build: Callable[[], None]) -> None:
    """Run ``build`` (which adds flags to ``sub``) once ``sub`` is used — its arguments parsed or
    its help shown — when ``sub`` can wait (the CLI's parsers: ``defer``), else now.

    Why: a backend's flags are made from the backends' settings models, and the registry with
    those models is ~200 ms of imports. The top-level ``--help`` (and a mistyped verb) builds
    every verb's parser to list the verbs, none of whose flags it shows; it took 0.23–0.29 s
    where it had taken 0.06 (``bench/README.md``, the command's start)."""
    later = getattr(sub, "defer", None)
    if later is None:
        build()
    else:
        later(build)


def add_target_options(sub: argparse.ArgumentParser, *, default: str | None = DEFAULT_BACKEND) -> None:
    """``--backend``, ``--target`` and a flag per setting of every backend, on ``sub`` (once used:
    :func:`when_used`)."""

    def build() -> None:
        from ..backends import declarations

        known = declarations()
        sub.add_argument("--backend", choices=tuple(known), default=default,
                         help=f"where the job runs (default: {default})" if default else "where the job runs")
        add_settings_flags(sub, known.values(), heading="{name} settings (with --backend {name})")

    when_used(sub, build)


def add_settings_flags(sub: argparse.ArgumentParser, declarations: Iterable[Declaration], *,
                       heading: str = "{name} settings") -> None:
    """``--target`` and a flag per setting of each of ``declarations`` (one group each), on ``sub``."""
    sub.add_argument("--target", type=Path, metavar="FILE",
                     help="the backend's settings as YAML or JSON (what a target block's settings hold); a flag "
                          "below wins over the file")
    seen: set[str] = set()
    for one in declarations:
        group = sub.add_argument_group(heading.format(name=one.name) + "; the target block's fields")
        owned = []
        for field, info in one.settings.model_fields.items():
            if field not in seen:  # one flag for a setting two backends share
                seen.add(field)
                if not _add_flag(group, field, info.annotation, info.description or ""):
                    owned.append(field)
        if owned:
            group.description = said_list(owned, "and") + ": in --target only (the command has a flag of that name)"


#: The prefix of a setting's ``dest``: a setting called ``run`` or ``json`` must never be read as
#: the verb's own value of that name.
SETTING = "setting:"


def _add_flag(group: Any, field: str, annotation: Any, description: str) -> bool:
    """Add ``field``'s flag to ``group``; False where the command already has a flag of that name."""
    flag, dest = "--" + field.replace("_", "-"), SETTING + field
    help_text = description.split(". ")[0].rstrip(".")
    kind = _kind(annotation)
    try:
        if kind == "bool":
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif kind == "list":
            group.add_argument(flag, dest=dest, action="append", metavar="V", help=help_text + " (repeat for several)")
        elif kind == "map":
            group.add_argument(flag, dest=dest, action="append", metavar="KEY=VALUE", type=_pair,
                               help=help_text + " (repeat for several)")
        elif kind == "scalar":
            choices = _literal_choices(annotation)
            group.add_argument(flag, dest=dest, choices=choices or None,
                               metavar="|".join(choices) if choices else field.upper(), help=help_text)
        # "deep": only in --target
    except argparse.ArgumentError:  # a flag the verb has (--workdir, --json): the setting is in --target
        return False
    return True


def _kind(annotation: Any) -> str:
    """How a setting of this type is given on a command line."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _kind(args[0])
    if origin is typing.Annotated:
        return _kind(args[0])
    if annotation is bool:
        return "bool"
    if origin is list:
        return "list" if all(_kind(arg) == "scalar" for arg in args) else "deep"
    if origin is dict:
        return "map" if all(_kind(arg) == "scalar" for arg in args) else "deep"
    if annotation in (str, int, float) or origin is Literal:
        return "scalar"
    return "deep"


def _literal_choices(annotation: Any) -> list[str]:
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) is Literal:
        return [str(arg) for arg in args]
    return _literal_choices(args[0]) if len(args) == 1 else []


def _pair(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def target_settings(args: argparse.Namespace, *, backend: str | None = None,
                    workdir: Path | None = None) -> dict[str, Any]:
    """The settings the command line gives ``backend`` (default ``--backend``): those of
    ``--target``, then its flags over them, then what ``--workdir`` implies for it. A flag of a
    setting this backend does not have is refused, naming the settings it has."""
    from ..backends import declaration_of, declarations

    name = backend or args.backend
    model = declaration_of(name).settings
    values: dict[str, Any] = dict(_target_file(args.target)) if getattr(args, "target", None) else {}
    for field in {field for other in declarations().values() for field in other.settings.model_fields}:
        given = getattr(args, SETTING + field, None)
        if given is None:
            continue
        if field not in model.model_fields:
            flags = ", ".join("--" + known.replace("_", "-") for known in model.model_fields)
            raise UsageError(f"--{field.replace('_', '-')} is not a setting of the {name} backend: its settings are "
                             f"{flags} (or give --backend for the backend it belongs to)")
        values[field] = dict(given) if _kind(model.model_fields[field].annotation) == "map" else given
    if workdir is not None:
        for field, value in model.from_workdir(workdir).items():
            values.setdefault(field, value)
    return values


def _target_file(path: Path) -> Mapping[str, Any]:
    from ..documents import load_document, read_document

    what = f"--target {str(path)!r}"
    document = load_document(read_document(path, what=what), "json" if path.suffix == ".json" else "yaml", what=what)
    if not isinstance(document, Mapping):
        raise UsageError(f"--target {str(path)!r} must be a mapping of the backend's settings (field: value), "
                         f"not a {type(document).__name__}")
    return document
