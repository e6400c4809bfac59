"""Pre-trained models from the Hugging Face Hub or NGC into a directory: verified, atomic, rerunnable.

Why this module exists: a TAO job needs its pre-trained model on local disk before it starts,
and "the folder is not empty" says nothing about whether the weights are whole. Every file is
therefore checked against what the registry itself reports for the resolved revision — the size
always, plus the sha256 of LFS files and the git blob id of files kept directly in git on the
Hub, or the sha256 NGC lists — and nothing is published until every fetched file has passed.

URIs (parsed by :func:`tao_data_io.uris.parse_model_uri`; registries in :mod:`.hub` and :mod:`.ngc`):

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
one each verified file is renamed into place and the marker ``model.json`` beside it (``fs.state.state_dir_for``) (URI,
resolved revision, every file with size and digest) is written last. A rerun trusts a file the
marker lists for the same revision while its size is unchanged, hashes files the marker does not
vouch for, and fetches only what is missing or wrong. Files the model does not list are left
alone. A pull holds the destination's lock, as every writer of a destination does (a sync or an
extraction into the same place waits for it), and removes the staging directories that killed
pulls under that lock left beside the destination. Files are renamed into an existing destination
through its directory descriptors (:class:`~tao_data_io.fs.tree.DestinationTree`), so a directory
inside it replaced by a symlink meanwhile is never followed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import TransferError, UsageError, IntegrityError
from ...fs.atomic import atomic_write
from ...fs.confinement import check_relative, confined_path
from ...fs.digest import file_digest
from ...fs.locks import destination_lock
from ...fs.state import read_state_file, state_dir_for
from ...fs.temp import lock_tag, remove_stale_temps, temp_path_for
from ...fs.tree import DestinationTree
from ...reporting import ProgressCallback, ProgressTracker, human_size
from ...uris import HFModelURI, NGCModelURI, parse_model_uri
from .hub import HubRegistry
from .ngc import NGCRegistry
from .registry import Digest, Listing, Registry, RemoteFile

#: The marker inside the destination's state directory.
MARKER_NAME = "model.json"
_MARKER_SCHEMA = 1


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


def pull_model(uri: str | HFModelURI | NGCModelURI, destination: str | os.PathLike[str], *,
               environ: Mapping[str, str] | None = None, progress: ProgressCallback | None = None) -> PullResult:
    """Make ``destination`` hold exactly-verified files of the model ``uri`` (the URI, or as
    :func:`~tao_data_io.uris.parse_model_uri` parsed it); fetch only what is missing or wrong.

    Credentials and endpoints come from ``environ`` (default ``os.environ``). Raises
    :class:`UsageError` for bad input (malformed URI, unknown revision, a file name that would
    escape the destination), :class:`CredentialError` when the registry refuses the credential,
    and :class:`TransferError` when bytes did not arrive intact (nothing is published then; a
    rerun retries).
    """
    env = os.environ if environ is None else environ
    parsed = parse_model_uri(uri) if isinstance(uri, str) else uri
    dest = Path(os.path.abspath(destination))
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"destination {str(dest)!r} exists and is not a directory; give a directory path")
    registry = registry_for(parsed, env)
    listing = _checked(registry.listing(), parsed)
    with destination_lock(dest) as lock:
        tag = lock_tag(lock)
        remove_stale_temps(dest, tag)
        marker = _read_marker(dest)
        vouched = _vouched_files(marker, parsed, listing.revision)
        missing = [remote for remote in listing.files
                   if not _is_present(dest, remote, vouched.get(remote.path) == remote)]
        payload = _marker_payload(parsed, listing)
        if missing:
            tracker = ProgressTracker(len(missing), sum(f.size for f in missing), progress)
            tracker.start()
            _fetch_and_publish(registry, missing, listing.revision, dest, payload, lambda f: tracker.advance(f.size),
                               tag)
        elif marker != payload:
            _write_marker(dest, payload)
    return PullResult(str(parsed), dest, listing.revision, tuple(f.path for f in listing.files),
                      sum(f.size for f in listing.files), tuple(f.path for f in missing), sum(f.size for f in missing))


def registry_for(uri: HFModelURI | NGCModelURI, environ: Mapping[str, str]) -> Registry:
    """The client of the registry ``uri`` lives in, with the credentials and endpoints of
    ``environ``: what :func:`pull_model` lists and fetches through."""
    return HubRegistry(uri, environ) if isinstance(uri, HFModelURI) else NGCRegistry(uri, environ)


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


def _fetch_and_publish(registry: Registry, files: Sequence[RemoteFile], revision: str, dest: Path,
                       payload: dict[str, Any], on_file: Callable[[RemoteFile], None], tag: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = temp_path_for(dest, tag)
    staging.mkdir()
    try:
        registry.fetch(files, revision, staging, on_file)
        _check_integrity(staging, files, dest)
        try:
            if dest.is_dir():
                # A marker for an older state must not vouch for files while they are replaced.
                (state_dir_for(dest) / MARKER_NAME).unlink(missing_ok=True)
                _publish_into(staging, files, DestinationTree(dest, tag))
                _write_marker(dest, payload)
            else:
                os.rename(staging, dest)
                _write_marker(dest, payload)  # a kill before this costs a rehash, never a wrong answer
        except OSError as exc:
            raise TransferError(f"could not publish the verified files into {dest}: {exc}; rerun to retry") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish_into(staging: Path, files: Sequence[RemoteFile], tree: DestinationTree) -> None:
    """Rename each verified file from ``staging`` (ours, beside the destination) into ``tree``,
    through its directory descriptors: never through a symlink found inside the destination."""
    try:
        for remote in files:
            directory = os.path.dirname(remote.path)
            source = os.open(staging / directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                tree.adopt(source, os.path.basename(remote.path), remote.path).publish()
            finally:
                os.close(source)
    finally:
        tree.close()


def _check_integrity(staging: Path, files: Sequence[RemoteFile], dest: Path) -> None:
    problems = []
    for remote in files:
        path = staging / remote.path
        size = path.stat().st_size if path.is_file() else None
        if size != remote.size:
            problems.append(f"{remote.path}: {'nothing' if size is None else f'{size} bytes'} arrived, "
                            f"the registry lists {remote.size} bytes")
        elif remote.digest is not None and (got := file_digest(path, remote.digest.algorithm)) != remote.digest.value:
            problems.append(f"{remote.path}: {remote.digest.algorithm} is {got}, "
                            f"the registry lists {remote.digest.value}")
    if problems:
        raise IntegrityError(f"{len(problems)} file(s) failed the integrity check, so nothing was published at {dest} "
                            f"(rerun to retry): " + "; ".join(problems))


def _marker_payload(uri: HFModelURI | NGCModelURI, listing: Listing) -> dict[str, Any]:
    return {"schema_version": _MARKER_SCHEMA, "uri": str(uri), "source": uri.source, "revision": listing.revision,
            "files": [{"path": f.path, "size": f.size, "digest": None if f.digest is None else str(f.digest)}
                      for f in listing.files]}


def _read_marker(dest: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(read_state_file(state_dir_for(dest) / MARKER_NAME))
    except (OSError, ValueError):  # UnsafePathError too: another user's marker vouches for nothing
        return None  # a missing, damaged or untrusted marker only costs a rehash
    return data if isinstance(data, dict) else None


def _vouched_files(marker: dict[str, Any] | None, uri: HFModelURI | NGCModelURI,
                   revision: str) -> dict[str, RemoteFile]:
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
    atomic_write(state_dir_for(root) / MARKER_NAME, json.dumps(payload, indent=1).encode("utf-8"))
