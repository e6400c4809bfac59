"""``TaoS3Bucket``: Prefect's object-storage interface on the core's engine, so code written for
prefect-aws's ``S3Bucket`` can switch by changing the block it loads.

Why a block of our own rather than prefect-aws's: ``S3Bucket`` stores its credentials' values in
Prefect (``AwsCredentials``) and moves bytes one boto3 call per file — writing wherever a key's
name points, leaving half-written files when a transfer dies, and sending every file again on
every call. This block names its credentials (an :class:`S3EnvCredentials`, names only) and
moves bytes with :class:`~tao_data_io.transfer.engine.TransferEngine`: keys that would land
outside the destination are refused, every file appears whole or not at all, an unchanged file
is not sent or fetched again, and folders move at s5cmd's speed (``bench/transfer.py``, the tao-s3-bucket contender).

The methods and their arguments are ``S3Bucket``'s (``bucket_name``, ``bucket_folder``,
``download_folder_to_path``, ``upload_from_folder``, …, ``read_path``/``write_path``), and each
is awaitable in an async context and direct in a sync one, as prefect-aws's are; the async twin
runs the one sync body in a thread. As a ``WritableFileSystem`` it can hold flow results
(``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK=tao-s3-bucket/NAME``), which is how flow runs on a
Kubernetes pool, a fresh pod each, share them (``docs/prefect.md``).

Extra keyword arguments, which prefect-aws passes to boto3 (``ExtraArgs=…``), are refused by
name: the engine chooses how each object moves, and silently ignoring them would be worse.
"""

from __future__ import annotations

import asyncio
import functools
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from prefect.blocks.abstract import ObjectStorageBlock
from prefect.context import get_run_context
from prefect.exceptions import MissingContextError
from prefect.filesystems import WritableFileSystem
from pydantic import Field, field_validator

from blocks.credentials import S3EnvCredentials
from blocks.picker import PICKABLE
from blocks.presentation import DOCUMENTATION_URL, LOGO_URL, code_example
from tao_data_io.errors import TransferError, UsageError
from tao_data_io.fs.confinement import check_relative
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions
from tao_data_io.transfer.summary import TransferSummary
from tao_data_io.uris import S3Url, parse_s3_url

F = TypeVar("F", bound=Callable[..., Any])
#: How many failed objects a TransferError names (the rest are counted).
SHOWN_FAILURES = 5


def _awaited() -> bool:
    """Whether the caller awaits what it calls, by the rule prefect-aws's methods follow (Prefect's
    own, read here through its public run context rather than its private dispatcher, which any
    release may move): inside a flow or task run, whether that flow or task is async; outside
    one, whether an event loop runs in this thread."""
    try:
        run = get_run_context()
    except MissingContextError:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True
    owner = getattr(run, "task", None) or getattr(run, "flow", None)
    return bool(getattr(owner, "isasync", True))


