"""The one parser of the remote URIs a job request can name — ``s3://``, ``hf://``, ``ngc://`` —
and the one rule for where each is staged.

Why one module: the request loader, the spec rewriter, the stager, the model puller and the
renderer all have to agree on what a URI means and where its bytes land. Two parsers of one
scheme already disagreed once (``hf://org/repo@refs%2Fpr%2F3/onnx``: the config said
``…/refs%2Fpr%2F3/onnx`` while the model was pulled to ``…/refs/pr/3/onnx``). Everything parses
here, and :func:`staging_location` derives the path from the *parsed* URI.

``s3://`` semantics (documented in docs/cli.md and docs/requests.md):

* ``s3://b/p/`` names the *prefix* ``p/``: everything under it, with paths relative to it.
* ``s3://b/p`` given to ``sync`` is the same prefix ``p/`` (as ``aws s3 sync`` does) — a
  sync never matches ``p-other/`` or ``p.txt`` by accident.
* ``s3://b/p`` given to ``cp`` is the single object ``p``; ``s3://b/p/`` given to ``cp`` as
  a destination means "put the file under ``p/`` with its own name".
* ``s3://b`` and ``s3://b/`` name the whole bucket.

Model URIs:

* ``hf://org/repo[@revision][/subpath]`` — a revision containing ``/`` is written
  percent-encoded (``@refs%2Fpr%2F3``); ``@refs/pr/N`` is accepted as is. No revision means the
  repo's default branch.
* ``ngc://org/[team/]model:version``.

Staging locations (relative to the staging root): ``s3://bucket/key`` → ``s3/bucket/key``;
``hf://org/repo@rev/sub`` → ``hf/org/repo/<rev, decoded>/sub`` (``main`` when no revision);
``ngc://org/team/model:v`` → ``ngc/org/team/model/v``. Each goes through the one confinement
check, so no URI can place data outside the staging root.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from dataclasses import dataclass

from .errors import UnsafePathError, UsageError
from .fs.confinement import check_relative

#: Schemes of inputs that have to be fetched (everything else is a local path: tier A).
REMOTE_SCHEMES = ("s3://", "hf://", "ngc://")
HF_SHAPE = "hf://org/repo[@revision][/subpath]"
NGC_SHAPE = "ngc://org/[team/]model:version"
#: The revision label used in a staging location when an hf:// URI names none.
DEFAULT_HF_REVISION_LABEL = "main"

#: Hub and NGC names: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_NGC_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_HF_URI = re.compile(r"(?P<org>[^/@]*)/(?P<repo>[^/@]*)"
                     r"(?:@(?P<revision>refs/pr/\d+|[^/]*))?(?:/(?P<subpath>.*))?", re.S)
# Bucket names per the S3 rules (3–63 chars, lowercase, digits, dots, hyphens).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3Url:
    """A parsed ``s3://`` URL. ``key`` is exactly what followed the bucket (may be empty)."""

    bucket: str
    key: str

    @property
    def is_prefix(self) -> bool:
        """True for ``s3://b``, ``s3://b/`` and ``s3://b/p/``: a folder, not one object."""
        return self.key == "" or self.key.endswith("/")

    def as_prefix(self) -> S3Url:
        """The folder form: ``s3://b/p`` → ``s3://b/p/`` (the bucket root stays empty)."""
        if self.is_prefix:
            return self
        return S3Url(self.bucket, self.key + "/")

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def is_glob(self) -> bool:
        """True when the key is a pattern (``train-*``): a component holds ``*`` or ``?``. (``[`` stays
        a literal: keys such as ``shard[1]/`` are more common than bracket patterns.)"""
        return bool(_GLOB.search(self.key))

    def glob_split(self) -> tuple[S3Url, str]:
        """(the folder a glob lists, the pattern below it): the components before the first that
        holds a metacharacter, and the rest."""
        parts = self.key.split("/")
        first = next(index for index, part in enumerate(parts) if _GLOB.search(part))
        base = "/".join(parts[:first])
        return S3Url(self.bucket, f"{base}/" if base else ""), "/".join(parts[first:])


