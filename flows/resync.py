"""``resync-tao-outputs``: for every RUNNING job in the record store, upload what is new in its
results — what an interval schedule runs while jobs train, so a lost pod or host loses at most
one interval of results.

Overlap is safe twice over: the deployment allows one run at a time (a late run is cancelled,
not queued), and each job's upload lock (a file lock beside directory records, a lease object
beside S3 records, each renewed only while its upload moves: docs/records.md) makes a resync that
finds another upload of the job leave at once. Only
changed files move, so the flow's cost is Prefect's start-up plus one look and one listing per job.

A job the records say is RUNNING but its backend says has ended — submitted with
``submit-tao-job`` alone, or its collect gave up or died — is resynced once more and its end
recorded; the run says so, a warning unless it completed, naming the collect that uploads the
rest (or the run that watches it and will), and shows it as the ``ended-<job>`` artifact.

The flow is the verb :func:`tao_data_io.verbs.resync`, run with the Prefect runner.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows import common
from flows.common import DEFAULT_RECORDS, DEFAULT_TARGET, REPORTER, Records, S3Credentials, Target, prepare
from tao_data_io.errors import TaoDataIOError
from tao_data_io.verbs import Ended, resync
from tasks.masking import mask_parameters_of_crashed_run, masking_failures, run_mask, started_run_name
from tasks.owners import canceled, watching
from tasks.reports import ended_line, ended_report


class ResyncFailed(TaoDataIOError):
    """Some running jobs could not be resynced; the others were."""


@flow(name="resync-tao-outputs", flow_run_name=started_run_name("resync", "target"), persist_result=True,
      result_serializer="json", validate_parameters=False, on_crashed=[mask_parameters_of_crashed_run])
@masking_failures
def resync_tao_outputs(target: Target = DEFAULT_TARGET, records: Records = DEFAULT_RECORDS,
                       s3_credentials: S3Credentials = None, settle_seconds: float | None = None) -> dict[str, Any]:
    """Upload what is new in the results of every RUNNING job on the target (a RUNNING job the
    target has no trace of is counted, and named in the run's log, not resynced); a RUNNING job
    whose owning flow run was canceled is canceled; one that has ended has its end recorded and
    told (the ``ended-<job>`` artifact: what to do next).

    Args:
        target: the compute target block whose jobs to resync.
        records: the job records block.
        s3_credentials: an S3 credentials block; empty: the AWS names.
        settle_seconds: leave files modified this recently for the next run (empty: the core's default).
    """
    setup = prepare(target, records, s3_credentials)
    resynced = resync(setup.store, setup.backend, settle_seconds=settle_seconds, environ=setup.credentials,
                      abandoned=canceled, reporter=REPORTER, run=common.RUN)
    get_run_logger().info("%s", resynced.describe())
    for ended in resynced.ended.values():
        tell_the_end(ended)
    if resynced.failed:
        jobs = len(resynced.outcomes) + len(resynced.failed)
        raise ResyncFailed(f"the resync of {len(resynced.failed)} of {jobs} running jobs failed: "
                           f"{', '.join(sorted(resynced.failed))}; the next scheduled run tries them again (see each "
                           "task run)")
    return resynced.to_dict()


def tell_the_end(ended: Ended) -> None:
    """Say that a job the records said was RUNNING has ended (a warning unless it completed) and
    what to do next — a collect, unless a run that watches it does that — in the run's log and as
    its ``ended-<job>`` artifact: the only place a job submitted alone has its end told."""
    watcher = ended.owner if ended.owner is not None and _watched(ended.owner) else None
    get_run_logger().log(logging.INFO if ended.status.state == "COMPLETE" else logging.WARNING, "%s",
                         ended_line(ended.job_id, ended.status, watcher))
    create_markdown_artifact(run_mask()(ended_report(ended.job_id, ended.status, watcher)),
                             key=f"ended-{ended.job_id}", description=f"Job {ended.job_id} ended {ended.status.state}")


def _watched(owner: str) -> bool:
    """Whether the job's owner still runs; an orchestrator that cannot answer says no (a collect
    more is harmless: it finds the end recorded and the results uploaded)."""
    try:
        return watching(owner)
    except Exception as exc:  # noqa: BLE001 - what to advise must not fail the resync
        get_run_logger().debug("could not ask whether %s still runs: %s", owner, exc)
        return False