def _twins(body: F) -> tuple[F, Callable[..., Any]]:
    """``body`` as prefect-aws's methods are: direct in a sync context, a coroutine in an async
    one (``_sync=True`` or ``False`` decides instead); and its ``a``-prefixed twin, which runs
    ``body`` itself in a worker thread (so the twin never dispatches again, and the engine's
    blocking I/O never holds the event loop)."""

    async def twin(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(body, self, *args, **kwargs)

    twin.__name__ = twin.__qualname__ = f"a{body.__name__}"
    twin.__doc__ = f"``{body.__name__}``, awaitable."

    @functools.wraps(body)
    def method(*args: Any, _sync: bool | None = None, **kwargs: Any) -> Any:
        awaited = not _sync if _sync is not None else _awaited()
        return twin(*args, **kwargs) if awaited else body(*args, **kwargs)

    method.aio = twin  # type: ignore[attr-defined]  # as Prefect's own dispatched methods carry it
    return method, twin  # type: ignore[return-value]  # body's signature, plus _sync


def _no_extras(method: str, extras: dict[str, Any]) -> None:
    if extras:
        raise UsageError(f"{method}: TaoS3Bucket takes no boto3 arguments ({', '.join(sorted(extras))}); the engine "
                         "decides how each object moves — remove them")


class TaoS3Bucket(ObjectStorageBlock, WritableFileSystem):
    model_config = PICKABLE

    _block_type_name = "TAO S3 Bucket"
    _block_type_slug = "tao-s3-bucket"
    _logo_url = LOGO_URL
    _documentation_url = DOCUMENTATION_URL
    _description = ("An S3 bucket or folder for your own flows: prefect-aws S3Bucket's methods on tao-data-io's "
                    "engine. Its credentials are variable names.")
    _code_example = code_example("TaoS3Bucket", "tao_s3_bucket",
                                 'tao_s3_bucket.download_folder_to_path("datasets/coco", "coco")\n'
                                 'tao_s3_bucket.upload_from_folder("results", "runs/run-1")')

    bucket_name: str = Field(..., title="Bucket", description="The bucket's name.")
    bucket_folder: str = Field(
        "", title="Folder",
        description="The folder (key prefix) inside the bucket that every path is relative to; "
                    "empty: the whole bucket.")
    credentials: S3EnvCredentials = Field(
        default_factory=S3EnvCredentials, title="Credentials",
        description="Where the worker finds the S3 credentials (names only); the default: the AWS names.")

    @field_validator("bucket_name")
    @classmethod
    def _bucket(cls, value: str) -> str:
        bucket, slash, folder = value.partition("/")
        if slash:
            raise ValueError(f"bucket_name {value!r} holds a folder: give the bucket alone ({bucket!r}) and the folder "
                             f"({folder.strip('/')!r}) as bucket_folder")
        return parse_s3_url(f"s3://{bucket}/", field="bucket_name").bucket

    @field_validator("bucket_folder")
    @classmethod
    def _folder(cls, value: str) -> str:
        folder = value.strip("/")
        return check_relative(folder, what="bucket_folder") + "/" if folder else ""

    # ----------------------------------------------------------------- naming
    def _url(self, path: str | Path | None, *, what: str, folder: bool = False) -> S3Url:
        """The object (or, for ``folder``, the prefix) ``path`` names under :attr:`bucket_folder`;
        a path that is absolute or climbs out with ``..`` is refused naming ``what``."""
        relative = str(path or "").strip("/") if folder else str(path or "")
        if relative:
            check_relative(relative, what=what)
        elif not folder:
            raise UsageError(f"{what} is empty: give the object's path inside the bucket")
        key = self.bucket_folder + relative
        return S3Url(self.bucket_name, key + "/" if folder and relative else key)

    def _engine(self) -> TransferEngine:
        return TransferEngine(self.credentials.credentials())

    def _checked(self, summary: TransferSummary) -> TransferSummary:
        """Log the transfer in one line; raise when objects failed (complete ones were kept)."""
        self.logger.info("%s", summary.describe())
        for skipped in summary.skipped:
            self.logger.warning("skipped %s: %s", skipped.name, skipped.reason)
        if summary.skipped_unkept:
            self.logger.warning("… and %d more skipped", summary.skipped_unkept)
        if not summary.ok:
            shown = "; ".join(f"{failure.name}: {failure.reason}" for failure in summary.failed[:SHOWN_FAILURES])
            more = summary.failed_files - SHOWN_FAILURES
            raise TransferError(f"{summary.failed_files} object(s) failed from {summary.source} to "
                                f"{summary.destination}: {shown}{f'; and {more} more' if more > 0 else ''}. "
                                "Complete files were kept: run it again to retry")
        return summary

    # ----------------------------------------------------------------- download
    def download_object_to_path(self, from_path: str, to_path: str | Path | None = None,
                                **download_kwargs: Any) -> Path:
        """Download one object to a file (default: its name, in the working directory),
        atomically; an unchanged local copy is not fetched again. Returns the file's absolute path."""
        _no_extras("download_object_to_path", download_kwargs)
        url = self._url(from_path, what="from_path")
        target = Path(to_path if to_path is not None else Path(url.key).name).absolute()
        if target.is_dir():
            raise UsageError(f"to_path {str(target)!r} is a directory: give the path of the file to write, such as "
                             f"{str(target / Path(url.key).name)!r}")
        with self._engine() as engine:
            self._checked(engine.download_object(url, target, TransferOptions()))
        return target

    def download_object_to_file_object(self, from_path: str, to_file_object: BinaryIO,
                                       **download_kwargs: Any) -> BinaryIO:
        """Write one object's bytes to an open binary file (a buffer, a socket); returns it."""
        _no_extras("download_object_to_file_object", download_kwargs)
        with self._engine() as engine:
            engine.read_into(self._url(from_path, what="from_path"), to_file_object)
        return to_file_object

    def download_folder_to_path(self, from_folder: str, to_folder: str | Path | None = None,
                                **download_kwargs: Any) -> Path:
        """Sync the objects under a folder into a local directory (default: the working
        directory): each file whole or not at all, none outside it, unchanged files not fetched.
        Returns the directory's absolute path."""
        _no_extras("download_folder_to_path", download_kwargs)
        target = Path(to_folder if to_folder is not None else "").absolute()
        with self._engine() as engine:
            self._checked(engine.download_prefix(self._url(from_folder, what="from_folder", folder=True), target,
                                                 TransferOptions()))
        return target

    # ----------------------------------------------------------------- upload
    def upload_from_path(self, from_path: str | Path, to_path: str | None = None, **upload_kwargs: Any) -> str:
        """Upload one file (default key: its name); an object that already holds exactly it is
        not sent again. Returns the object's key."""
        _no_extras("upload_from_path", upload_kwargs)
        source = Path(from_path).absolute()
        if source.is_symlink():
            raise UsageError(f"from_path {str(from_path)!r} is a symlink, which is never followed: give the file it "
                             f"points to ({str(source.resolve())!r})")
        if not source.is_file():
            raise UsageError(f"from_path {str(from_path)!r} is not a regular file: give a file (upload_from_folder "
                             "uploads a directory)")
        url = self._url(to_path if to_path is not None else source.name, what="to_path")
        with self._engine() as engine:
            self._checked(engine.upload_file(source, url, TransferOptions()))
        return url.key

    def upload_from_file_object(self, from_file_object: BinaryIO, to_path: str, **upload_kwargs: Any) -> str:
        """Store the rest of an open binary file as one object; returns its key."""
        _no_extras("upload_from_file_object", upload_kwargs)
        url = self._url(to_path, what="to_path")
        with self._engine() as engine:
            engine.write_from(from_file_object, url)
        return url.key

    def upload_from_folder(self, from_folder: str | Path, to_folder: str | None = None,
                           **upload_kwargs: Any) -> str | None:
        """Sync a local directory up into a folder (default: :attr:`bucket_folder` itself):
        unchanged files are not sent, symlinks are not followed. Returns ``to_folder``, as
        prefect-aws's does."""
        _no_extras("upload_from_folder", upload_kwargs)
        source = Path(from_folder).absolute()
        if not source.is_dir():
            raise UsageError(f"from_folder {str(from_folder)!r} is not a directory: give a directory "
                             "(upload_from_path uploads a file)")
        with self._engine() as engine:
            self._checked(engine.upload_directory(source, self._url(to_folder, what="to_folder", folder=True),
                                                  TransferOptions()))
        return to_folder

    # ----------------------------------------------------------------- WritableFileSystem
    def read_path(self, path: str) -> bytes:
        """One object's bytes (a flow result, when this block is the result storage)."""
        buffer = io.BytesIO()
        self.download_object_to_file_object(path, buffer, _sync=True)
        return buffer.getvalue()

    def write_path(self, path: str, content: bytes) -> str:
        """Store ``content`` as one object; returns its key."""
        return self.upload_from_file_object(io.BytesIO(content), path, _sync=True)

    download_object_to_path, adownload_object_to_path = _twins(download_object_to_path)
    download_object_to_file_object, adownload_object_to_file_object = _twins(download_object_to_file_object)
    download_folder_to_path, adownload_folder_to_path = _twins(download_folder_to_path)
    upload_from_path, aupload_from_path = _twins(upload_from_path)
    upload_from_file_object, aupload_from_file_object = _twins(upload_from_file_object)
    upload_from_folder, aupload_from_folder = _twins(upload_from_folder)
    read_path, aread_path = _twins(read_path)
    write_path, awrite_path = _twins(write_path)
