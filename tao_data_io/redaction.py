"""Redaction and leak detection: credential values kept out of every output, and refused where
they must never be.

Why a module of its own: most of the package wants this and not the credentials — a log filter, a
command's error, a job's log followed look by look, a request or record checked for "names and
paths only" — and none of them reads an S3 setting. A value is secret when its variable's name
looks like a credential's, when the variable is forwarded to a job, when it is the userinfo of a
URL, or when it has a well-known credential's shape wherever it came from. There is exactly one
place that knows which values must be masked: here. Reading the credentials themselves is
:mod:`tao_data_io.credentials`'.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from .errors import TaoDataIOError, is_retryable

#: Names whose values are secrets wherever they appear. Anything matching
#: :data:`_SECRET_NAME_PATTERN` is treated as secret too.
SECRET_NAMES: frozenset[str] = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "ACCESS_KEY",
        "SECRET_KEY",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "NGC_KEY",
        "NGC_API_KEY",
    }
)
#: Words that make a variable's name a credential's, in any case.
SECRET_NAME_WORDS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY")
_SECRET_NAME_PATTERN = re.compile("|".join(SECRET_NAME_WORDS), re.I)
#: The userinfo of a URL (``scheme://user:password@``, up to its last ``@`` before the path):
#: a credential in any URL — an endpoint from any variable, or one quoted back by a library. The
#: scheme starts after any character a scheme cannot hold (not ``\b``: ``key_https://…`` is a URL).
_USERINFO = re.compile(r"(?<![a-z0-9+.\-])([a-z][a-z0-9+.\-]*://)[^/\s?#]*@", re.I)
#: What a masked userinfo reads as.
USERINFO_MASK = "***USERINFO***"
#: The most of a URL that may still be writing its userinfo (``scheme://user:pa``) a
#: :class:`StreamRedactor` holds back at the end of a piece: a real one is far shorter, and a longer
#: run of what an authority may hold is shown rather than held until its line ends.
_HELD_URL_CHARS = 4096
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_AUTHORITY_END = re.compile(r"[/\s?#]")
#: Values shorter than this are not masked: masking "1" or "yes" would shred every message
#: while protecting nothing.
_MIN_SECRET_LENGTH = 6
#: The shortest value of a plain-named forwarded variable that a request may not hold.
_MIN_FORWARDED_LENGTH = 12


def credential_value_fields(value: Any, environ: Mapping[str, str] | None = None, *, where: str = "",
                            secret_names: Iterable[str] = ()) -> list[str]:
    """The field paths (``spec.train.note``, ``environment.LR``) of every string in a JSON-shaped
    ``value`` — dict keys included — that holds the value of a credential variable of ``environ``
    (one whose name looks like a credential's, or one of ``secret_names``: a request's
    ``forward_env``, whatever its variables are called). The one check behind "names and paths
    only" for requests, plans and job records; the paths are masked too (a dict key can be the
    secret itself), and no value is ever returned."""
    env = os.environ if environ is None else environ
    # A forwarded variable with a plain name may hold an ordinary word (WANDB_ENTITY=nvidia),
    # which refusing wherever it appears would make every request naming it fail: only values
    # as long as a credential is count here (a secret-looking name's value counts as always).
    forwarded = [name for name in secret_names if len(env.get(name) or "") >= _MIN_FORWARDED_LENGTH]
    redact = Redactor(env, secret_names=forwarded)
    return _fields_where(value, lambda text: redact(text) != text, redact, where)


#: The shapes of well-known credentials, whoever's they are: an AWS access key id, a Hugging Face
#: token, an NVIDIA (NGC) personal key, a GitHub token, a URL's ``user:password@``. (An AWS secret
#: key or a legacy NGC key has no shape of its own: only the worker's values catch those.)
#: Written once for both engines that apply it — Python's ``re`` and the ECMAScript of a JSON
#: Schema ``pattern`` (what the Prefect server and its UI check a run's parameters with) — so
#: only syntax the two share. The edges are ASCII lookarounds, not ``\b``: Python's ``\b`` is
#: Unicode-aware and JavaScript's is not, and an underscore (``KEY_AKIA…``) must not hide a key.
CREDENTIAL_SHAPES = ("(?<![A-Za-z0-9])(?:(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}"
                     "|hf_[A-Za-z0-9]{30,}|nvapi-[A-Za-z0-9_-]{30,}"
                     "|ghp_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{60,})(?![A-Za-z0-9])"
                     r"|[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#@:]*:[^/\s?#@]*@")
_CREDENTIAL_SHAPE = re.compile(CREDENTIAL_SHAPES)
#: What a field holding a credential shape is shown as: the shape's kind, never the text.
_SHAPE_MASK = "***CREDENTIAL***"


def credential_shape_fields(value: Any, *, where: str = "") -> list[str]:
    """The field paths of every string in a JSON-shaped ``value`` (dict keys included) that holds
    a well-known credential's shape (:data:`CREDENTIAL_SHAPES`), wherever it came from: a key
    pasted into a request is refused even when this host does not hold it."""
    return _fields_where(value, lambda text: _CREDENTIAL_SHAPE.search(text) is not None, mask_credential_shapes,
                         where)


def mask_credential_shapes(text: str) -> str:
    """``text`` with every well-known credential's shape in it masked (and every URL's userinfo)."""
    return _CREDENTIAL_SHAPE.sub(_SHAPE_MASK, mask_userinfo(text))


def _fields_where(value: Any, holds: Callable[[str], bool], shown: Callable[[str], str], where: str) -> list[str]:
    found: list[str] = []
    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if holds(item):
                found.append(shown(path) or "(value)")
        elif isinstance(item, Mapping):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                stack.append((child_path, child))
                if isinstance(key, str) and holds(key):
                    found.append(shown(child_path))
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}[{index}]", child) for index, child in enumerate(item))
    return sorted(set(found))


def mask_userinfo(text: str) -> str:
    """``text`` with the userinfo of every URL in it masked: the half of :class:`Redactor` that
    needs no environment, for messages the core builds around an endpoint (they may end up where
    no redactor runs, such as an orchestrator's UI) and for ``repr``."""
    return _USERINFO.sub(lambda m: f"{m.group(1)}{USERINFO_MASK}@", text) if "://" in text else text


def _userinfo_parts(value: str) -> list[str]:
    """The userinfo and password of ``value`` if it is a URL that has them, raw and decoded."""
    if "://" not in value or "@" not in value:
        return []
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return []
    userinfo = parts.netloc.rpartition("@")[0]
    found = [userinfo, unquote(userinfo)] if userinfo else []
    if parts.password:
        found += [parts.password, unquote(parts.password)]
    return found


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name denotes a credential."""
    return name in SECRET_NAMES or bool(_SECRET_NAME_PATTERN.search(name))


#: What a reader puts where it left bytes of a stream out (the dropped middle of a capped log, the
#: start of a tail inside one line): a secret there is cut in two, and each half alone is nothing a
#: mask of the whole value knows — so what stands right beside a cut and could be half of a secret
#: is masked too (:meth:`Redactor.redact`).
CUT_MARK = "[tao-data-io cut: "
_CUT = re.compile(re.escape(CUT_MARK) + r"[^\]\n]*\]")
#: The shortest half of a secret masked beside a cut: a few characters in common with a secret's
#: start or end are everywhere, and three reveal nothing.
_MIN_HALF = 4


def cut_note(what: str) -> str:
    """The line a reader puts where it left bytes out, saying ``what`` (see :data:`CUT_MARK`)."""
    return f"{CUT_MARK}{what}]"


class Redactor:
    """Masks every credential value found in the environment, and the userinfo of every URL.

    Built from a snapshot of the environment, it replaces each secret value with ``***NAME***``
    so a masked message still says *which* credential was involved. Longer values are replaced
    first so a secret that contains another is masked whole. A value is secret when its
    variable's name looks like a credential's, when the variable is one of ``secret_names`` (a
    job's ``forward_env``: whatever it is called, a forwarded variable is a credential), or when
    it is one of the ``extra`` values (credentials read elsewhere, such as for a per-job Secret).

    A URL can carry a password in its userinfo (``https://user:password@host``), in any variable
    (``AWS_ENDPOINT_URL``, ``HF_ENDPOINT``, ``NGC_API_URL``) and in any message a library builds
    from it. So the userinfo of every URL in a text is masked (``https://***USERINFO***@host``),
    and the userinfo and password of every URL-valued variable are secrets of that variable too,
    raw and percent-decoded, so they are masked wherever they appear on their own.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None, *,
                 secret_names: Iterable[str] = ()) -> None:
        env = os.environ if environ is None else environ
        always = {*secret_names, *(extra or {})}
        secrets: dict[str, str] = {}
        for name, value in {**env, **(extra or {})}.items():
            if not value:
                continue
            candidates = [value] if name in always or is_secret_name(name) else []
            candidates += _userinfo_parts(value)
            for candidate in candidates:
                if len(candidate) >= _MIN_SECRET_LENGTH:
                    for form in _quoted_forms(candidate):
                        secrets.setdefault(form, name)
        self._forms = sorted(secrets, key=len, reverse=True)
        self._names = secrets
        self._pattern = re.compile("|".join(re.escape(v) for v in self._forms)) if self._forms else None

    def redact(self, text: str) -> str:
        """Return ``text`` with every URL's userinfo and every known secret value masked."""
        if not text:
            return text
        text = mask_userinfo(text)
        if self._pattern is None:
            return text
        text = self._pattern.sub(lambda m: f"***{self._names[m.group(0)]}***", text)
        return self._halves_beside_cuts(text) if CUT_MARK in text else text

    def _halves_beside_cuts(self, text: str) -> str:
        """``text`` with the end of a secret's start right before each cut, and the start of a
        secret's end right after it (a line break between allowed), masked."""
        for cut in reversed(list(_CUT.finditer(text))):
            after = cut.end() + (1 if text[cut.end():cut.end() + 1] == "\n" else 0)
            tail = self._half(text[after:after + max(map(len, self._forms))], at_start=True)
            if tail is not None:
                text = text[:after] + f"***{tail[1]}***" + text[after + tail[0]:]
            before = cut.start() - (1 if text[cut.start() - 1:cut.start()] == "\n" else 0)
            head = self._half(text[max(0, before - max(map(len, self._forms))):before], at_start=False)
            if head is not None:
                text = text[:before - head[0]] + f"***{head[1]}***" + text[before:]
        return text

    def _half(self, text: str, *, at_start: bool) -> tuple[int, str] | None:
        """The longest part of a secret's end at ``text``'s start (``at_start``), or of a secret's
        start at its end, of :data:`_MIN_HALF` characters or more: (its length, the secret's name)."""
        found: tuple[int, str] | None = None
        for form in self._forms:
            for length in range(min(len(form) - 1, len(text)), _MIN_HALF - 1, -1):
                if (text.startswith(form[-length:]) if at_start else text.endswith(form[:length])):
                    if found is None or length > found[0]:
                        found = (length, self._names[form])
                    break
        return found

    def __call__(self, text: str) -> str:
        return self.redact(text)

    def settled(self, text: str) -> int:
        """How much of ``text`` — the newest part of a stream, cut anywhere — masks the same whatever
        comes after it: up to where its end could begin a secret value, or a URL that may still be
        writing its userinfo, that the next part completes, and never inside one it holds whole."""
        cut = min(self._secret_begun(text), _url_begun(text))
        patterns = [pattern for pattern in (_USERINFO, self._pattern) if pattern is not None]
        while True:
            straddling = [match.start() for pattern in patterns for match in pattern.finditer(text)
                          if match.start() < cut < match.end()]
            if not straddling:
                return cut
            cut = min(straddling)

    def _secret_begun(self, text: str) -> int:
        """Where the longest end of ``text`` that begins a secret value starts (its length: none does)."""
        begun = len(text)
        last = text[-1:]
        for form in self._forms:
            for length in range(min(len(form) - 1, len(text)), 0, -1):
                if form[length - 1] == last and text.endswith(form[:length]):
                    begun = min(begun, len(text) - length)
                    break
        return begun


def _url_begun(text: str) -> int:
    """Where a URL that may still be writing its userinfo starts at the end of ``text`` (its length:
    none): a scheme, ``scheme:``, ``scheme:/``, or ``scheme://`` with nothing yet that ends the
    authority — within the last :data:`_HELD_URL_CHARS` characters."""
    window = max(0, len(text) - _HELD_URL_CHARS)
    separator = text.rfind("://", window)
    if separator >= 0 and _AUTHORITY_END.search(text, separator + 3) is None:
        start = _scheme_start(text, separator, window)
        if start < separator:
            return start
        # a bare "://" (no scheme before it) starts no URL, but the end may still begin one
    scheme_end = len(text) - (2 if text.endswith(":/") else 1 if text.endswith(":") else 0)
    start = _scheme_start(text, scheme_end, window)
    return start if start < scheme_end else len(text)


def _scheme_start(text: str, scheme_end: int, window: int) -> int:
    """Where the scheme that ends at ``scheme_end`` starts (``scheme_end``: there is none)."""
    start = scheme_end
    while start > window and text[start - 1] in _SCHEME_CHARS:
        start -= 1
    return start


class StreamRedactor:
    """A :class:`Redactor` for a text that arrives in pieces cut anywhere: a log followed look by
    look, where a look ends inside a line longer than it takes.

    Why: masked piece by piece, a secret that straddles a cut is shown as two unmasked halves. So
    the end of each piece that could begin a secret value (at most the longest one but a
    character) or a URL's userinfo is held back and masked with what follows; put together, what
    this shows is the whole text masked at once. A watcher that stops calls :meth:`end`."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._held = ""

    def feed(self, piece: str) -> str:
        """What of the stream so far can be shown now, masked."""
        text = self._held + piece
        cut = self.redactor.settled(text)
        self._held = text[cut:]
        return self.redactor(text[:cut])

    def end(self) -> str:
        """The rest, masked: the stream has ended, or its watcher stops."""
        rest, self._held = self._held, ""
        return self.redactor(rest)


def _quoted_forms(value: str) -> set[str]:
    """``value`` as messages may quote it: verbatim, inside ``repr()`` (a backslash doubled, a
    quote or a control character escaped — every ``{value!r}`` of an error) and inside JSON."""
    return {value, repr(value)[1:-1], json.dumps(value)[1:-1]}


class MaskedError(TaoDataIOError):
    """An exception whose text held a credential value, re-raised with that value masked.

    Why: an orchestrator stores a failed run's exception text where no log filter reaches (a
    state message in its database, a persisted result). The original's type is named in the
    text, and whether a retry can help is kept (:func:`~tao_data_io.errors.is_retryable`)."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)  # rebuilt from its message alone (a stored result), it is not retryable
        self.retryable = retryable


def masked(exc: BaseException, redactor: Redactor) -> BaseException:
    """``exc`` with every credential value in its text masked: our own errors (whose text is their
    message) in place, keeping their type; any other as a :class:`MaskedError` saying the same."""
    text = str(exc)
    clean = redactor(text)
    if clean == text:
        return exc
    if isinstance(exc, TaoDataIOError):
        exc.args = (clean,)
        return exc
    return MaskedError(f"{type(exc).__name__}: {clean}", retryable=is_retryable(exc))


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets in every record passing through a handler or logger:
    the message, and the text of an attached exception (its traceback is formatted here, masked,
    and cached where formatters look for it)."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or Redactor()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        record.msg = self.redactor.redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.redact(record.exc_text)
        return True
