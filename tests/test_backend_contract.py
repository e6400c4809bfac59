"""The backend protocol's promises (:class:`~tao_data_io.launch.backend.Backend`), each stated once
and run over every backend through its adapter (:mod:`tests.contract`): the fake, the local
bubblewrap frame (real commands) and the Kubernetes stand-in (its control plane). A backend adds
one adapter to :data:`ADAPTERS` and gets every promise; what it cannot be made to show, its
adapter says (``Harness.cannot``), and that promise is skipped with the reason.

What only one backend does, and how (bubblewrap's argv, foreground deletes, a pod's grace), stays
in that backend's own tests."""

from __future__ import annotations

import inspect
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tao_data_io import verbs
from tao_data_io.credentials import S3Credentials, s3_credentials_from_env
from tao_data_io.errors import UsageError
from tao_data_io.launch.backend import Backend
from tao_data_io.launch.training import read_training_status
from tao_data_io.transfer.client import make_s3_client

from . import docker_daemon as dockerd
from . import kube_cluster as cluster
from . import slurm_cluster as slurm
from .contract.docker import DockerHarness
from .contract.fake import FakeHarness
from .contract.harness import Ending, Harness, Launched
from .contract.kubernetes import KubernetesHarness
from .contract.local import LocalHarness
from .contract.slurm import SlurmHarness
from .helpers import DEADLINE_S, wait_for

#: The stand-in cluster and its S3 input, as the Kubernetes tests have them (pytest fixtures).
kube, input_bucket = cluster.kube, cluster.input_bucket
#: The session's own Docker daemon.
docker_daemon = dockerd.docker_daemon
#: The session's own SLURM cluster.
slurm_cluster = slurm.slurm_cluster

ADAPTERS = [pytest.param("fake"), pytest.param("local"), pytest.param("kubernetes", marks=pytest.mark.kube),
            pytest.param("docker", marks=pytest.mark.docker), pytest.param("slurm", marks=pytest.mark.slurm)]
#: Where every backend's results go (a bucket of moto's S3 server): a next attempt restores from it.
RESULTS_BUCKET = "tao-results"


@pytest.fixture(scope="module")
def submit_environ(moto_credentials: S3Credentials) -> dict[str, str]:
    """The environment every backend's jobs are submitted from: results go to a bucket of moto's
    S3 server (the Kubernetes stand-in's jobs read their input there too)."""
    environ = {**cluster.SECRETS, "S3_BUCKET_NAME": RESULTS_BUCKET,
               "AWS_ENDPOINT_URL": str(moto_credentials.endpoint_url)}
    make_s3_client(s3_credentials_from_env(environ)).create_bucket(Bucket=RESULTS_BUCKET)
    return environ


@pytest.fixture(params=ADAPTERS)
def harness(request: pytest.FixtureRequest, tmp_path: Path, submit_environ: dict[str, str]) -> Iterator[Harness]:
    found: Harness
    if request.param == "fake":
        found = FakeHarness(tmp_path, submit_environ)
    elif request.param == "local":
        found = LocalHarness(request.getfixturevalue("local_backend"), tmp_path, submit_environ)
    elif request.param == "docker":
        found = DockerHarness(request.getfixturevalue("docker_daemon"), tmp_path, submit_environ)
    elif request.param == "slurm":
        found = SlurmHarness(request.getfixturevalue("slurm_cluster"), tmp_path, submit_environ)
    else:
        found = KubernetesHarness(request.getfixturevalue("kube"), tmp_path, submit_environ)
    yield found
    found.close()


def running(harness: Harness) -> Launched:
    """A job launched, verified, and its command started."""
    job = harness.launch()
    assert job.submission.started and job.plan.attempt == 1, job.submission
    verdict = harness.verify(job)
    assert verdict.ok, verdict.describe()
    started(harness, job, 1)
    return job


def started(harness: Harness, job: Launched, times: int) -> None:
    """Wait until the job reads RUNNING and its command has started ``times`` times in all."""
    wait_for(f"{job.ref} to run, its command started {times} time(s)",
             lambda: harness.backend.status(job.ref).state == "RUNNING" and harness.starts(job) == times)


def nothing_runs(harness: Harness, job: Launched) -> None:
    wait_for(f"nothing of {job.ref} to run", lambda: not harness.running(job))


