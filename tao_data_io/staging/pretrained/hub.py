"""The Hugging Face Hub as a :class:`~.registry.Registry`, through ``huggingface_hub`` itself, so a
mirror set in ``HF_ENDPOINT``, the Hub's redirects and its error codes behave as for any Hub
client. ``HF_TOKEN`` is optional (public repos need none)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...redaction import mask_userinfo
from ...errors import CredentialError, TransferError, UsageError
from ...fs.confinement import STATE_DIR_NAME
from ...uris import HFModelURI
from .registry import GIT_BLOB_SHA1, SHA256, Digest, Listing, RemoteFile

DEFAULT_HF_ENDPOINT = "https://huggingface.co"


class HubRegistry:
    """The Hub through ``huggingface_hub`` (imported on first use: it is heavy, and only hf://
    needs it). Listing is ``model_info(files_metadata=True)`` — ``GET /api/models/{repo}[/revision/
    {rev}]?blobs=true`` — and each file is ``hf_hub_download`` pinned to the resolved commit."""

    def __init__(self, uri: HFModelURI, environ: Mapping[str, str]) -> None:
        self.uri = uri
        self.endpoint = (environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
        #: How messages name the Hub: never with a password from the URL's userinfo.
        self.where = mask_userinfo(self.endpoint)
        # False, not None: huggingface_hub would otherwise read a token saved on disk, and
        # credentials come from the environment only.
        self.token: str | bool = environ.get("HF_TOKEN") or False

    def listing(self) -> Listing:
        from huggingface_hub import HfApi

        with self._errors():
            info = HfApi(endpoint=self.endpoint, token=self.token, library_name="tao-data-io").model_info(
                self.uri.repo_id, revision=self.uri.revision, files_metadata=True)
        if not info.sha:
            raise TransferError(f"the Hub at {self.where} did not report the commit of {self.uri}")
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

    def fetch(self, files: Sequence[RemoteFile], revision: str, staging: Path,
              on_file: Callable[[RemoteFile], None]) -> None:
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
                on_file(remote)
        finally:
            shutil.rmtree(staging / STATE_DIR_NAME, ignore_errors=True)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn huggingface_hub's errors into ours: what was wrong, and what to change."""
        import httpx2
        from huggingface_hub.errors import (HfHubHTTPError, HFValidationError, RepositoryNotFoundError,
                                            RevisionNotFoundError)

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
                raise UsageError(f"Hugging Face repo {repo!r} does not exist at {self.where}: "
                                 f"check the org/repo in {self.uri}") from exc
            raise TransferError(f"the Hub at {self.where} failed for {self.uri} (HTTP {status}); "
                                "rerun to retry") from exc
        except HFValidationError as exc:
            raise UsageError(f"{self.uri} is not a valid Hub reference: {exc}") from exc
        except (OSError, httpx2.HTTPError) as exc:
            raise TransferError(f"could not get {self.uri} from the Hub at {self.where} (HF_ENDPOINT): "
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
    from huggingface_hub.utils.tqdm import tqdm

    class Quiet(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]  # huggingface_hub leaves it unannotated

    return Quiet
