"""``cancel-tao-job``: stop a job and everything it started; its record says CANCELED and who
asked. Of a job that already ended, only what it left running is ended.

The flow is the verb :func:`tao_data_io.verbs.cancel`, run with the Prefect runner.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows import common
from flows.common import DEFAULT_RECORDS, DEFAULT_TARGET, REPORTER, Records, S3Credentials, Target, prepare
from tao_data_io.forms import GuardedText
from tao_data_io.verbs import cancel
from tasks.masking import job_run_name, mask_parameters_of_crashed_run, masking_failures


@flow(name="cancel-tao-job", flow_run_name=job_run_name("cancel"), persist_result=True, result_serializer="json",
      validate_parameters=False, on_crashed=[mask_parameters_of_crashed_run])
@masking_failures
def cancel_tao_job(job_id: GuardedText, target: Target = DEFAULT_TARGET, records: Records = DEFAULT_RECORDS,
                   s3_credentials: S3Credentials = None, reason: GuardedText | None = None) -> dict[str, Any]:
    """Cancel a job: its frame or Kubernetes objects go, freeing what it holds.

    Args:
        job_id: the job, as submit-tao-job returned it.
        target: the compute target block it runs on.
        records: the job records block.
        s3_credentials: an S3 credentials block (records on S3); empty: the AWS names.
        reason: why, for the record (empty: "canceled by flow run cancel-<job id>").
    """
    setup = prepare(target, records, s3_credentials)
    return cancel(job_id, setup.backend, setup.store, reporter=REPORTER,
                  reason=reason or f"by flow run cancel-{job_id}", run=common.RUN).to_dict()
