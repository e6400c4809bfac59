"""Pre-trained models from the Hugging Face Hub or NGC into a directory: verified, atomic, rerunnable.

Why this module exists: a TAO job needs its pre-trained model on local disk before it starts,
and "the folder is not empty" says nothing about whether the weights are whole. Every file is
therefore checked against what the registry itself reports for the resolved revision — the size
always, plus the sha256 of LFS files and the git blob id of files kept directly in git on the
Hub, or the sha256 NGC lists — and nothing is published until every fetched file has passed.

URIs (parsed by :func:`parse_model_uri`):

* ``hf://org/repo[@revision][/subpath]`` — fetched with ``huggingface_hub`` itself, so a mirror
  set in ``HF_ENDPOINT``, the Hub's redirects and its error codes behave as for any Hub client.
  ``HF_TOKEN`` is optional (public repos need none). A revision containing ``/`` is written
  percent-encoded (``@refs%2Fpr%2F3``); ``@refs/pr/3`` is accepted as is. Without a revision the
  repo's default branch is used. Files keep their repository paths below the destination, so a
  subpath ``onnx`` lands at ``D/onnx/...``.
* ``ngc://org/[team/]model:version`` — NGC's model registry REST API. ``NGC_KEY`` is exchanged
  for a short-lived bearer token at ``$NGC_AUTH_URL/token`` (default https://authn.nvidia.com);
  the API is ``$NGC_API_URL/v2/...`` (default https://api.ngc.nvidia.com). Both overrides exist
  for mirrors and tests.

Publishing: missing or wrong files are fetched into a temp directory beside the destination (same
filesystem). A destination that does not exist yet appears whole, by one rename. Into an existing
one each verified file is renamed into place and the marker ``D/.tao-data-io/model.json`` (URI,
resolved revision, every file with size and digest) is written last. A rerun trusts a file the
marker lists for the same revision while its size is unchanged, hashes files the marker does not
vouch for, and fetches only what is missing or wrong. Files the model does not list are left
alone. One pull per destination at a time: a run removes the staging directories that killed
runs left beside the destination.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..credentials import require_env
from ..errors import CredentialError, TransferError, UnsafePathError, UsageError
from ..fs import (STATE_DIR_NAME, atomic_write, check_relative, confined_path, file_digest, remove_stale_temps,
                  temp_path_for)
from ..transfer.summary import human_size

HF_SHAPE = "hf://org/repo[@revision][/subpath]"
NGC_SHAPE = "ngc://org/[team/]model:version"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
DEFAULT_NGC_API_URL = "https://api.ngc.nvidia.com"
DEFAULT_NGC_AUTH_URL = "https://authn.nvidia.com"
#: The marker inside the destination's state directory.
MARKER_NAME = "model.json"

SHA256 = "sha256"
#: The Hub's id of a file kept directly in git: sha1 over ``b"blob <size>\\0"`` + the content.
GIT_BLOB_SHA1 = "git-blob-sha1"

_MARKER_SCHEMA = 1
_CHUNK = 1 << 20
#: Hub and NGC names: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_NGC_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_HF_URI = re.compile(r"(?P<org>[^/@]*)/(?P<repo>[^/@]*)(?:@(?P<revision>refs/pr/\d+|[^/]*))?(?:/(?P<subpath>.*))?", re.S)
_HEX = {SHA256: re.compile(r"[0-9a-f]{64}"), GIT_BLOB_SHA1: re.compile(r"[0-9a-f]{40}")}

# NGC HTTP: throttling, server errors and dropped connections are retried with backoff.
_NGC_ATTEMPTS = 4
_NGC_FIRST_BACKOFF_S = 0.5
_NGC_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_NGC_TIMEOUT_S = 60
_NGC_PAGE_SIZE = 1000

T = TypeVar("T")


# --- URIs -------------------------------------------------------------------------------------


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
                f"{field_name} {value!r} is not a Hub name (letters, digits, '.', '_', '-'; at most 96; no '--' or '..')")
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


# --- what a registry reports --------------------------------------------------------------------


@dataclass(frozen=True)
class Digest:
    """A content digest as the registry reports it (``sha256`` or ``git-blob-sha1``, lowercase hex)."""

    algorithm: str
    value: str

    def __post_init__(self) -> None:
        pattern = _HEX.get(self.algorithm)
        if pattern is None or not pattern.fullmatch(self.value):
            raise ValueError(f"not a {self.algorithm} digest: {self.value!r}")

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.value}"

    @classmethod
    def parse(cls, text: str) -> Digest:
        algorithm, _, value = text.partition(":")
        return cls(algorithm, value)


@dataclass(frozen=True)
class RemoteFile:
    """One file of the model: its path below the destination, its size and digest (if reported)."""

    path: str
    size: int
    digest: Digest | None


@dataclass(frozen=True)
class Listing:
    """Every file of the model at ``revision`` (a Hub commit sha, or the NGC version)."""

    revision: str
    files: tuple[RemoteFile, ...]


class _Registry(Protocol):
    def listing(self) -> Listing:
        """What the registry reports for the URI: the resolved revision and every file."""

    def fetch(self, files: Sequence[RemoteFile], revision: str, staging: Path) -> None:
        """Write each file's bytes to ``staging / file.path`` (verification is the caller's)."""


# --- the result -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PullResult:
    """What :func:`pull_model` did: small, plain data a CLI prints and a Prefect task returns."""

    uri: str
    destination: Path
    #: The Hub commit sha the revision resolved to, or the NGC version.
    revision: str
    #: Every file of the model (paths below ``destination``) and their total size.
    files: tuple[str, ...]
    bytes: int
    #: What this run fetched; empty when the destination was already complete.
    fetched: tuple[str, ...]
    fetched_bytes: int

    @property
    def downloaded(self) -> bool:
        return bool(self.fetched)

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri, "destination": str(self.destination), "revision": self.revision,
                "files": list(self.files), "bytes": self.bytes, "fetched": list(self.fetched),
                "fetched_bytes": self.fetched_bytes, "downloaded": self.downloaded}

    def describe(self) -> str:
        """One human line, e.g. for a log or a Prefect artifact title."""
        done = (f"fetched {len(self.fetched)} files ({human_size(self.fetched_bytes)})" if self.downloaded
                else "already complete, nothing fetched")
        return f"revision {self.revision}: {len(self.files)} files ({human_size(self.bytes)}), {done}"


# --- pulling ------------------------------------------------------------------------------------


def pull_model(uri: str, destination: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> PullResult:
    """Make ``destination`` hold exactly-verified files of the model ``uri``; fetch only what is
    missing or wrong.

    Credentials and endpoints come from ``environ`` (default ``os.environ``). Raises
    :class:`UsageError` for bad input (malformed URI, unknown revision, a file name that would
    escape the destination), :class:`CredentialError` when the registry refuses the credential,
    and :class:`TransferError` when bytes did not arrive intact (nothing is published then; a
    rerun retries).
    """
    env = os.environ if environ is None else environ
    parsed = parse_model_uri(uri)
    dest = Path(os.path.abspath(destination))
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"destination {str(dest)!r} exists and is not a directory; give a directory path")
    registry: _Registry = _HubRegistry(parsed, env) if isinstance(parsed, HFModelURI) else _NGCRegistry(parsed, env)
    listing = _checked(registry.listing(), parsed)
    remove_stale_temps(dest)
    marker = _read_marker(dest)
    vouched = _vouched_files(marker, parsed, listing.revision)
    missing = [remote for remote in listing.files if not _is_present(dest, remote, vouched.get(remote.path) == remote)]
    payload = _marker_payload(parsed, listing)
    if missing:
        _fetch_and_publish(registry, missing, listing.revision, dest, payload)
    elif marker != payload:
        _write_marker(dest, payload)
    return PullResult(str(parsed), dest, listing.revision, tuple(f.path for f in listing.files),
                      sum(f.size for f in listing.files), tuple(f.path for f in missing), sum(f.size for f in missing))


def _checked(listing: Listing, uri: HFModelURI | NGCModelURI) -> Listing:
    """Refuse a listing that is empty, names a file unsafely, or names one path twice — before
    anything is written, so a hostile registry cannot place a file outside the destination."""
    if not listing.files:
        raise UsageError(f"{uri} has no files at revision {listing.revision}; check the subpath or version")
    paths = {check_relative(remote.path, what=f"file name from {uri}") for remote in listing.files}
    if len(paths) != len(listing.files):
        raise UsageError(f"{uri} lists a file name more than once; refusing an ambiguous model")
    for path in paths:
        parts = path.split("/")
        clash = next(("/".join(parts[:n]) for n in range(1, len(parts)) if "/".join(parts[:n]) in paths), None)
        if clash is not None:
            raise UsageError(f"{uri} lists both {clash!r} and {path!r}; a path cannot be a file and a directory")
    return listing


def _is_present(dest: Path, remote: RemoteFile, vouched: bool) -> bool:
    """Whether ``dest`` already holds ``remote``'s bytes: right size and (unless the marker vouches
    for it) the registry's digest. A file without a reported digest is only trusted via the marker."""
    path = confined_path(dest, remote.path, what="model file")
    try:
        info = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_size != remote.size:
        return False
    if vouched:
        return True
    return remote.digest is not None and file_digest(path, remote.digest.algorithm) == remote.digest.value


