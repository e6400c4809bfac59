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
from pydantic import Field, field_validator, model_validator

from blocks.bucket import TaoS3Bucket
from blocks.picker import PICKABLE
from blocks.presentation import DOCUMENTATION_URL, LOGO_URL, code_example
from tao_data_io.records import RecordStore
from tao_data_io.uris import is_s3_url, parse_s3_url


class JobRecords(Block):
    model_config = PICKABLE

    _block_type_name = "TAO Job Records"
    _block_type_slug = "tao-job-records"
    _logo_url = LOGO_URL
    _documentation_url = DOCUMENTATION_URL
    _description = ("Where job records live: a directory (one machine), or an s3:// prefix or a TAO S3 Bucket "
                    "block every worker and pod shares.")
    _code_example = code_example("JobRecords", "job_records",
                                 "store = job_records.store()  # the core's RecordStore\n"
                                 'print([record.job_id for record in store.list_records(state="RUNNING")])')

    location: str | None = Field(
        None, title="Location",
        description="An absolute directory (or ~/…), or s3://BUCKET/PREFIX/. Empty: $TAO_DATA_IO_RECORDS, else "
                    "~/.tao-data-io/jobs on the worker.")
    bucket: TaoS3Bucket | None = Field(
        None, title="Bucket",
        description="A TAO S3 Bucket block whose folder holds the records, with its own credentials; instead of a "
                    "location.")

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

    @model_validator(mode="after")
    def _one_place(self) -> JobRecords:
        if self.bucket is not None and self.location is not None:
            raise ValueError(f"location {self.location!r} and bucket both say where the records live: keep one")
        return self

    def store(self, environ: Mapping[str, str] | None = None) -> RecordStore:
        """The record store, opened with the S3 credentials of ``environ`` when it is a prefix —
        or, in a nested bucket block's folder, with that block's credentials."""
        if self.bucket is not None:
            return RecordStore(f"s3://{self.bucket.bucket_name}/{self.bucket.bucket_folder}",
                               environ=self.bucket.credentials.environ(environ))
        local = self.location and not is_s3_url(self.location)
        root = str(Path(self.location).expanduser()) if local else self.location
        return RecordStore(root, environ=environ)
