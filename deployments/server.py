"""Prefect's server as the demo starts it (``python -m deployments.server start --host … --port
…``: the arguments of ``prefect server start``), serving the blocks' logo at
:data:`LOGO_PATH` (so a UI without the internet shows it, once
``$TAO_DATA_IO_LOGO_URL`` names it where the blocks are registered), and with one check Prefect
does not make: a block document that the UI or the API asks it to save (``POST
/api/block_documents/``, ``PATCH /api/block_documents/<id>``) is refused, 422, when a field of a
credential block that must hold a variable's NAME holds anything else — a pasted key
(:func:`blocks.credentials.refused_name_fields`); and the form's own check before it saves (``POST
/api/ui/schemas/validate``) is answered with that field's error, so the form shows it beside the
field.

Why here: Prefect's server stores a block document's data without checking it against its
block's schema, and the v2 UI's block form "validates" the values against themselves (it sends
them as the schema: nothing to answer but "valid"), so a key pasted into a credential block's
field was saved, shown on the block's page, and kept in the ``block-document.created`` event's
payload. Refused before Prefect sees the request, it is in neither; the refusal names the field,
never the value.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: A save of a block document: its creation, or an update of one.
_SAVES = {"POST": re.compile(r"(?:.*)/api/block_documents/?"),
          "PATCH": re.compile(r"(?:.*)/api/block_documents/[0-9A-Fa-f-]{36}/?")}
#: Where the blocks' logo is served (``$TAO_DATA_IO_LOGO_URL`` names it where they are registered).
LOGO_PATH = "/tao-data-io/logo.png"
#: The run and block forms' check of their values, before they save.
_VALIDATE = re.compile(r"(?:.*)/api/ui/schemas/validate/?")


class RefusePastedCredentials:
    """ASGI middleware: reads the body of a block document's save, and answers 422 without
    calling the app when :func:`refused_name_fields` refuses its ``data``; the same for a form's
    validation of its ``values``, answered as Prefect answers it (``build_error_obj``: 200, each
    refused field's error, not valid). Any other request, and an accepted one (its body handed on
    as it came), goes to the app untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method", "") if scope["type"] == "http" else ""
        saves = _SAVES.get(method)
        validates = method == "POST" and _VALIDATE.fullmatch(scope["path"]) is not None
        if not validates and (saves is None or not saves.fullmatch(scope["path"])):
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        refused = _refused(body, "values" if validates else "data")
        if refused and validates:
            await _answer(send, 200, {"errors": [{"property": name, "errors": [why]} for name, why in refused.items()],
                                      "valid": False})
            return
        if refused:
            await _answer(send, 422, {"detail": "the block was not saved: " + "; ".join(
                f"{name} {why}" for name, why in refused.items())})
            return
        handed = False

        async def replay() -> Message:
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class ServeLogo:
    """ASGI middleware: answers ``GET``/``HEAD`` of :data:`LOGO_PATH` with the blocks' logo; any
    other request goes to the app untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != LOGO_PATH or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        from blocks.presentation import LOGO_FILE  # the blocks, in this process only once the logo is asked for

        logo = LOGO_FILE.read_bytes()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"image/png"), (b"content-length", str(len(logo)).encode()),
                                (b"cache-control", b"max-age=3600")]})
        await send({"type": "http.response.body", "body": logo if scope["method"] == "GET" else b""})


async def _answer(send: Send, status: int, content: dict[str, Any]) -> None:
    answer = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


def _refused(body: bytes, key: str) -> dict[str, str]:
    """What :func:`refused_name_fields` refuses in the body's ``key``."""
    from blocks.credentials import refused_name_fields

    try:
        sent = json.loads(body)
    except ValueError:
        return {}  # Prefect's own answer (422) says what is wrong with it
    return refused_name_fields(sent.get(key)) if isinstance(sent, dict) else {}


def _with_the_check(create_app: Callable[..., Any]) -> Callable[..., Any]:
    def create(*args: Any, **kwargs: Any) -> Any:
        app = create_app(*args, **kwargs)
        if not getattr(app.state, "refuses_pasted_credentials", False):  # an app is cached and made again
            app.add_middleware(RefusePastedCredentials)
            app.add_middleware(ServeLogo)
            app.state.refuses_pasted_credentials = True
        return app

    return create


def main(argv: list[str]) -> None:
    """``prefect server <argv>``, its app made with the check (one worker process: the app is
    made in this one)."""
    import prefect.server.api.server as server
    from prefect.cli import app

    server.create_app = _with_the_check(server.create_app)
    sys.argv = ["prefect", "server", *argv]  # what Prefect's CLI reads
    app()


if __name__ == "__main__":
    main(sys.argv[1:])