def _fetch_and_publish(registry: _Registry, files: Sequence[RemoteFile], revision: str, dest: Path,
                       payload: dict[str, Any]) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = temp_path_for(dest)
    staging.mkdir()
    try:
        registry.fetch(files, revision, staging)
        _verify(staging, files, dest)
        try:
            if dest.is_dir():
                # A marker for an older state must not vouch for files while they are replaced.
                (dest / STATE_DIR_NAME / MARKER_NAME).unlink(missing_ok=True)
                for remote in files:
                    final = confined_path(dest, remote.path, what="model file")
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staging / remote.path, final)
                _write_marker(dest, payload)
            else:
                _write_marker(staging, payload)
                os.rename(staging, dest)
        except OSError as exc:
            raise TransferError(f"could not publish the verified files into {dest}: {exc}; rerun to retry") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _verify(staging: Path, files: Sequence[RemoteFile], dest: Path) -> None:
    problems = []
    for remote in files:
        path = staging / remote.path
        size = path.stat().st_size if path.is_file() else None
        if size != remote.size:
            problems.append(f"{remote.path}: {'nothing' if size is None else f'{size} bytes'} arrived, "
                            f"the registry lists {remote.size} bytes")
        elif remote.digest is not None and (got := file_digest(path, remote.digest.algorithm)) != remote.digest.value:
            problems.append(f"{remote.path}: {remote.digest.algorithm} is {got}, the registry lists {remote.digest.value}")
    if problems:
        raise TransferError(f"{len(problems)} file(s) failed verification, so nothing was published at {dest} "
                            f"(rerun to retry): " + "; ".join(problems))


