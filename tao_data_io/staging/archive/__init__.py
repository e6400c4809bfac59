"""Safe, atomic, idempotent extraction of tar (plain, gz, bz2, xz) and zip archives, local or ``s3://``.

Why each property, and how it is kept:

* **Safe.** Every member is checked before a byte of it is written, the same way for tar and
  zip (:mod:`.formats` turns both into one member shape), so an error names the member: its
  name must pass the package's one confinement check (:func:`tao_data_io.fs.confinement.check_relative`),
  symlink and hard-link targets must stay inside the destination, devices, FIFOs, sockets and
  setuid/setgid bits are refused. We never call ``tarfile.extract``/``zipfile.extract``: the
  extractor (:mod:`.extractor`) writes every file itself, with ``O_EXCL`` and through
  :func:`tao_data_io.fs.confinement.confined_path` (which never follows a symlink on the way), and creates
  symlinks only after all files, so nothing can be written through one. Modes keep the execute
  bits but never group/other write. What one archive may expand to is bounded (:mod:`.limits`).
* **Atomic.** Extraction happens in a fresh directory beside the destination (same parent, so
  same filesystem) which is renamed into place only when complete. An earlier tree is renamed
  aside, the new one renamed in, then the old one removed: the destination is never
  half-written, and a corrupt or hostile archive leaves it untouched.
* **Idempotent.** The marker (:mod:`.marker`), kept beside the tree and never inside it
  (``PARENT/.tao-data-io/NAME/extracted.json``, :func:`tao_data_io.fs.state.state_dir_for`), records
  the archive's identity (S3: bucket, key, size, ETag from one HEAD; local: size and SHA-256,
  :mod:`.sources`), ``--strip-components`` and every file with its size. A rerun with the same
  archive over a complete tree does nothing beyond the identity check; a changed archive, or a
  damaged tree (a file missing or of another size), is extracted again. Sizes, not contents, are
  checked: cheap enough to do on every run.
* **One read of S3.** Tar formats are decompressed and untarred straight from the GET body.
  Zip needs random access, so its body is copied to a temp file beside the destination
  (still one GET) and removed afterwards. We decompress ourselves rather than use tarfile's
  ``r|*``: tarfile's stream mode checks neither the gzip CRC nor a truncated end, and stops
  silently at a truncated or garbled header, so we also require tar's end-of-archive block.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...credentials import s3_credentials_from_env
from ...errors import UsageError
from ...fs.atomic import atomic_write
from ...fs.locks import destination_lock
from ...fs.temp import lock_tag, remove_stale_temps, temp_path_for
from ...reporting import Progress, ProgressCallback
from ...transfer.engine import TransferEngine
from ...uris import S3Url, is_s3_url, parse_s3_url
from .extractor import Extractor
from .formats import read_members
from .limits import ArchiveLimits, ExtractionBudget
from .marker import MARKER_FORMAT, marker_path, read_destination, reason_to_extract, tool_version
from .sources import Source, local_source, s3_source

__all__ = ["ArchiveLimits", "ExtractResult", "extract_archive", "marker_path"]


@dataclass(frozen=True)
class ExtractResult:
    """What an extraction did, as plain data a CLI prints and a Prefect task shows."""

    archive: str
    destination: Path
    #: False when the destination already held this archive, complete: nothing was written.
    extracted: bool
    #: Why it was (or was not) extracted, e.g. "archive changed" or "tree damaged: a.txt is missing".
    reason: str
    files: int
    bytes: int
    marker: Path

    def to_dict(self) -> dict[str, Any]:
        return {"archive": self.archive, "destination": str(self.destination), "extracted": self.extracted,
                "reason": self.reason, "files": self.files, "bytes": self.bytes, "marker": str(self.marker)}

    def describe(self) -> str:
        """One human line, e.g. for the CLI or a Prefect artifact title."""
        if self.extracted:
            return (f"{self.archive} → {self.destination}: extracted {self.files} files ({self.bytes:,} bytes); "
                    f"{self.reason}")
        return (f"{self.archive} → {self.destination}: already extracted ({self.files} files, {self.bytes:,} bytes); "
                "nothing to do")


def extract_archive(archive: str | S3Url, destination: str | os.PathLike[str], *, strip_components: int = 0,
                    engine: TransferEngine | None = None, environ: Mapping[str, str] | None = None,
                    progress: ProgressCallback | None = None, limits: ArchiveLimits | None = None) -> ExtractResult:
    """Extract ``archive`` (a local path, ``s3://bucket/key``, or that URL already parsed) so that
    ``destination`` holds exactly its members, or leave ``destination`` as it was.

    An ``s3://`` archive is read through ``engine`` (the caller's), or an engine built from
    ``environ``'s credentials and closed afterwards. ``progress`` sees files and bytes as they
    are written (the totals are unknown until the end: an archive is a stream). Raises
    :class:`UsageError` (or its subclass :class:`UnsafePathError`) for a bad, hostile, corrupt or
    unsupported archive, naming it and the offending member.
    """
    if isinstance(archive, str) and is_s3_url(archive):
        archive = parse_s3_url(archive, field="archive")
    if isinstance(archive, S3Url) and engine is None:
        with TransferEngine(s3_credentials_from_env(environ)) as own:
            return extract_archive(archive, destination, strip_components=strip_components, engine=own,
                                   progress=progress, limits=limits)
    if strip_components < 0:
        raise UsageError(f"strip_components {strip_components} must be 0 or more: it is how many leading path "
                         "components to drop from every member")
    dest = Path(os.path.abspath(destination))
    # Every writer of a destination holds its lock (the engine's syncs too): two extractions into
    # one place wait for each other, and the sweep below only ever meets abandoned temp names.
    with destination_lock(dest) as lock:
        return _extract_locked(archive, dest, strip_components, engine, progress, limits or ArchiveLimits.from_env(),
                               lock_tag(lock))


def _extract_locked(archive: str | S3Url, dest: Path, strip_components: int, engine: TransferEngine | None,
                    progress: ProgressCallback | None, limits: ArchiveLimits, tag: str) -> ExtractResult:
    """Extract under the destination's lock, whose :func:`~tao_data_io.fs.temp.lock_tag` is ``tag``
    (it names this extraction's temp directories, so only this lock's holders ever sweep them)."""
    marker = marker_path(dest)
    remove_stale_temps(dest, tag)  # what a killed extraction (or zip spool) left beside dest
    previous = read_destination(dest, marker)
    if isinstance(archive, S3Url):
        assert engine is not None
        source = s3_source(archive, engine.client)
    else:
        source = local_source(Path(archive), dest)
    reason = reason_to_extract(previous, source.identity, strip_components, dest)
    if reason is None:
        assert previous is not None  # an up-to-date tree has a marker
        files = previous["files"]
        return ExtractResult(source.label, dest, False, "up to date", len(files), sum(e.get("size", 0) for e in files),
                             marker)

    dest.parent.mkdir(parents=True, exist_ok=True)
    work = temp_path_for(dest, tag)
    work.mkdir()
    try:
        entries = _extract_into(source, work, dest, strip_components, progress,
                                limits.budget(int(source.identity["size"]), source.label), tag)
        total = sum(entry.get("size", 0) for entry in entries)
        record = {"format": MARKER_FORMAT, "tool": f"tao-data-io {tool_version()}", "source": source.label,
                  "archive": source.identity, "strip_components": strip_components, "files": entries, "bytes": total}
        # "installing" first: a kill between the swap and the final marker is seen as interrupted
        # (re-extract), never mistaken for a finished tree of the same shape.
        atomic_write(marker, json.dumps({**record, "status": "installing"}, indent=1).encode())
        _install(work, dest, tag)
        atomic_write(marker, json.dumps({**record, "status": "complete"}, indent=1).encode())
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return ExtractResult(source.label, dest, True, reason, len(entries), total, marker)


def _extract_into(source: Source, work: Path, dest: Path, strip_components: int,
                  progress: ProgressCallback | None, budget: ExtractionBudget, tag: str) -> list[dict[str, Any]]:
    extractor = Extractor(work, source.label, dest, strip_components, budget, progress)
    with source.open() as raw:
        read_members(raw, source.label, dest, tag, extractor.add)
    entries = extractor.finish()
    if extractor.progress is not None:
        extractor.progress(Progress(extractor.files_written, extractor.bytes_written, extractor.files_written,
                                    extractor.bytes_written, 0, final=True))
    return entries


def _install(work: Path, dest: Path, tag: str) -> None:
    """Put the finished tree ``work`` at ``dest`` without ever exposing a half-written tree.

    An absent or empty ``dest`` is replaced by one rename. Otherwise the old tree is renamed
    aside, the new one in, and the old one removed; if the second rename fails the old tree
    is put back.
    """
    try:
        os.rename(work, dest)
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    aside = temp_path_for(dest, tag)
    os.rename(dest, aside)
    try:
        os.rename(work, dest)
    except BaseException:
        os.rename(aside, dest)
        raise
    shutil.rmtree(aside)
