"""``resync-tao-outputs``: for every RUNNING job in the record store, upload what is new in its
results — what an interval schedule runs while jobs train, so a lost pod or host loses at most
one interval of results.

Overlap is safe twice over: the deployment allows one run at a time (a late run is cancelled,
not queued), and each job's upload lock (a file lock beside directory records, a lease object
beside S3 records, each renewed only while its upload moves: docs/records.md) makes a resync that
finds another upload of the job leave at once. Only
changed files move, so the flow's cost is Prefect's start-up plus one listing per job.

The flow is the verb :func:`tao_data_io.verbs.resync`, run with the Prefect runner.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows import common
from flows.common import DEFAULT_RECORDS, DEFAULT_TARGET, SOURCE, Records, S3Credentials, Target, prepare
from tao_data_io.errors import TaoDataIOError
from tao_data_io.verbs import resync
from tasks.masking import mask_parameters_of_crashed_run, masking_failures, started_run_name
from tasks.owners import canceled


class ResyncFailed(TaoDataIOError):
    """Some running jobs could not be resynced; the others were."""


@flow(name="resync-tao-outputs", flow_run_name=started_run_name("resync", "target"), persist_result=True,
      result_serializer="json", validate_parameters=False, on_crashed=[mask_parameters_of_crashed_run])
@masking_failures
def resync_tao_outputs(target: Target = DEFAULT_TARGET, records: Records = DEFAULT_RECORDS,
                       s3_credentials: S3Credentials = None, settle_seconds: float | None = None) -> dict[str, Any]:
    """Upload what is new in the results of every RUNNING job on the target (a RUNNING job the
    target has no trace of is counted, and named in the run's log, not resynced); a RUNNING job
    whose owning flow run was canceled is canceled.

    Args:
        target: the compute target block whose jobs to resync.
        records: the job records block.
        s3_credentials: an S3 credentials block; empty: the AWS names.
        settle_seconds: leave files modified this recently for the next run (empty: the core's default).
    """
    setup = prepare(target, records, s3_credentials)
    resynced = resync(setup.store, setup.backend, settle_seconds=settle_seconds, environ=setup.credentials,
                      abandoned=canceled, source=SOURCE, run=common.RUN)
    get_run_logger().info("%s", resynced.describe())
    if resynced.failed:
        jobs = len(resynced.outcomes) + len(resynced.failed)
        raise ResyncFailed(f"the resync of {len(resynced.failed)} of {jobs} running jobs failed: "
                           f"{', '.join(sorted(resynced.failed))}; the next scheduled run tries them again (see each "
                           "task run)")
    return resynced.to_dict()
