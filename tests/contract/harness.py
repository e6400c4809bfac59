"""What the conformance suite asks of each backend's adapter (:class:`Harness`): build a job's
request, launch it through the same steps the verbs take, and drive its command — print lines,
write TAO's ``status.json``, leave results, end in a given way — then say what of the job started
and what still runs.

A promise the backend cannot be made to show (an OOM kill on the fake) is named in
:attr:`Harness.cannot` with the reason, and the suite skips it saying so: never a silent pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from tao_data_io import steps, verbs
from tao_data_io.credentials import s3_credentials_from_env
from tao_data_io.launch.backend import Backend, JobDocuments, JobStatus, Submission
from tao_data_io.launch.plan import LaunchPlan, build_plan
from tao_data_io.launch.probe import Verdict
from tao_data_io.records import RecordStore
from tao_data_io.request import JobRequest
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.uris import parse_s3_url

from ..helpers import tree_digest, wait_for

#: What an adapter may be unable to show, as :attr:`Harness.cannot` names it.
Capability = Literal["signal", "oom", "deadline", "restored files"]


@dataclass(frozen=True)
class Ending:
    """How a job's command ends: it exits ``number``, is killed by signal ``number``, is killed by
    the kernel's OOM killer, or runs on past its ``compute_shape.deadline_seconds``."""

    kind: Literal["exit", "signal", "oom", "deadline"]
    number: int = 0


@dataclass(frozen=True)
class Launched:
    """A job as the suite holds it: the plan and documents it was submitted with, and what submit said."""

    plan: LaunchPlan
    documents: JobDocuments
    submission: Submission

    @property
    def job_id(self) -> str:
        return self.plan.job_id

    @property
    def ref(self) -> str:
        return self.submission.backend_ref


def launch_through_steps(request: JobRequest, backend: Backend, store: RecordStore, staging_root: Path,
                         environ: Mapping[str, str], *, tune: Callable[[LaunchPlan], LaunchPlan] | None = None,
                         ) -> tuple[Submission, LaunchPlan, JobDocuments]:
    """The submit verb's steps up to preflight and submit, without waiting for the verdict: open
    (or re-open, for a next attempt) the record, decide the tier, stage, route the results, build
    the plan (``tune`` may change it), start. A test can then look at the job at any step."""
    record = steps.open_record(request, backend, store)
    decision = steps.decide_tier(request, backend, store, record.job_id)
    staging_map = verbs.stage_inputs(request, backend, staging_root / record.job_id, tier=decision.tier,
                                     environ=environ)
    record = steps.route_outputs(store, record.job_id, environ)
    assert record.output_route is not None
    plan = build_plan(request, staging_map, decision, record, record.output_route, environ=environ)
    plan = tune(plan) if tune is not None else plan
    documents = JobDocuments(request, record)
    return steps.start(plan, backend, environ=environ, documents=documents, store=store), plan, documents


