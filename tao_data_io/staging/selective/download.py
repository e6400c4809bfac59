"""Downloading exactly the objects an annotation references: each reference becomes one key under
the source prefix, fetched by :meth:`~tao_data_io.transfer.engine.TransferEngine.download_keys`
without listing; a run that finds referenced objects missing either undoes what it added
(``missing="error"``) or stages the rest and writes the missing keys beside the destination
(``missing="skip"``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ...errors import TransferError, UsageError
from ...fs.atomic import atomic_write
from ...fs.state import state_dir_for
from ...fs.temp import remove_if_exists
from ...fs.tree import DestinationTree
from ...transfer.engine import TransferEngine
from ...transfer.options import TransferOptions
from ...transfer.summary import TransferSummary
from ...uris import is_s3_url, parse_s3_url
from ...vocabulary import MISSING_MODES
from .annotations import check_keys, infer_format, read_references

#: Written beside the destination (``fs.state.state_dir_for``) by ``missing="skip"``: one missing key per line.
MISSING_REPORT = "missing-references.txt"
#: How many missing keys an error message lists before giving only the total.
MISSING_SHOWN = 20


class MissingReferencesError(TransferError):
    """Referenced objects do not exist and ``missing="error"``: this run's new files were removed.
    A rerun finds the same objects missing, so it is not retried automatically."""

    retryable = False

    def __init__(self, message: str, missing: list[str] | None = None, summary: TransferSummary | None = None) -> None:
        super().__init__(message)  # the message alone: rebuilt from a stored flow result
        self.missing = missing or []
        self.summary = summary


@dataclass
class SelectiveResult:
    """What a selective download did. ``summary.failed`` holds real failures only; objects the
    annotation references but the bucket lacks are in ``missing`` (with ``missing="skip"``)."""

    annotation: str
    keys: tuple[str, ...]
    references: int
    summary: TransferSummary
    missing: list[str] = field(default_factory=list)
    missing_report: Path | None = None

    @property
    def ok(self) -> bool:
        return self.summary.ok

    def to_dict(self) -> dict[str, object]:
        return {**self.summary.to_dict(), "annotation": self.annotation, "keys": list(self.keys),
                "references": self.references, "missing": self.missing,
                "missing_report": str(self.missing_report) if self.missing_report else None}


def selective_download(engine: TransferEngine, annotation: str, keys: Sequence[str], bucket: str, src_prefix: str,
                       dest: str | os.PathLike[str], *, fmt: str | None = None, missing: str = "error",
                       options: TransferOptions | None = None) -> SelectiveResult:
    """Download into ``dest`` every object ``annotation`` references in its ``keys`` columns,
    each from ``s3://bucket/src_prefix/REFERENCE`` to ``dest/REFERENCE``, without listing.

    ``annotation`` is a local path or an ``s3://`` object (fetched to a temp file first).
    Referenced objects that do not exist: with ``missing="error"`` the files this run created
    are removed again (files that were there before are kept) and
    :class:`MissingReferencesError` is raised; with ``missing="skip"`` the rest is staged and
    the keys are written beside it, to ``PARENT/.tao-data-io/NAME/missing-references.txt``
    (:func:`tao_data_io.fs.state.state_dir_for`).
    """
    options = options or TransferOptions()
    keys = check_keys(keys)
    if missing not in MISSING_MODES:
        raise UsageError(f"missing {missing!r} is not known; use one of {', '.join(MISSING_MODES)}")
    if bucket.startswith("s3://"):
        raise UsageError(f"bucket {bucket!r} takes a bucket name, not a URL: give the bucket name and src_prefix apart")
    parse_s3_url(f"s3://{bucket}/", field="bucket")
    if is_s3_url(src_prefix):
        raise UsageError(f"src_prefix {src_prefix!r} is a key prefix inside the bucket, not a URL: "
                         "give the bucket name and src_prefix apart")
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"dest {str(dest)!r} exists and is not a directory; give a directory path")
    references = _fetch_and_read(engine, annotation, keys, fmt, options)
    prefix = src_prefix.rstrip("/") + "/" if src_prefix.strip("/") else ""
    items = [(prefix + reference, reference) for reference in references]
    before = _Before.take(dest, references)
    summary = engine.download_keys(bucket, items, dest, options)
    absent = sorted(failure.name for failure in summary.failed if failure.missing)
    summary = replace(summary, failed=[failure for failure in summary.failed if not failure.missing])
    report_path = state_dir_for(dest) / MISSING_REPORT
    if absent and missing == "error":
        removed = before.undo(dest, summary.transferred)
        more = len(absent) - MISSING_SHOWN
        shown = ", ".join(absent[:MISSING_SHOWN]) + (f", … ({more} more)" if more > 0 else "")
        raise MissingReferencesError(
            f"{len(absent)} of {len(references)} referenced objects do not exist in s3://{bucket}/{prefix}: {shown}; "
            f"removed the {removed} file(s) this run had added to {dest} (files that were there before are kept); "
            "fix the annotation, or stage the rest with missing 'skip'", absent, summary)
    if absent and not options.dry_run:
        before.prune(dest)
        _write_lines(report_path, absent)
    elif not options.dry_run:
        remove_if_exists(report_path)  # a report from an earlier run would mislead
    return SelectiveResult(annotation, keys, len(references), summary, absent,
                           report_path if absent and not options.dry_run else None)


def _fetch_and_read(engine: TransferEngine, annotation: str, keys: Sequence[str], fmt: str | None,
                    options: TransferOptions) -> list[str]:
    """Read a local annotation, or fetch an ``s3://`` one into a temp dir under its own name
    (so its extension still tells the format) and read that."""
    if not is_s3_url(annotation):
        return read_references(annotation, keys, fmt)
    url = parse_s3_url(annotation, field="annotation")
    if url.is_prefix:
        raise UsageError(f"annotation {annotation!r} names a prefix; give one object, e.g. s3://BUCKET/ann/train.parquet")
    name = url.key.rsplit("/", 1)[-1]
    fmt = fmt or infer_format(name)
    with tempfile.TemporaryDirectory(prefix="tao-data-io-annotation-") as scratch:
        target = Path(scratch) / name
        fetched = engine.download_object(url, target, TransferOptions())
        if not fetched.ok:
            failure = fetched.failed[0]
            if failure.missing:
                raise UsageError(f"annotation {annotation!r} does not exist (404); check the bucket and key")
            raise TransferError(f"annotation {annotation!r} could not be fetched: {failure.reason}")
        return read_references(target, keys, fmt, label=annotation)


@dataclass(frozen=True)
class _Before:
    """What existed under ``dest`` before a run, so a failed run can remove exactly what it
    created: its new files, then the directories (and our state dir) that appeared for them."""

    dest_existed: bool
    state_existed: bool
    files: frozenset[str]
    #: Directories that did not exist, deepest first.
    new_dirs: tuple[str, ...]

    @classmethod
    def take(cls, dest: Path, references: Sequence[str]) -> _Before:
        parents = {"/".join(parts[:i]) for parts in (r.split("/") for r in references) for i in range(1, len(parts))}
        existed = dest.exists()
        if existed:
            parents = {d for d in parents if not os.path.lexists(dest / d)}
        return cls(existed, existed and os.path.lexists(state_dir_for(dest)),
                   frozenset(r for r in references if existed and os.path.lexists(dest / r)),
                   tuple(sorted(parents, key=lambda d: -d.count("/"))))

    def undo(self, dest: Path, transferred: Iterable[str]) -> int:
        """Remove this run's new files and the directories made for them (only if empty), through
        directory descriptors — a directory swapped for a symlink meanwhile is never followed —
        and return how many files were removed."""
        created = [relative for relative in transferred if relative not in self.files]
        tree = DestinationTree(dest)
        try:
            removed = sum(tree.remove(relative) for relative in created)
            self._prune(tree)
        finally:
            tree.close()
        if not self.state_existed:
            shutil.rmtree(state_dir_for(dest), ignore_errors=True)
        if not self.dest_existed:
            with contextlib.suppress(OSError):
                os.rmdir(dest)  # only if empty: something else may live there now
        return removed

    def prune(self, dest: Path) -> None:
        """Remove the new directories left empty (made for objects that turned out missing)."""
        tree = DestinationTree(dest)
        try:
            self._prune(tree)
        finally:
            tree.close()

    def _prune(self, tree: DestinationTree) -> None:
        for directory in self.new_dirs:  # deepest first; a directory that is not empty stays
            tree.remove_empty_directory(directory)


def _write_lines(path: Path, lines: Sequence[str]) -> None:
    """Write atomically: a reader never sees half a report."""
    atomic_write(path, "".join(line + "\n" for line in lines).encode("utf-8"))
