"""The staging map: the contract between staging and everything after it.

The renderer mounts each source's ``sub_path`` of the job's volume at its ``container_path``;
the verify probe checks every ``container_path`` from inside the compute frame; an orchestrator
shows what moved. So it lists one entry per *distinct* source, where it went, and what staging
did — in counts, never in file lists or free text. It holds names and paths only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from ..fs.atomic import atomic_write
from ..reporting import human_size
from ..vocabulary import STAGING_MAP_NAME as STAGING_MAP_NAME  # re-exported: the name callers import from here

Kind = Literal["folder", "file", "selective", "archive", "model", "glob", "pre-positioned", "config"]


class StagedSource(BaseModel):
    """One distinct source and what staging did for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    kind: Kind
    #: Relative to the map's staging directory (one job's on a host, the claim's cache in tier B). None for tier A.
    sub_path: str | None
    container_path: str
    #: Where it is on the machine that staged it. None for tier A: that path is only known to
    #: exist inside the compute frame.
    local_path: str | None
    #: What the source holds once staged (None for tier A: never looked at here).
    files: int | None
    bytes: int | None
    #: What this run moved, and what was already right.
    transferred_files: int = 0
    transferred_bytes: int = 0
    unchanged_files: int = 0
    seconds: float = 0.0
    #: One short fact about how it was staged: a model's resolved revision, why an archive was
    #: (re)extracted. Never a list.
    note: str | None = None

    @property
    def moved(self) -> bool:
        return self.transferred_files > 0

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def describe(self) -> str:
        where = f"{self.source} → {self.container_path}"
        if self.kind == "pre-positioned":
            return f"{where}: pre-positioned (tier A), no bytes moved; verified inside the compute frame"
        if self.files is None:
            return f"{where} [{self.kind}]: " + (self.note or "not staged here")
        held = f"{self.files} files ({human_size(self.bytes or 0)})"
        moved = (f"{self.transferred_files} moved ({human_size(self.transferred_bytes)})" if self.moved
                 else "already there")
        return f"{where} [{self.kind}]: {held}, {moved}" + (f"; {self.note}" if self.note else "") + \
            (f" in {self.seconds:.2f}s" if self.seconds else "")


class StagingMap(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal["1"] = "1"
    job_id: str | None
    #: The directory the sources were staged into. A map written before the word was settled
    #: calls it ``workdir``; it still reads, so a job staged then resumes.
    staging_dir: str = Field(validation_alias=AliasChoices("staging_dir", "workdir"))
    inputs_root: str
    sources: list[StagedSource]
    #: For a map planned for the cluster: at most how many bytes its stage writes, when that could
    #: be bounded (:mod:`.sizing`); tier C's pod gets a staging volume of that size.
    planned_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def describe(self) -> str:
        moved = sum(source.transferred_files for source in self.sources)
        size = sum(source.transferred_bytes for source in self.sources)
        return f"{len(self.sources)} sources staged under {self.staging_dir}: {moved} files moved ({human_size(size)})"

    def config(self) -> StagedSource | None:
        return next((source for source in self.sources if source.kind == "config"), None)


def write_staging_map(staging_map: StagingMap, path: Path) -> None:
    """Atomic publish — a reader never sees half a map."""
    atomic_write(path, (json.dumps(staging_map.to_dict(), indent=2) + "\n").encode())


def read_staging_map(path: Path) -> StagingMap:
    return StagingMap.model_validate_json(path.read_text(encoding="utf-8"))