# --- the marker ---------------------------------------------------------------------------------


def _marker_payload(uri: HFModelURI | NGCModelURI, listing: Listing) -> dict[str, Any]:
    return {"schema_version": _MARKER_SCHEMA, "uri": str(uri), "source": uri.source, "revision": listing.revision,
            "files": [{"path": f.path, "size": f.size, "digest": None if f.digest is None else str(f.digest)}
                      for f in listing.files]}


def _read_marker(dest: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((dest / STATE_DIR_NAME / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a missing or damaged marker only costs a rehash
    return data if isinstance(data, dict) else None


def _vouched_files(marker: dict[str, Any] | None, uri: HFModelURI | NGCModelURI, revision: str) -> dict[str, RemoteFile]:
    """The files a marker vouches for: only one written for the same source and revision."""
    if marker is None or marker.get("schema_version") != _MARKER_SCHEMA or marker.get("source") != uri.source \
            or marker.get("revision") != revision:
        return {}
    try:
        return {entry["path"]: RemoteFile(entry["path"], entry["size"],
                                          None if entry["digest"] is None else Digest.parse(entry["digest"]))
                for entry in marker["files"]}
    except (KeyError, TypeError, ValueError):
        return {}


def _write_marker(root: Path, payload: dict[str, Any]) -> None:
    atomic_write(root / STATE_DIR_NAME / MARKER_NAME, json.dumps(payload, indent=1).encode("utf-8"))


# --- Hugging Face Hub ---------------------------------------------------------------------------


class _HubRegistry:
    """The Hub through ``huggingface_hub`` (imported on first use: it is heavy, and only hf://
    needs it). Listing is ``model_info(files_metadata=True)`` — ``GET /api/models/{repo}[/revision/
    {rev}]?blobs=true`` — and each file is ``hf_hub_download`` pinned to the resolved commit."""

    def __init__(self, uri: HFModelURI, environ: Mapping[str, str]) -> None:
        self.uri = uri
        self.endpoint = (environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
        # False, not None: huggingface_hub would otherwise read a token saved on disk, and
        # credentials come from the environment only.
        self.token: str | bool = environ.get("HF_TOKEN") or False

    def listing(self) -> Listing:
        from huggingface_hub import HfApi

        with self._errors():
            info = HfApi(endpoint=self.endpoint, token=self.token, library_name="tao-data-io").model_info(
                self.uri.repo_id, revision=self.uri.revision, files_metadata=True)
        if not info.sha:
            raise TransferError(f"the Hub at {self.endpoint} did not report the commit of {self.uri}")
        files = []
        for sibling in info.siblings or ():
            if self.uri.subpath and not (sibling.rfilename == self.uri.subpath
                                         or sibling.rfilename.startswith(self.uri.subpath + "/")):
                continue
            files.append(self._remote_file(sibling))
        return Listing(info.sha, tuple(files))

    def _remote_file(self, sibling: Any) -> RemoteFile:
        """An LFS file is checked by its sha256, a file kept in git by its git blob id."""
        size: int | None
        digest: Digest | None
        try:
            if sibling.lfs is not None:
                size, digest = sibling.lfs.size, Digest(SHA256, sibling.lfs.sha256)
            else:
                size, digest = sibling.size, Digest(GIT_BLOB_SHA1, sibling.blob_id) if sibling.blob_id else None
        except ValueError as exc:
            raise TransferError(f"the Hub reported a malformed digest for {sibling.rfilename!r} in {self.uri}: "
                                f"{exc}") from exc
        if size is None:
            raise TransferError(f"the Hub did not report the size of {sibling.rfilename!r} in {self.uri}, "
                                "so completeness cannot be verified")
        return RemoteFile(sibling.rfilename, size, digest)

    def fetch(self, files: Sequence[RemoteFile], revision: str, staging: Path) -> None:
        from huggingface_hub import hf_hub_download

        # huggingface_hub keeps bookkeeping under <local_dir>/.cache/huggingface; a scratch
        # directory inside our reserved state directory keeps it apart from model files.
        scratch = staging / STATE_DIR_NAME / "hf-download"
        try:
            for remote in files:
                with self._errors():
                    local = hf_hub_download(self.uri.repo_id, remote.path, revision=revision, local_dir=scratch,
                                            endpoint=self.endpoint, token=self.token, library_name="tao-data-io",
                                            tqdm_class=_quiet_tqdm())
                target = staging / remote.path
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(local, target)
        finally:
            shutil.rmtree(staging / STATE_DIR_NAME, ignore_errors=True)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn huggingface_hub's errors into ours: what was wrong, and what to change."""
        import httpx2
        from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError, RevisionNotFoundError

        repo = self.uri.repo_id
        try:
            yield
        except RevisionNotFoundError as exc:
            raise UsageError(f"revision {self.uri.revision!r} does not exist in Hugging Face repo {repo!r}: "
                             f"give an existing branch, tag or commit after '@' in {self.uri}") from exc
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            if status in (401, 403):
                raise self._refused(status) from exc
            if isinstance(exc, RepositoryNotFoundError):
                raise UsageError(f"Hugging Face repo {repo!r} does not exist at {self.endpoint}: "
                                 f"check the org/repo in {self.uri}") from exc
            raise TransferError(f"the Hub at {self.endpoint} failed for {self.uri} (HTTP {status}); rerun to retry") from exc
        except HFValidationError as exc:
            raise UsageError(f"{self.uri} is not a valid Hub reference: {exc}") from exc
        except (OSError, httpx2.HTTPError) as exc:
            raise TransferError(f"could not get {self.uri} from the Hub at {self.endpoint} (HF_ENDPOINT): "
                                f"{type(exc).__name__}: {exc}; rerun to retry") from exc

    def _refused(self, status: int) -> CredentialError:
        repo = self.uri.repo_id
        if self.token:
            return CredentialError(f"the Hub refused HF_TOKEN for {repo!r} (HTTP {status}): the token is invalid or "
                                   "lacks read access to this repo (gated repos also need their terms accepted); "
                                   "export a valid HF_TOKEN")
        return CredentialError(f"the Hub refused anonymous access to {repo!r} (HTTP {status}): the repo is private "
                               "or gated, or does not exist; export HF_TOKEN with read access to it")


def _quiet_tqdm() -> type:
    """A progress-bar class that draws nothing: huggingface_hub's own bars would write straight to
    stderr, past the CLI's console."""
    from huggingface_hub.utils import tqdm

    class Quiet(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Quiet


# --- NGC ----------------------------------------------------------------------------------------


class _NGCRegistry:
    """NGC's model registry REST API, as NGC's own tools call it:

    * ``GET $NGC_AUTH_URL/token?service=ngc&scope=group/ngc:{org}[&scope=group/ngc:{org}/{team}]``
      with HTTP Basic ``$oauthtoken:<NGC_KEY>`` → ``{"token": ...}``, then ``Authorization: Bearer``;
    * ``GET $NGC_API_URL/v2/org/{org}[/team/{team}]/models/{model}/versions/{version}/files
      ?page-size=N&page-number=P`` → ``{"modelFiles": [{"path", "sizeInBytes", "sha256"}, ...],
      "paginationInfo": {"totalPages": ...}}``;
    * ``GET .../versions/{version}/files/{path}`` → the bytes, usually via a redirect to signed
      storage. The bearer token is never sent past a redirect.
    """

    def __init__(self, uri: NGCModelURI, environ: Mapping[str, str]) -> None:
        self.uri = uri
        self.key = require_env("NGC_KEY", f"pull {uri} from NGC", environ)
        self.api = (environ.get("NGC_API_URL") or DEFAULT_NGC_API_URL).rstrip("/")
        self.authn = (environ.get("NGC_AUTH_URL") or DEFAULT_NGC_AUTH_URL).rstrip("/")
        self._token: str | None = None
        quote = urllib.parse.quote
        team = f"/team/{quote(uri.team)}" if uri.team else ""
        self._version_url = (f"{self.api}/v2/org/{quote(uri.org)}{team}/models/{quote(uri.model)}"
                             f"/versions/{quote(uri.version)}")
        self._no_such_version = (f"NGC has no model version {uri} (HTTP 404) at {self.api}: "
                                 "check the org, team, model and version")

    def listing(self) -> Listing:
        files: list[RemoteFile] = []
        page, pages = 0, 1
        while page < pages:
            body = self._get_json(f"{self._version_url}/files?page-size={_NGC_PAGE_SIZE}&page-number={page}",
                                  f"listing the files of {self.uri} at {self.api} (NGC_API_URL)", self._no_such_version)
            files.extend(self._remote_file(entry) for entry in body.get("modelFiles") or ())
            pages = int((body.get("paginationInfo") or {}).get("totalPages") or 1)
            page += 1
        return Listing(self.uri.version, tuple(files))

    def fetch(self, files: Sequence[RemoteFile], revision: str, staging: Path) -> None:
        for remote in files:
            target = staging / remote.path
            target.parent.mkdir(parents=True, exist_ok=True)
            url = f"{self._version_url}/files/{urllib.parse.quote(remote.path)}"

            def download(headers: dict[str, str], url: str = url, target: Path = target) -> None:
                with _ngc_open(url, headers) as response, open(target, "wb") as handle:
                    shutil.copyfileobj(response, handle, _CHUNK)

            self._call(f"downloading {remote.path!r} of {self.uri}", self._no_such_version, download)

    def _remote_file(self, entry: Any) -> RemoteFile:
        path = entry.get("path") if isinstance(entry, dict) else None
        size = entry.get("sizeInBytes") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TransferError(f"NGC listed a file of {self.uri} without a usable 'path' and 'sizeInBytes' "
                                f"({entry!r}), so completeness cannot be verified")
        sha256 = entry.get("sha256")
        sha256 = sha256.lower() if isinstance(sha256, str) else None
        return RemoteFile(path, size, Digest(SHA256, sha256) if sha256 and _HEX[SHA256].fullmatch(sha256) else None)

    def _bearer(self) -> dict[str, str]:
        if self._token is None:
            scopes = [("scope", f"group/ngc:{self.uri.org}")]
            if self.uri.team:
                scopes.append(("scope", f"group/ngc:{self.uri.org}/{self.uri.team}"))
            query = urllib.parse.urlencode([("service", "ngc"), *scopes])
            basic = base64.b64encode(f"$oauthtoken:{self.key}".encode()).decode("ascii")
            body = self._get_json(f"{self.authn}/token?{query}",
                                  f"exchanging NGC_KEY for a token at {self.authn} (NGC_AUTH_URL)",
                                  f"NGC's token service {self.authn}/token does not exist (HTTP 404); check NGC_AUTH_URL",
                                  basic=basic)
            token = body.get("token")
            if not isinstance(token, str) or not token:
                raise TransferError(f"NGC's token service at {self.authn} answered without a token")
            self._token = token
        return {"Authorization": f"Bearer {self._token}"}

    def _get_json(self, url: str, what: str, missing: str, *, basic: str | None = None) -> dict[str, Any]:
        def get(headers: dict[str, str]) -> Any:
            with _ngc_open(url, {**headers, "Accept": "application/json"}) as response:
                return json.load(response)

        if basic is None:
            body = self._call(what, missing, get)
        else:
            body = self._call(what, missing, lambda _: get({"Authorization": f"Basic {basic}"}), bearer=False)
        if not isinstance(body, dict):
            raise TransferError(f"{what}: NGC answered with JSON that is not an object")
        return body

    def _call(self, what: str, missing: str, send: Callable[[dict[str, str]], T], *, bearer: bool = True) -> T:
        """One HTTP exchange: retry throttling, 5xx and dropped connections with backoff; get a
        fresh token once on 401/403 (tokens are short-lived); map the rest to our errors."""
        delay, refreshed, failure = _NGC_FIRST_BACKOFF_S, False, ""
        for attempt in range(1, _NGC_ATTEMPTS + 1):
            try:
                return send(self._bearer() if bearer else {})
            except urllib.error.HTTPError as exc:
                exc.close()
                if exc.code in (401, 403) and bearer and not refreshed:
                    self._token, refreshed = None, True
                    continue
                if exc.code in (401, 403):
                    raise self._refused(exc.code) from None
                if exc.code == 404:
                    raise UsageError(missing) from None
                failure = f"HTTP {exc.code} {exc.reason}"
                if exc.code not in _NGC_RETRY_STATUS:
                    break
            except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
            if attempt < _NGC_ATTEMPTS:
                time.sleep(delay)
                delay *= 2
        raise TransferError(f"{what} failed: {failure}; rerun to retry")

    def _refused(self, status: int) -> CredentialError:
        scope = f"org {self.uri.org!r}" + (f" team {self.uri.team!r}" if self.uri.team else "")
        return CredentialError(f"NGC refused NGC_KEY for {self.uri} (HTTP {status}): the key is invalid or expired, "
                               f"or has no access to {scope}; export a valid NGC_KEY")


def _ngc_open(url: str, headers: Mapping[str, str]) -> http.client.HTTPResponse:
    """GET ``url``; headers are "unredirected" so credentials never follow a redirect elsewhere."""
    request = urllib.request.Request(url)
    for name, value in headers.items():
        request.add_unredirected_header(name, value)
    response: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=_NGC_TIMEOUT_S)
    return response
