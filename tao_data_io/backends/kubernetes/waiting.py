"""Waiting on a Job's pods with bounded patience: the tier B stage Job, and the verify verdict.

Why two budgets: time a pod spends waiting for a node or running the probe says something is
wrong after minutes (``verify_timeout``), but a first pull of a multi-GB training image takes as
long as it takes (``image_pull_timeout``), so the two are counted apart. Time a container of ours
spends moving bytes — the stage Job, tier C's in-pod stager — is not counted at all: it fails by
itself when a transfer fails, and a large input legitimately takes hours. Each look that finds
the pods somewhere new is said once (``say``), so a user sees "pulling…", "staging…",
"verifying…" rather than silence.

Pods are looked up by our own labels (job id and step), which every Kubernetes version keeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import BackendError, UsageError
from ...launch.collective import HANG_ADVICE, CollectiveVerdict, read_probe
from ...launch.probe import Check, Verdict, parse_probe_output
from .api import Api
from .kueue import held, hold_text
from .pods import Where, by_rank, condition, container, disruption, rank, verify_result, where
from .render import JOB_ID_LABEL, STEP_LABEL

Say = Callable[[str], None]
#: A pod's phase → which budget its waiting time counts against (None: not counted).
_BUDGET = {"queue": "verify", "schedule": "verify", "probe": "verify", "pull": "pull"}
#: Pods are compared by how far they got; the furthest behind decides what a look's time counts as.
_PROGRESS = ("queue", "schedule", "pull", "stage", "probe", "running", "done")
_FIRST_PAUSE = 0.5
#: How long past its own alarm a running collective probe is waited for before it counts as hung.
PROBE_GRACE_S = 60.0


class StageFailed(BackendError):
    """The tier B stage Job failed, or could not start; a retry of the same submit fails the same
    way until the cause is fixed."""


@dataclass
class WaitBudget:
    """Seconds spent waiting, by budget; exhausted once one passes its timeout. With a
    ``schedule_timeout`` (an autoscaled pool: a node may take minutes to come), waiting for a node
    counts against it rather than against ``verify_timeout``."""

    verify_timeout: float
    image_pull_timeout: float
    schedule_timeout: float | None = None
    waited: float = 0.0
    pulled: float = 0.0
    scheduled: float = 0.0

    @property
    def most(self) -> float:
        """The longest a watch under this budget can wait before one of its timeouts runs out, time
        no budget counts (a stage, a running all-reduce) aside; it can overrun by one look."""
        return self.verify_timeout + self.image_pull_timeout + (self.schedule_timeout or 0.0)

    def charge(self, phase: str, seconds: float) -> None:
        which = _BUDGET.get(phase)
        if phase in ("queue", "schedule") and self.schedule_timeout is not None:
            self.scheduled += seconds
        elif which == "verify":
            self.waited += seconds
        elif which == "pull":
            self.pulled += seconds

    def exhausted(self) -> str | None:
        if self.schedule_timeout is not None and self.scheduled > self.schedule_timeout:
            return (f"waited {self.scheduled:.0f}s to be admitted and given a node, more than pending_timeout "
                    f"({self.schedule_timeout:g}s)")
        if self.waited > self.verify_timeout:
            return (f"waited {self.waited:.0f}s for admission, a node or the probe, more than verify_timeout "
                    f"({self.verify_timeout:g}s)")
        if self.pulled > self.image_pull_timeout:
            return (f"spent {self.pulled:.0f}s pulling images, more than image_pull_timeout "
                    f"({self.image_pull_timeout:g}s)")
        return None


@dataclass
class PodWatch:
    """One Job's pods of one step (``train`` or ``stage``), looked at until a caller is done."""

    api: Api
    namespace: str
    #: The Job watched.
    name: str
    #: Its pods' ``tao-data-io/job-id`` label (the training Job's name) and ``tao-data-io/step``.
    label: str
    step: str
    budget: WaitBudget
    say: Say
    poll_seconds: float
    #: Whether tao-data-io queued this Job in Kueue (a queued target's training Job); one Kueue
    #: holds that it made to run at once is said to be Kueue's doing (:func:`.kueue.hold_text`).
    queued: bool = False
    _said: str = ""
    _pause: float = 0.0
    _last: float = field(default_factory=time.monotonic)

    def job(self) -> dict[str, Any] | None:
        return self.api.get(f"reading Job {self.namespace}/{self.name}", self.api.batch.read_namespaced_job,
                            self.name, self.namespace)

    def pods(self) -> list[dict[str, Any]]:
        return list_pods(self.api, self.namespace, self.label, self.step)

    def tick(self, places: Sequence[tuple[Mapping[str, Any], Where]], nodes: int,
             job: Mapping[str, Any]) -> str | None:
        """Say where the pods are if that changed, count the time since the last look against
        the budget of the pod furthest behind (a Job Kueue holds has none: it waits in its queue),
        and pause; the reason patience ran out, if it did."""
        now = time.monotonic()
        if not places and held(job):
            waiting = Where("queue", hold_text(self.api, job, queued=self.queued))
        else:
            waiting = Where("schedule", "no pod yet")
        behind = min((w for _, w in places), key=lambda w: _PROGRESS.index(w.phase) if w.phase in _PROGRESS else 0,
                     default=waiting)
        self.budget.charge(behind.phase, now - self._last)
        self._last = now
        text = "; ".join((f"rank {rank(pod)}: " if nodes > 1 else "") + w.text for pod, w in places) or behind.text
        if text != self._said:
            self.say(f"{self.namespace}/{self.name}: {text}")
            self._said = text
        ran_out = self.budget.exhausted()
        if ran_out is not None and behind.phase in ("queue", "schedule"):
            ran_out = f"{ran_out}: {behind.text}"  # Kueue's or the scheduler's reason, for the record
        if ran_out is None:
            self._pause = min(self.poll_seconds, (self._pause * 1.5) or min(_FIRST_PAUSE, self.poll_seconds))
            time.sleep(self._pause)
        return ran_out