class Harness:
    """One backend, as the suite drives it. The job's command, once started, runs until
    :meth:`end` says how it ends (or its deadline passes), doing only what the suite tells it."""

    name: ClassVar[str]
    #: What this backend cannot be made to show, and why: those promises are skipped, saying so.
    cannot: ClassVar[Mapping[Capability, str]] = {}

    def __init__(self, backend: Backend, tmp_path: Path, environ: Mapping[str, str]) -> None:
        self.backend, self.tmp_path, self.environ = backend, tmp_path, dict(environ)
        self.store = RecordStore(tmp_path / "records")

    def close(self) -> None:
        """End what the test left of this backend's jobs (where the suite's test does not)."""

    def needs(self, what: Capability) -> None:
        """Skip the promise, with the reason, where this backend cannot show ``what``."""
        if what in self.cannot:
            pytest.skip(f"the {self.name} backend cannot show this: {self.cannot[what]}")

    # ------------------------------------------------------------------ the same for every backend
    def launch(self, job_id: str = "job-1", *, verify_fails: bool = False, deadline: bool = False) -> Launched:
        """Submit a job whose command waits for the suite's word (or, ``verify_fails``, whose verify
        probe finds an input it cannot read; ``deadline``: which has a deadline :meth:`pass_deadline`
        passes). Launching a job again after it ended is its next attempt."""
        request = self.request(job_id, verify_fails=verify_fails, deadline=deadline)
        submission, plan, documents = launch_through_steps(
            request, self.backend, self.store, self.tmp_path / "work", self.environ,
            tune=(lambda plan: self.tune(plan, deadline=deadline)))
        return Launched(plan, documents, submission)

    def verify(self, job: Launched) -> Verdict:
        """The verdict from inside the frame, recorded as the submit verb records it."""
        return steps.confirm(job.plan, self.backend, self.store, job.submission)

    def resubmit(self, job: Launched, **changes: Any) -> Submission:
        """The backend's submit of the same plan again (with ``changes``), as a retried task does."""
        plan = job.plan.model_copy(update=changes)
        return self.backend.submit(plan, environ=self.environ, documents=job.documents)

    def finished(self, job: Launched) -> JobStatus:
        """The job's status once it has ended, recorded as collect records it."""
        status = wait_for(f"{job.ref} to end", lambda: found if (found := self.backend.status(job.ref)).terminal
                          else None)
        steps.record_end(self.store, job.job_id, status)
        return status

    def results(self, job: Launched) -> dict[str, str] | None:
        """What the job's results directory holds (name → digest), where this host can read it."""
        path = self.backend.results_path(job.ref)
        return None if path is None else tree_digest(Path(path))

    def kept(self, job: Launched) -> Any:
        """What collect reads of an ended job beside its status and logs: here, its results."""
        return self.results(job)

    def upload_earlier_results(self, job: Launched, files: Mapping[str, bytes]) -> None:
        """Put ``files`` where the job's results go, as an earlier attempt's collect uploaded them."""
        destination = parse_s3_url(job.plan.route.destination, field="destination").as_prefix()
        client = make_s3_client(s3_credentials_from_env(self.environ))
        for name, data in files.items():
            client.put_object(Bucket=destination.bucket, Key=destination.key + name, Body=data)

    # ------------------------------------------------------------------ each backend's own
    def request(self, job_id: str, *, verify_fails: bool, deadline: bool) -> JobRequest:
        raise NotImplementedError

    def tune(self, plan: LaunchPlan, *, deadline: bool) -> LaunchPlan:
        """The plan as this backend's tests run it (a shorter deadline than a request may ask)."""
        return plan

    def unknown_ref(self) -> str:
        """A ref of this backend's form that names no job."""
        raise NotImplementedError

    def starts(self, job: Launched) -> int:
        """How many times the job's command has started."""
        raise NotImplementedError

    def running(self, job: Launched) -> list[str]:
        """What of the job still runs (processes, pods), once what is ending has had its grace."""
        raise NotImplementedError

    def print(self, job: Launched, lines: list[str]) -> None:
        """The command prints ``lines``; returns once they are in the job's log."""
        raise NotImplementedError

    def progress(self, job: Launched, events: list[dict[str, Any]]) -> None:
        """The command appends ``events`` to TAO's ``status.json`` in its results directory."""
        raise NotImplementedError

    def leave_results(self, job: Launched, files: Mapping[str, bytes]) -> None:
        """The command writes ``files`` into its results directory."""
        raise NotImplementedError

    def end(self, job: Launched, ending: Ending) -> None:
        """The command ends as ``ending`` says (not a deadline: see :meth:`pass_deadline`)."""
        raise NotImplementedError

    def pass_deadline(self, job: Launched) -> None:
        """Time passes beyond the job's deadline (a job launched with ``deadline``)."""
        raise NotImplementedError

    def found_at_start(self, job: Launched) -> set[str]:
        """The names in the results directory when the command of the latest attempt started."""
        raise NotImplementedError
