"""The Prefect tasks that wait on a backend wait as long as the backend's own bounds allow, as the
CLI does: a flow over the Kubernetes stand-in whose tier B stage Job, collective probe or wait for
a node outlasts what a launch step is given for its own work (``tasks.policy.LAUNCH``, lowered
here to seconds) still completes, since no bound of the backend has passed (issue 41, item 9).

Each wait is held by the stand-in's script (one step per look at the Job, a look at most every
``POLL`` seconds), so it lasts longer than the lowered allowance whatever the machine's speed;
nothing here measures time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.states import State

from tao_data_io import verbs
from tao_data_io.backends.kubernetes.backend import DEFAULT_IMAGE_PULL_TIMEOUT_S, KubernetesBackend
from tao_data_io.backends.kubernetes.render import COLLECTIVE_TIMEOUT_S
from tao_data_io.backends.kubernetes.settings import KubernetesSettings
from tao_data_io.backends.kubernetes.waiting import PROBE_GRACE_S
from tao_data_io.launch.backend import DEFAULT_VERIFY_TIMEOUT_S, Backend, Waits
from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.backends.kubernetes.names import object_names
from tao_data_io.records import OutputRoute
from tao_data_io.request import JobRequest, parse_request
from tasks import launch, policy, runner
from tasks.runner import prefect_runner

from . import kube_cluster as cluster
from .fake_backend import FakeBackend
from .helpers import args_request
from .kube.apiserver import KubeStandIn
from .kube_helpers import plan_for, req
from .kube_cluster import ENV, SECRETS, STAGER, TIER_A, TIER_B, claim, job_request, store_in

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = cluster.kube, cluster.input_bucket

pytestmark = pytest.mark.usefixtures("prefect_harness")

#: The longest pause between two looks at a Job's pods, and how many looks a wait is held for:
#: together half as long again as :data:`LOWERED`.
POLL = 0.25
HELD = 24
#: What the launch steps are given here besides the backend's waits (``policy.LAUNCH``): enough
#: for a preflight and a few creates against the stand-in.
LOWERED = 4.0


def _lower_launch_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch steps' own allowance lowered to :data:`LOWERED` seconds, and with it any fixed
    timeout the launch and verify tasks declare (what they read before their timeouts followed the
    backend's waits) — with no retry, so a cut attempt fails the flow at once: a retry resumes the
    same wait (or, for the probe, starts it again) and is cut alike, only later."""
    monkeypatch.setattr(policy, "LAUNCH", LOWERED)
    for task in (launch.start, launch.confirm):
        monkeypatch.setattr(task, "timeout_seconds", LOWERED)
        monkeypatch.setattr(task, "retries", 0)


def _backend(**settings: Any) -> KubernetesBackend:
    return KubernetesBackend(KubernetesSettings(**{"stager_image": STAGER, **settings}), pod_poll_seconds=POLL,
                             say=lambda _: None)


def _submit_flow(request: JobRequest, backend: Backend, tmp_path: Path, environ: dict[str, str]) -> State:
    """The submit verb run by the Prefect runner in a flow, as ``submit-tao-job`` runs it."""

    @flow(name="submit-over-the-stand-in")
    def submitting() -> dict[str, Any]:
        return verbs.submit(request, backend, store_in(tmp_path), staging_root=tmp_path / "work", environ=environ,
                            reporter="flow", run=prefect_runner).to_dict()

    return submitting(return_state=True)


def test_a_stage_longer_than_the_launch_timeout_is_not_cut_by_prefect(kube: KubeStandIn, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Tier B's stage Job moves a dataset for as long as it takes (its transfer ends the wait
    when it fails); the launch task must not end it sooner."""
    kube.server.store(claim())
    kube.server.control.scripts[object_names("job-1").stage] = ["pulling", *["running"] * HELD, "succeeded"]
    _lower_launch_timeouts(monkeypatch)
    state = _submit_flow(job_request(**TIER_B), _backend(pvc_claim="tao-data"), tmp_path, ENV)
    assert state.is_completed(), state.message
    assert store_in(tmp_path).get("job-1").state == "RUNNING"


def test_a_collective_probe_longer_than_the_launch_timeout_is_not_cut_by_prefect(
        kube: KubeStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-node job's collective probe waits for two nodes (``verify_timeout``), its image
    (``image_pull_timeout``) and its all-reduce (its own alarm) before the training Job exists."""
    kube.server.control.scripts[object_names("job-1").probe] = [*["unschedulable"] * HELD, "pulling", "running",
                                                                 "succeeded"]
    _lower_launch_timeouts(monkeypatch)
    state = _submit_flow(job_request(compute_shape={"gpus": 8, "nodes": 2}), _backend(), tmp_path, ENV)
    assert state.is_completed(), state.message
    assert store_in(tmp_path).get("job-1").state == "RUNNING"