# ----------------------------------------------------------------------------- the protocol itself
def test_the_backend_takes_each_call_of_the_protocol_as_the_protocol_declares_it(harness: Harness) -> None:
    """Drift guard: every method of the protocol, with its parameters' names, kinds, defaults and
    annotations — a caller written against the protocol calls every backend alike."""
    assert isinstance(harness.backend, Backend)
    declared = {name: inspect.signature(method) for name, method in vars(Backend).items()
                if inspect.isfunction(method) and not name.startswith("_")}
    for name, signature in declared.items():
        own = inspect.signature(getattr(type(harness.backend), name))
        assert [(p.name, p.kind, p.default, p.annotation) for p in own.parameters.values()] == [
            (p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()], (name, str(own))
        assert own.return_annotation == signature.return_annotation, (name, str(own))


def test_the_facts_say_what_the_backend_can_do_and_never_more(harness: Harness) -> None:
    """The tier decision reads ``facts().capabilities``, the refusals before the record reads
    ``capabilities``: the cluster at hand may offer less than the backend can (an old API server
    and tier C), never more, and the facts carry the backend's own name."""
    facts = harness.backend.facts()
    assert facts.backend == harness.backend.name
    most, here = harness.backend.capabilities.model_dump(), facts.capabilities.model_dump()
    assert all(most[ability] or not offered for ability, offered in here.items()), (most, here)


# ----------------------------------------------------------------------------- submit and verify
def test_a_resubmit_starts_nothing_while_the_job_runs_or_after_it_ended(harness: Harness) -> None:
    job = running(harness)
    again = harness.resubmit(job)
    assert (again.backend_ref, again.started) == (job.ref, False)
    harness.end(job, Ending("exit", 0))
    assert harness.finished(job).state == "COMPLETE"
    after = harness.resubmit(job)
    assert (after.backend_ref, after.started) == (job.ref, False)
    assert harness.backend.status(job.ref).state == "COMPLETE" and harness.starts(job) == 1  # it ran once


def test_a_failed_verify_means_the_command_never_started_and_nothing_is_held(harness: Harness) -> None:
    job = harness.launch(verify_fails=True)
    verdict = harness.backend.verify(job.ref, job.plan, timeout=DEADLINE_S)
    assert not verdict.ok and verdict.failures, verdict.describe()
    nothing_runs(harness, job)
    assert harness.starts(job) == 0
    assert harness.backend.status(job.ref).state in ("ERROR", "CANCELED", "UNKNOWN")
    assert harness.backend.cancel(job.ref) is False


def test_a_next_attempt_is_refused_while_the_earlier_one_runs(harness: Harness) -> None:
    """Two attempts of one job never run at once: the earlier is canceled first."""
    job = running(harness)
    kept = harness.kept(job)
    with pytest.raises(UsageError, match="cancel it"):
        harness.resubmit(job, attempt=2)
    assert harness.backend.status(job.ref).state == "RUNNING" and harness.starts(job) == 1
    assert harness.kept(job) == kept


#: What an earlier attempt uploaded (collect's upload to the job's results prefix).
EARLIER = {"checkpoint_epoch_1.pth": b"attempt 1's weights", "status.json": b'{"epoch": 1}\n'}


def _next_attempt(harness: Harness) -> tuple[Launched, Launched]:
    """A job that ran and failed, its results uploaded, launched again: its next attempt, verified."""
    job = running(harness)
    harness.end(job, Ending("exit", 1))
    assert harness.finished(job).state == "ERROR"
    harness.upload_earlier_results(job, EARLIER)
    again = harness.launch()
    assert (again.plan.attempt, again.plan.restore_from) == (2, job.plan.route.destination)
    assert (again.ref, again.submission.started) == (job.ref, True) and again.submission.restored
    assert harness.verify(again).ok
    started(harness, again, 2)
    return job, again


def test_a_next_attempt_starts_once_the_earlier_ended_and_says_what_it_restored(harness: Harness) -> None:
    job, again = _next_attempt(harness)
    record = harness.store.get(job.job_id)
    assert [(attempt.number, attempt.state) for attempt in record.attempts] == [(1, "ERROR"), (2, None)]
    assert record.attempts[1].restored == again.submission.restored


def test_a_next_attempts_command_starts_with_the_earlier_results_restored(harness: Harness) -> None:
    harness.needs("restored files")
    _, again = _next_attempt(harness)
    assert set(EARLIER) <= harness.found_at_start(again)


# ----------------------------------------------------------------------------- status, logs, progress
def test_an_unknown_ref_reads_unknown_and_cancels_nothing(harness: Harness) -> None:
    ref = harness.unknown_ref()
    assert harness.backend.status(ref).state == "UNKNOWN"
    assert harness.backend.cancel(ref) is False and harness.backend.failure_analysis(ref) is None


#: How a command ends → the state, error class and exit code its status reads, and what its message names.
ENDINGS: dict[str, tuple[Ending, str, str | None, int | None, str | None]] = {
    "exit-0": (Ending("exit", 0), "COMPLETE", None, 0, None),
    "exit-3": (Ending("exit", 3), "ERROR", "ERR_PROGRAM", 3, "3"),
    "sigkill": (Ending("signal", signal.SIGKILL), "ERROR", "ERR_INFRA", 137, "137"),
    "sigsegv": (Ending("signal", signal.SIGSEGV), "ERROR", "ERR_PROGRAM", 139, "139"),
    "oom": (Ending("oom"), "ERROR", "ERR_INFRA", 137, "OOM"),
    "deadline": (Ending("deadline"), "ERROR", "ERR_PROGRAM", None, "compute_shape.deadline_seconds"),
}


@pytest.mark.parametrize("how", list(ENDINGS))
def test_how_the_command_ended_is_classified_and_its_frame_ends_with_it(harness: Harness, how: str) -> None:
    """Exit codes, signals, the deadline and (where the backend can tell) an OOM kill: the state,
    TAO's error class, the exit code, a message that names it and an analysis with a fix; nothing
    of the job runs after its end, and what it wrote before stays (where this host reads the
    results: a Kubernetes pod's leave through its sidecar)."""
    ending, state, err_class, exit_code, names = ENDINGS[how]
    if ending.kind != "exit":
        harness.needs(ending.kind)
    job = harness.launch(deadline=ending.kind == "deadline")
    assert harness.verify(job).ok
    harness.leave_results(job, {"checkpoint_epoch_1.pth": b"weights"})
    if ending.kind == "deadline":
        harness.pass_deadline(job)
    else:
        harness.end(job, ending)
    status = harness.finished(job)
    assert (status.state, status.err_class) == (state, err_class), status
    assert exit_code is None or status.exit_code == exit_code, status
    assert names is None or re.search(rf"\b{re.escape(names)}", status.message), status
    analysis = harness.backend.failure_analysis(job.ref)
    if state == "COMPLETE":
        assert analysis is None
    else:
        assert analysis is not None and analysis.err_class == err_class and analysis.suggestion, analysis
    nothing_runs(harness, job)
    results = harness.results(job)
    assert results is None or "checkpoint_epoch_1.pth" in results


def test_following_the_log_from_a_cursor_shows_each_line_once(harness: Harness) -> None:
    """Whatever watcher looks with a recorded cursor sees each line once: none lost, none again."""
    job = running(harness)
    harness.print(job, ["epoch 1", "epoch 2"])
    first = harness.backend.follow_logs(job.ref, None)
    assert first.text.endswith("epoch 1\nepoch 2\n"), first
    assert harness.backend.follow_logs(job.ref, first.cursor).text == ""
    harness.print(job, ["epoch 3", "epoch 4"])
    later = harness.backend.follow_logs(job.ref, first.cursor)
    assert later.text == "epoch 3\nepoch 4\n"
    assert harness.backend.follow_logs(job.ref, first.cursor).text == later.text  # another watcher, the same cursor
    assert harness.backend.follow_logs(job.ref, later.cursor).text == ""


def test_progress_is_read_from_the_jobs_status_json(harness: Harness) -> None:
    job = running(harness)
    assert harness.backend.training_status(job.ref) is None  # nothing written yet
    harness.progress(job, [{"epoch": epoch, "max_epoch": 3, "status": "RUNNING", "kpi": {"loss": 1.0 / epoch}}
                           for epoch in (1, 2)])
    status = read_training_status(harness.backend.training_status(job.ref))
    assert status is not None and (status.epoch, status.max_epoch) == (2, 3), status


# ----------------------------------------------------------------------------- cancel
def test_cancel_of_a_running_job_leaves_nothing_running_and_records_canceled(harness: Harness) -> None:
    job = running(harness)
    assert harness.running(job)
    canceled = verbs.cancel(job.job_id, harness.backend, harness.store)
    assert canceled.record.state == "CANCELED" and "nothing was running" not in str(canceled.record.message)
    nothing_runs(harness, job)
    assert harness.backend.status(job.ref).state in ("CANCELED", "UNKNOWN")  # UNKNOWN: forgotten, the record says
    assert harness.backend.cancel(job.ref) is False and harness.starts(job) == 1


def test_cancel_of_an_ended_job_keeps_what_collect_reads(harness: Harness) -> None:
    job = running(harness)
    harness.print(job, ["epoch 1 done"])
    harness.progress(job, [{"epoch": 1, "max_epoch": 1, "status": "SUCCESS"}])
    harness.leave_results(job, {"checkpoint_epoch_1.pth": b"weights"})
    harness.end(job, Ending("exit", 0))
    assert harness.finished(job).state == "COMPLETE"

    def read() -> tuple[Any, ...]:
        backend = harness.backend
        return (backend.status(job.ref).to_dict(), backend.logs(job.ref), backend.training_status(job.ref),
                backend.failure_analysis(job.ref), harness.kept(job))

    before = read()
    assert harness.backend.cancel(job.ref) is False
    assert verbs.cancel(job.job_id, harness.backend, harness.store).record.state == "COMPLETE"
    assert read() == before
