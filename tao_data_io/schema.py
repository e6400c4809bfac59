"""The strict pydantic base every contract model uses, and the one way to turn a validation
error into a message.

Why one base: the request, the staging map, the launch plan and the job record are contracts
between steps and between machines; an unknown field is a typo or a version skew, never
something to ignore, and a contract object must not change after it is made. Why one
formatter: validation errors reach terminals, logs and the Prefect UI, and a value that failed
validation can be a secret someone pasted into the wrong field — so pydantic's copy of the input
is never echoed. Our own validators name the offending value themselves where it is safe to (a
path, a name), and every message is masked by the credential redactor before it is shown.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, model_validator


class Strict(BaseModel):
    """Unknown fields refused (with the field that was probably meant), instances frozen, inputs
    never echoed in errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields)
            for key in data:
                if isinstance(key, str) and key not in known:
                    close = difflib.get_close_matches(key, sorted(known), n=1)
                    hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(sorted(known))}"
                    raise ValueError(f"unknown field {key!r}: {hint}")
        return data


def _absolute(value: str) -> str:
    # Relative would resolve against whatever directory a process happens to start in (a flow
    # run's, a later CLI call's), not the one the setting was written for.
    if not Path(value).expanduser().is_absolute():
        raise ValueError(f"{value!r} is not absolute: give an absolute path (or ~/…)")
    return value


#: A directory setting on the host that uses it: absolute, or in a home (``~/…``).
AbsolutePath = Annotated[str, AfterValidator(_absolute)]


def describe_validation_error(exc: ValidationError, what: str, *, whole: str | None = "request") -> str:
    """``<what>:`` then one ``field.path: problem`` line per error (``<whole>:`` for a rule about the
    whole document, or the problem alone when ``whole`` is None); never the input value."""
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        cause = (error.get("ctx") or {}).get("error")
        problem = str(cause) if isinstance(cause, Exception) else str(error["msg"]).removeprefix("Value error, ")
        where = field_path(error["loc"]) or whole
        lines.append(f"{where}: {problem}" if where else problem)
    return f"{what}:\n  " + "\n  ".join(lines)


def field_path(location: tuple[int | str, ...]) -> str:
    """pydantic's ``("inputs", 1, "target")`` as people write it: ``inputs[1].target``."""
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text
