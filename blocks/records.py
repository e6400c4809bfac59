"""Where job records live, as a block: a directory on one machine, or an ``s3://`` prefix that
every worker and pod of a deployment shares.

Why a block: submit, collect and the resync schedule run in different flow runs (and, on
Kubernetes, in different pods); naming one records block in each deployment makes them read and
write the same records. The block holds the location only; S3 credentials come from the flow
run's credential blocks when the store is opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field, field_validator

from blocks.picker import PICKABLE
from tao_data_io.records import RecordStore
from tao_data_io.uris import is_s3_url, parse_s3_url


class JobRecords(Block):
    model_config = PICKABLE

    _block_type_name = "TAO Job Records"
    _block_type_slug = "tao-job-records"
    _description = ("Where job records live: a directory (one machine) or an s3:// prefix shared by every worker "
                    "and pod of a deployment.")

    location: str | None = Field(
        None, title="Location",
        description="An absolute directory (or ~/…), or s3://BUCKET/PREFIX/. Empty: $TAO_DATA_IO_RECORDS, else "
                    "~/.tao-data-io/jobs on the worker.")

    @field_validator("location")
    @classmethod
    def _location(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if is_s3_url(value):
            parse_s3_url(value, field="location")
        elif not Path(value).expanduser().is_absolute():
            raise ValueError(f"location {value!r} is neither s3://BUCKET/PREFIX/ nor an absolute directory")
        return value

    def store(self, environ: Mapping[str, str] | None = None) -> RecordStore:
        """The record store, opened with the S3 credentials of ``environ`` when it is a bucket."""
        root = str(Path(self.location).expanduser()) if self.location and not is_s3_url(self.location) else self.location
        return RecordStore(root, environ=environ)
