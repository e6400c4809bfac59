"""A backend that runs nothing: for flow and pipeline tests (and bench/flows.py) that must not need
a sandbox. It lives with the tests because the product must not know it: no backend name, no
registry entry, no ``ClusterFacts.backend`` of its own.

Why it is honest: it goes through the same protocol as the real backends (the conformance suite,
tests/test_backend_contract.py, runs over it), keeps per-job state, is idempotent on submit (a
next attempt starts once the earlier one ended, what earlier attempts uploaded restored first),
starts the command only once its verdict passed, writes the files a job would write into a real
results directory on this machine (so collect uploads real bytes), and can be told to fail
verification or the job, or what the job prints.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tao_data_io.errors import BackendError, UsageError
from tao_data_io.fs.reading import read_job_file
from tao_data_io.launch.backend import (DEFAULT_VERIFY_TIMEOUT_S, FailureAnalysis, JobDocuments, JobStatus, LogChunk,
                                        Submission, Waits)
from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.launch.probe import CheckResult, Verdict, checklist
from tao_data_io.launch.training import STATUS_FILE, STATUS_TAIL_BYTES
from tao_data_io.outputs import restore_results
from tao_data_io.tier import Capabilities, ClusterFacts


class FakeBackend:
    name = "fake"
    stages_on_host = True

    def __init__(self, results_root: str | Path, *, verify_ok: bool = True, outcome: str = "COMPLETE",
                 exit_code: int = 0, polls_until_done: int = 1, results: Mapping[str, bytes] | None = None,
                 fail_submits: int = 0) -> None:
        self.results_root = Path(results_root)
        self.verify_ok, self.outcome, self.exit_code = verify_ok, outcome, exit_code
        self.polls_until_done = polls_until_done
        self.results = dict(results or {"checkpoint_epoch_1.pth": b"weights", "status.json": b"{}",
                                        ".tao/state.json": b"{}"})
        #: How many submits fail with a retryable BackendError first (a flaky API server).
        self.fail_submits = fail_submits
        self.started: list[str] = []
        self._polls: dict[str, int] = {}
        self._canceled: set[str] = set()
        #: Jobs whose end a status reported: it stands whatever the knobs say later.
        self._ended: set[str] = set()
        #: Each job's latest attempt, what was restored for it, and the attempts whose command started.
        self._attempts: dict[str, int] = {}
        self._restored: dict[str, str | None] = {}
        self._commanded: dict[str, set[int]] = {}
        #: What each job printed: a line per status poll (``fake log line N``), and what :meth:`say` adds.
        self._printed: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def config(self) -> dict[str, Any]:
        return {"results_root": str(self.results_root)}

    def facts(self) -> ClusterFacts:
        """Its own name, and the abilities ``stages_on_host`` says: a fake that stages on this host
        is decided tier B as the local frame is; one whose cluster stages fetches in its frame (tier C)."""
        return ClusterFacts(backend=self.name, capabilities=self.capabilities)

    @property
    def capabilities(self) -> Capabilities:
        """As ``stages_on_host`` says (a test turns it), and a fake runs whatever shape it is asked."""
        return Capabilities(stages_on_host=self.stages_on_host, fetches_in_frame=not self.stages_on_host,
                            binds_claims=True, multi_node=True, replaces_disrupted=True)

    def preflight(self, plan: LaunchPlan, *, documents: JobDocuments | None = None) -> None:
        return None

    def waits(self, plan: LaunchPlan) -> Waits:
        """Its submit and verify answer at once: they wait for nothing."""
        return Waits(submit=0.0, verify=0.0)

    def submit(self, plan: LaunchPlan, *, environ: Mapping[str, str] | None = None,
               documents: JobDocuments | None = None) -> Submission:
        ref = f"fake/{plan.job_id}"
        with self._lock:
            if self.fail_submits > 0:
                self.fail_submits -= 1
                raise BackendError("fake API server answered 503", retryable=True)
            earlier = self._attempts.get(ref)
            if earlier is not None and earlier >= plan.attempt:
                return Submission(backend_ref=ref, started=False, restored=self._restored[ref])
            if earlier is not None:
                if ref not in self._canceled and not self._done(ref):
                    raise UsageError(f"attempt {earlier} of {ref} is still running; cancel it before launching "
                                     f"attempt {plan.attempt}")
                self._canceled.discard(ref)
                self._ended.discard(ref)
            restored = (None if plan.restore_from is None else
                        restore_results(plan.restore_from, Path(str(self.results_path(ref))),
                                        belongs_to=plan.route.belongs_to, environ=environ))
            self._attempts[ref], self._restored[ref], self._polls[ref], self._printed[ref] = (
                plan.attempt, restored, 0, [])
            self.started.append(ref)
        return Submission(backend_ref=ref, restored=restored)

    def verify(self, ref: str, plan: LaunchPlan, *, timeout: float = DEFAULT_VERIFY_TIMEOUT_S) -> Verdict:
        checks, _ = checklist(plan)
        if self.verify_ok:
            with self._lock:  # the verdict passed: the command starts
                if ref in self._attempts:
                    self._commanded.setdefault(ref, set()).add(self._attempts[ref])
            results = [CheckResult(kind=c.kind, path=c.path, ok=True, detail="fake: assumed", subject=c.subject)
                       for c in checks]
            return Verdict(ok=True, checks=results)
        first, *rest = checks
        results = [CheckResult(kind=first.kind, path=first.path, ok=False, detail="does not exist",
                               subject=first.subject)]
        results += [CheckResult(kind=c.kind, path=c.path, ok=True, detail="fake: assumed", subject=c.subject)
                    for c in rest]
        with self._lock:
            self._canceled.add(ref)  # a failed verify releases the job; the command never ran
        return Verdict(ok=False, checks=results)

    def status(self, ref: str) -> JobStatus:
        with self._lock:
            if ref not in self._polls:
                return JobStatus(state="UNKNOWN", message=f"{ref} is not known to the fake backend")
            if ref in self._canceled:
                return JobStatus(state="CANCELED", message="canceled")
            self._polls[ref] += 1
            self._printed[ref].append(f"fake log line {self._polls[ref]}")
            done = self._done(ref)
            if done:
                self._ended.add(ref)
        if not done:
            return JobStatus(state="RUNNING", message="fake job running")
        self._write_results(ref)
        if self.outcome == "COMPLETE":
            return JobStatus(state="COMPLETE", message="exit code 0", exit_code=0)
        return JobStatus(state="ERROR", message=f"exit code {self.exit_code}", exit_code=self.exit_code,
                         err_class="ERR_PROGRAM")

    def logs(self, ref: str, tail: int | None = None) -> str:
        lines = [f"fake log line {i}" for i in range(1, 6)]
        return "\n".join(lines[-tail:] if tail else lines) + "\n"

    def cancel(self, ref: str) -> bool:
        with self._lock:
            if ref in self._polls and self._done(ref):
                return False  # it ended: nothing of it runs, and its end stands
            running = ref in self._polls and ref not in self._canceled
            self._canceled.add(ref)
        return running

    def failure_analysis(self, ref: str) -> FailureAnalysis | None:
        if self.outcome == "COMPLETE":
            return None
        return FailureAnalysis(err_class="ERR_PROGRAM", reason=f"the command exited {self.exit_code}",
                               suggestion="read the last lines of the log")

    def results_path(self, ref: str) -> str | None:
        return str(self.results_root / ref.split("/", 1)[1])

    def follow_logs(self, ref: str, cursor: str | None) -> LogChunk:
        """What the job printed (a line per status poll so far, ``fake log line N``, and what
        :meth:`say` added) past the cursor, which is the number of lines shown."""
        with self._lock:
            printed = list(self._printed.get(ref, []))
        shown = int(cursor) if cursor and cursor.isdigit() else 0
        return LogChunk(text="".join(line + "\n" for line in printed[shown:]), cursor=str(max(shown, len(printed))))

    def training_status(self, ref: str) -> bytes | None:
        return read_job_file(Path(str(self.results_path(ref))), STATUS_FILE, limit=STATUS_TAIL_BYTES)

    # ------------------------------------------------------------------ the tests' knobs
    def say(self, ref: str, lines: list[str]) -> None:
        """The job prints ``lines``."""
        with self._lock:
            self._printed[ref].extend(lines)

    def running(self, ref: str) -> bool:
        """Whether the job was started and has not ended (or been canceled)."""
        with self._lock:
            return ref in self._polls and ref not in self._canceled and not self._done(ref)

    def commands_started(self, ref: str) -> int:
        """How many attempts of the job had their command started (their verdict passed)."""
        with self._lock:
            return len(self._commanded.get(ref, ()))

    def _done(self, ref: str) -> bool:
        return ref in self._ended or self._polls[ref] >= self.polls_until_done

    def _write_results(self, ref: str) -> None:
        root = Path(str(self.results_path(ref)))
        for relative, data in self.results.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