def test_an_admission_wait_longer_than_the_launch_timeout_is_not_cut_by_prefect(
        kube: KubeStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an autoscaled pool the training pod may wait for a node up to ``pending_timeout``
    (then for its image and its verdict): the verify task must wait as long."""
    kube.server.store(claim())
    kube.server.control.scripts["job-1"] = [*["unschedulable"] * HELD, "pulling", "verifying", "verified", "running"]
    _lower_launch_timeouts(monkeypatch)
    backend = _backend(pvc_claim="tao-data", capacity="autoscaled", pending_timeout=3600)
    state = _submit_flow(job_request(**TIER_A), backend, tmp_path, SECRETS)  # results stay in the pod: no stager
    assert state.is_completed(), state.message
    record = store_in(tmp_path).get("job-1")
    assert record.state == "RUNNING" and record.storage_tier == "A"


# ----------------------------------------------------------------------------- what each backend says
EPHEMERAL = OutputRoute(route="ephemeral", destination="container-local", reason="neither variable is set")
#: One budget's patience of a backend built with the default timeouts: a node and the probe, then the pulls.
PATIENCE = DEFAULT_VERIFY_TIMEOUT_S + DEFAULT_IMAGE_PULL_TIMEOUT_S


@pytest.mark.parametrize(("tier", "shape", "route", "settings", "submit", "verify"), [
    ("A", {}, EPHEMERAL, {}, 0.0, PATIENCE),
    ("A", {}, EPHEMERAL, {"capacity": "autoscaled", "pending_timeout": 7200}, 0.0, PATIENCE + 7200),
    ("A", {"gpus": 8, "nodes": 2}, EPHEMERAL, {}, PATIENCE + COLLECTIVE_TIMEOUT_S + PROBE_GRACE_S, PATIENCE),
    ("A", {"gpus": 8, "nodes": 2}, EPHEMERAL, {"collective_probe": False}, 0.0, PATIENCE),
    ("A", {}, None, {}, 0.0, None),  # results uploaded: the pods' stager restores and checks first
    ("B", {}, EPHEMERAL, {"pvc_claim": "tao-data"}, None, PATIENCE),
    ("C", {}, EPHEMERAL, {}, 0.0, None),
], ids=["tier-a", "autoscaled", "probe", "no-probe", "uploads", "tier-b", "tier-c"])
def test_the_kubernetes_backend_says_how_long_its_submit_and_verify_may_wait(
        tmp_path: Path, tier: str, shape: dict[str, int], route: OutputRoute | None, settings: dict[str, Any],
        submit: float | None, verify: float | None) -> None:
    plan, _ = plan_for(req(compute_shape={"gpus": 1, **shape}), tmp_path, tier, route)
    assert _backend(**settings).waits(plan) == Waits(submit=submit, verify=verify)


def test_the_local_backend_says_how_long_its_submit_and_verify_may_wait(tmp_path: Path) -> None:
    from tao_data_io.backends.local.backend import LocalBackend

    backend = LocalBackend(LocalSettings(run_root=str(tmp_path / "runs")))
    plan, _ = plan_for(req(), tmp_path, "A", EPHEMERAL)
    waits = backend.waits(plan)
    assert waits.submit is not None and waits.verify is not None and waits.verify > DEFAULT_VERIFY_TIMEOUT_S
    again = plan.model_copy(update={"attempt": 2, "restore_from": "s3://tao-results/results/job-1/"})
    assert backend.waits(again).submit is None  # the earlier attempt's results are restored first: a transfer


def test_each_launch_tasks_timeout_is_the_backends_wait_and_the_steps_own_allowance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner times the launch and verify tasks by ``backend.waits(plan)`` for each call: a
    wait with a bound gets it and ``LAUNCH``; one without, no timeout at all."""
    timeouts: dict[str, float | None] = {}

    def recording(task: Any, wait: float | None) -> Any:
        timed = policy.waiting(task, wait)
        timeouts[task.name] = timed.timeout_seconds
        return timed

    class Waiting(FakeBackend):
        def waits(self, plan: Any) -> Waits:
            return Waits(submit=30.0, verify=None)

    monkeypatch.setattr(runner, "waiting", recording)
    _lower_launch_timeouts(monkeypatch)
    state = _submit_flow(parse_request(args_request(job_id="job-timed")), Waiting(tmp_path / "results"), tmp_path, {})
    assert state.is_completed(), state.message
    assert timeouts == {"start": 30.0 + LOWERED, "confirm": None}