#: What makes an S3 key a pattern, as TensorFlow's glob (tf.io.gfile.glob) reads one.
_GLOB = re.compile(r"[*?]")


def check_glob(url: S3Url, *, field: str) -> None:
    """Refuse a pattern TensorFlow's glob rule cannot honour (see :mod:`.transfer.filters`)."""
    if "**" in url.key:
        raise UsageError(f"{field}: {url} holds '**', which TensorFlow's glob does not read as \"any depth\" (a '*' "
                         "matches within one path component): write one '*' per component")
    if url.key.endswith("/"):
        raise UsageError(f"{field}: {url} is a pattern ending in '/': a glob names objects; drop the trailing '/'")


def is_s3_url(text: str) -> bool:
    return text.startswith("s3://")


def parse_s3_url(text: str, *, field: str = "url") -> S3Url:
    """Parse ``s3://bucket[/key]``; a bad value raises :class:`UsageError` naming ``field``."""
    if not is_s3_url(text):
        raise UsageError(f"{field}: {text!r} is not an S3 URL; write it as s3://BUCKET/PREFIX/")
    rest = text[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise UsageError(
            f"{field}: bucket {bucket!r} in {text!r} is not a valid S3 bucket name "
            "(3–63 characters: lowercase letters, digits, '.', '-'); write s3://BUCKET/PREFIX/"
        )
    if "\x00" in key:
        raise UsageError(f"{field}: {text!r} contains a NUL character; remove it")
    return S3Url(bucket, key)


# --------------------------------------------------------------------------- model URIs
@dataclass(frozen=True)
class HFModelURI:
    """``hf://org/repo[@revision][/subpath]``; ``revision`` None means the repo's default branch."""

    repo_id: str
    revision: str | None = None
    subpath: str | None = None

    @property
    def source(self) -> str:
        """The repository without revision or subpath: what a marker's files belong to."""
        return f"hf://{self.repo_id}"

    def __str__(self) -> str:
        revision = "" if self.revision is None else "@" + urllib.parse.quote(self.revision, safe="")
        return f"{self.source}{revision}{'/' + self.subpath if self.subpath else ''}"


@dataclass(frozen=True)
class NGCModelURI:
    """``ngc://org/[team/]model:version``."""

    org: str
    team: str | None
    model: str
    version: str

    @property
    def source(self) -> str:
        return f"ngc://{self.org}/{self.team + '/' if self.team else ''}{self.model}"

    def __str__(self) -> str:
        return f"{self.source}:{self.version}"


def parse_model_uri(text: str) -> HFModelURI | NGCModelURI:
    """Parse a model URI, or raise :class:`UsageError` naming the URI, the problem and the shape."""
    scheme, separator, rest = text.partition("://")
    if separator and scheme == "hf":
        return _parse_hf(text, rest)
    if separator and scheme == "ngc":
        return _parse_ngc(text, rest)
    raise UsageError(f"model URI {text!r} is neither {HF_SHAPE} nor {NGC_SHAPE}")


def _malformed(text: str, shape: str, why: str) -> UsageError:
    return UsageError(f"model URI {text!r} is malformed: {why}; expected {shape}")


def _parse_hf(text: str, rest: str) -> HFModelURI:
    match = _HF_URI.fullmatch(rest)
    if match is None:
        raise _malformed(text, HF_SHAPE, "it needs an organisation and a repository name")
    for field_name in ("org", "repo"):
        value = match[field_name]
        if not _NAME.fullmatch(value) or "--" in value or ".." in value:
            why = f"the {field_name} is empty" if not value else (
                f"{field_name} {value!r} is not a Hub name "
                "(letters, digits, '.', '_', '-'; at most 96; no '--' or '..')")
            raise _malformed(text, HF_SHAPE, why)
    revision = match["revision"]
    if revision is not None:
        revision = urllib.parse.unquote(revision)
        if not revision or any(ch.isspace() or not ch.isprintable() for ch in revision):
            raise _malformed(text, HF_SHAPE, "the revision after '@' is empty or contains spaces or control characters")
    subpath = (match["subpath"] or "").rstrip("/") or None
    if subpath is not None:
        try:
            check_relative(subpath, what="subpath")
        except UnsafePathError as exc:
            raise _malformed(text, HF_SHAPE, str(exc)) from None
    return HFModelURI(f"{match['org']}/{match['repo']}", revision, subpath)


def _parse_ngc(text: str, rest: str) -> NGCModelURI:
    path, separator, version = rest.rpartition(":")
    if not separator:
        raise _malformed(text, NGC_SHAPE, "the ':version' is missing")
    if not _NGC_VERSION.fullmatch(version):
        raise _malformed(text, NGC_SHAPE, f"version {version!r} is empty or has characters NGC versions do not use")
    parts = path.split("/")
    if len(parts) not in (2, 3):
        raise _malformed(text, NGC_SHAPE, f"{path!r} has {len(parts)} segment(s), not org/model or org/team/model")
    for part in parts:
        if not _NAME.fullmatch(part):
            raise _malformed(text, NGC_SHAPE, f"{part!r} is not an NGC name" if part else "a path segment is empty")
    return NGCModelURI(parts[0], parts[1] if len(parts) == 3 else None, parts[-1], version)


# --------------------------------------------------------------------------- any remote URI
RemoteURI = S3Url | HFModelURI | NGCModelURI


def is_remote_uri(text: str) -> bool:
    return text.startswith(REMOTE_SCHEMES)


def parse_uri(text: str, *, field: str = "uri") -> RemoteURI:
    """Parse any remote URI a request may name; a bad one raises :class:`UsageError` naming
    ``field``, the URI, the problem and the expected shape."""
    try:
        if is_s3_url(text):
            url = parse_s3_url(text, field=field)
            if url.is_glob:
                check_glob(url, field=field)
            return url
        return parse_model_uri(text)
    except UsageError as exc:
        message = str(exc)
        raise UsageError(message if message.startswith(f"{field}:") else f"{field}: {message}") from None


def staging_location(uri: RemoteURI, *, field: str | None = None) -> str:
    """Where ``uri``'s bytes live relative to the staging root (see the module docstring); one
    that would escape it raises :class:`UsageError` naming ``field``."""
    if isinstance(uri, S3Url) and uri.is_glob:
        # What a pattern matches is staged below the folder it lists, in a place of its own (two
        # patterns over one folder never share a directory).
        base, _ = uri.glob_split()
        digest = hashlib.sha256(str(uri).encode()).hexdigest()[:12]
        relative = f"glob/{digest}/s3/{uri.bucket}/{base.key}".rstrip("/")
    elif isinstance(uri, S3Url):
        relative = f"s3/{uri.bucket}/{uri.key}".rstrip("/")
    elif isinstance(uri, HFModelURI):
        revision = uri.revision or DEFAULT_HF_REVISION_LABEL
        relative = "/".join(["hf", uri.repo_id, revision, *([uri.subpath] if uri.subpath else [])])
    else:
        relative = "/".join(["ngc", uri.org, *([uri.team] if uri.team else []), uri.model, uri.version])
    try:
        return check_relative(relative, what="staging location")
    except UnsafePathError as exc:
        raise UsageError(f"{field + ': ' if field else ''}{uri} cannot be staged: {exc}") from None


def model_root(uri: HFModelURI | NGCModelURI) -> HFModelURI | NGCModelURI:
    """The URI of the whole model a (sub)path belongs to: a pull writes the repository's files,
    with their repository paths, below ``staging_location(model_root(uri))``."""
    return HFModelURI(uri.repo_id, uri.revision) if isinstance(uri, HFModelURI) else uri