def list_pods(api: Api, namespace: str, label: str, step: str) -> list[dict[str, Any]]:
    """The pods of one step of a job, by rank."""
    found = api.call(f"listing the pods of {namespace}/{label}", api.core.list_namespaced_pod, namespace,
                     label_selector=f"{JOB_ID_LABEL}={label},{STEP_LABEL}={step}")
    return by_rank(found.get("items", []))


def wait_for_verdict(watch: PodWatch, nodes: int, checks: list[Check]) -> Verdict:
    """The verdict of every rank's verify container, or the first failed one; a failed verdict
    (with ``error``) when the pod failed before its probe, or patience ran out. Never raises for
    what the job did: the caller deletes the Job on any failed verdict."""
    where_is = f"Job {watch.namespace}/{watch.name}"
    while True:
        job = watch.job()
        if job is None:
            return Verdict(ok=False, error=f"{where_is} is gone: it was deleted before its verdict")
        verdicts: dict[int, Verdict] = {}
        places = []
        for pod in watch.pods():
            if nodes == 1 and disruption(pod) and condition(job, "Failed") is None:
                continue  # preempted or evicted before its verdict: the Job controller replaces it
            result = verify_result(pod)
            who = f"rank {rank(pod)}: " if nodes > 1 else ""
            if result is not None:
                verdicts[rank(pod)] = _ranked(parse_probe_output(result[0], checks, result[1]), who)
                continue
            place = where(pod)
            if place.phase in ("failed", "fatal"):
                said = f": {place.container.message}" if place.container and place.container.message else ""
                return Verdict(ok=False, error=f"{who}{place.text}{said} (before the verify probe ran)")
            places.append((pod, place))
        failed = [verdict for _, verdict in sorted(verdicts.items()) if not verdict.ok]
        if failed:
            return failed[0]
        if len(verdicts) >= nodes:
            return verdicts[min(verdicts)]
        ended = condition(job, "Failed")
        if ended is not None:
            return Verdict(ok=False, error=f"{where_is} failed before its verdict: {ended.get('reason')}: "
                                           f"{ended.get('message', '')}")
        ran_out = watch.tick(places, nodes, job)
        if ran_out is not None:
            return Verdict(ok=False, error=f"no verdict from {where_is}: {ran_out}")


def _ranked(verdict: Verdict, who: str) -> Verdict:
    if not who:
        return verdict
    checks = [check.model_copy(update={"detail": who + check.detail}) for check in verdict.checks]
    return verdict.model_copy(update={"checks": checks, "error": who + verdict.error if verdict.error else None})


def wait_for_probe(watch: PodWatch, log_of: Callable[[Mapping[str, Any]], str],
                   timeout: float) -> list[CollectiveVerdict]:
    """Until the collective probe's Job has ended, each rank's verdict (:func:`read_probe`), by rank.
    Patience (a node for each rank, the image) counts as for the verify probe; each rank's own
    alarm bounds the all-reduce."""
    name = f"{watch.namespace}/{watch.name}"
    running_since: float | None = None
    while True:
        job = watch.job()
        if job is None:
            raise BackendError(f"the collective probe Job {name} is gone before it ended (someone deleted it); submit "
                               "again", retryable=True)
        pods = watch.pods()
        if condition(job, "Complete") is not None or condition(job, "Failed") is not None:
            return [read_probe(log_of(pod), _probe_exit(pod), rank=rank(pod)) for pod in pods] or [
                read_probe("", 1)]
        places = [(pod, where(pod)) for pod in pods]
        if places and all(w.phase in ("running", "done") for _, w in places):
            running_since = running_since or time.monotonic()
            if time.monotonic() - running_since > timeout + PROBE_GRACE_S:  # not even its own alarm ended it
                raise UsageError(f"the collective probe {name} ran {timeout:g}s without a verdict: {HANG_ADVICE}")
        ran_out = watch.tick(places, len(places) or 1, job)
        if ran_out is not None:
            raise UsageError(f"the collective probe {name} did not run: {ran_out}")


def _probe_exit(pod: Mapping[str, Any]) -> int:
    found = container(pod, "probe")
    return int(found.exit_code or 0) if found is not None and found.state == "terminated" else 1


def wait_for_stage(watch: PodWatch) -> None:
    """Until the stage Job completes; raises :class:`StageFailed` naming why it did not (its
    pods' termination messages, an image that cannot start, patience running out)."""
    name = f"{watch.namespace}/{watch.name}"
    while True:
        job = watch.job()
        if job is None:
            raise BackendError(f"the stage Job {name} is gone before it completed (someone deleted it); submit again",
                               retryable=True)
        if condition(job, "Complete") is not None:
            return
        places = [(pod, where(pod)) for pod in watch.pods()]
        stuck = [f"{w.text}: {w.container.message}" if w.container and w.container.message else w.text
                 for _, w in places if w.phase in ("failed", "fatal")]
        if condition(job, "Failed") is not None or any(w.phase == "fatal" for _, w in places):
            raise StageFailed(f"the stage Job {name} failed: {'; '.join(stuck) or 'its pods are gone'}")
        ran_out = watch.tick(places, 1, job)
        if ran_out is not None:
            raise StageFailed(f"the stage Job {name} did not start staging: {ran_out}")
