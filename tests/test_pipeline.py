"""The pipeline without an orchestrator, over the fake backend (the real frames have their own
tests): submit → RUNNING with the verdict stored; a verify failure never starts the command;
collect uploads with excludes, also after a failed job; cancel is final."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.steps import VerifyFailed, observe_and_record, wait_for_end
from tao_data_io.verbs import cancel, collect, resync, submit
from tao_data_io.records import RecordStore, open_for
from tao_data_io.request import parse_request

from .fake_backend import FakeBackend


def _request(bucket: str, job_id: str) -> Any:
    return parse_request({
        "schema_version": "1", "job_id": job_id, "image": "tao:6", "mode": "config", "config_format": "yaml",
        "command": "dino train -e {config_path}", "spec": {"train": {"epochs": 1}},
        "outputs": {"results_dir": "/results", "upload_excludes": ["*.tmp"]}}, environ={})


@pytest.fixture
def env(s3_env: dict[str, str], bucket: str) -> dict[str, str]:
    return {**s3_env, "S3_BUCKET_NAME": bucket}


def test_submit_then_collect_uploads_results_without_tao_state(env: dict[str, str], bucket: str, s3_client: Any,
                                                               tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    backend = FakeBackend(tmp_path / "results", results={"checkpoint_epoch_1.pth": b"w", "scratch.tmp": b"x",
                                                          ".tao/state.json": b"{}", "sub/.tao/x": b"y"})
    done = submit(_request(bucket, "job-ok"), backend, store, staging_root=tmp_path / "work", environ=env)
    record = store.get("job-ok")
    assert (done.backend_ref, record.state, record.backend_ref) == ("fake/job-ok", "RUNNING", "fake/job-ok")
    assert record.storage_tier == "A" and record.verify is not None and record.verify["ok"] is True
    assert record.output_route is not None and record.output_route.destination == f"s3://{bucket}/results/job-ok/"

    again = submit(_request(bucket, "job-ok"), backend, store, staging_root=tmp_path / "work", environ=env)
    assert not again.started and backend.started == ["fake/job-ok"]  # a retried submit starts nothing

    collected = collect("job-ok", backend, store, poll_seconds=0.01, environ=env)
    assert collected.state == "COMPLETE" and store.get("job-ok").state == "COMPLETE"
    keys = sorted(obj["Key"] for obj in s3_client.list_objects_v2(Bucket=bucket, Prefix="results/job-ok/")["Contents"])
    assert keys == ["results/job-ok/checkpoint_epoch_1.pth"]


def test_a_failed_job_still_uploads_and_reports_the_tail_and_the_analysis(env: dict[str, str], bucket: str,
                                                                          s3_client: Any, tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    backend = FakeBackend(tmp_path / "results", outcome="ERROR", exit_code=3)
    submit(_request(bucket, "job-bad"), backend, store, staging_root=tmp_path / "work", environ=env)
    collected = collect("job-bad", backend, store, poll_seconds=0.01, environ=env)
    assert collected.state == "ERROR" and collected.failure is not None and collected.logs_tail
    assert store.get("job-bad").state == "ERROR"
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="results/job-bad/")
    assert {obj["Key"] for obj in listed["Contents"]} == {"results/job-bad/checkpoint_epoch_1.pth",
                                                          "results/job-bad/status.json"}


def test_a_verify_failure_stops_before_the_command_and_is_recorded(env: dict[str, str], bucket: str,
                                                                   tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    backend = FakeBackend(tmp_path / "results", verify_ok=False)
    with pytest.raises(VerifyFailed, match="verify failed inside the frame"):
        submit(_request(bucket, "job-unverified"), backend, store, staging_root=tmp_path / "work", environ=env)
    record = store.get("job-unverified")
    assert record.state == "ERROR" and record.verify is not None and record.verify["ok"] is False
    assert not (tmp_path / "results" / "job-unverified").exists()  # the command never ran


def test_cancel_is_final(env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    backend = FakeBackend(tmp_path / "results", polls_until_done=1000)
    submit(_request(bucket, "job-cancel"), backend, store, staging_root=tmp_path / "work", environ=env)
    assert cancel("job-cancel", backend, store).record.state == "CANCELED"
    assert store.get("job-cancel").state == "CANCELED"
    assert collect("job-cancel", backend, store, poll_seconds=0.01, environ=env).state == "CANCELED"


def test_another_request_under_a_running_jobs_id_is_refused_before_anything_moves(env: dict[str, str], bucket: str,
                                                                                 tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    backend = FakeBackend(tmp_path / "results", polls_until_done=1000)
    submit(_request(bucket, "job-same-id"), backend, store, staging_root=tmp_path / "work", environ=env)
    other = _request(bucket, "job-same-id").model_copy(update={"image": "tao:6"})  # same identity...
    other = other.model_copy(update={"environment": {"EPOCHS": "9"}})             # ...another request
    with pytest.raises(UsageError, match="already names a different job.*its request differs"):
        submit(other, backend, store, staging_root=tmp_path / "work", environ=env)
    record = store.get("job-same-id")
    assert record.state == "RUNNING" and record.backend_config == {"results_root": str(tmp_path / "results")}


def test_a_submit_whose_job_was_taken_over_by_a_changed_request_starts_nothing(env: dict[str, str], bucket: str,
                                                                              tmp_path: Path) -> None:
    """A job that never launched may be opened again for a fixed request (its first submit failed
    staging). Should that happen while an earlier submit is still staging, the earlier one must
    not launch its stale request under the record of the new one: the launch claim refuses it."""
    store = RecordStore(tmp_path / "jobs")
    first = _request(bucket, "job-taken-over")
    fixed = first.model_copy(update={"environment": {"EPOCHS": "2"}})

    class Overtaken(FakeBackend):
        def preflight(self, plan: Any, *, documents: Any = None) -> None:
            if documents is not None and documents.request == first:
                open_for(fixed, backend=self.name, store=store)  # the other submit, mid-way through this one

    backend = Overtaken(tmp_path / "results", polls_until_done=1000)
    with pytest.raises(UsageError, match="another submit opened it for a changed request"):
        submit(first, backend, store, staging_root=tmp_path / "work", environ=env)
    assert backend.started == [] and store.get("job-taken-over").backend_config is None
    done = submit(fixed, backend, store, staging_root=tmp_path / "work", environ=env)
    assert done.started and store.get("job-taken-over").state == "RUNNING"


def test_status_from_a_backend_that_cannot_find_a_running_job_is_an_error(env: dict[str, str], bucket: str,
                                                                          tmp_path: Path) -> None:
    """Asked of a backend with no trace of a job its record calls RUNNING (another work root,
    another cluster), ``status`` says where to look instead of reporting UNKNOWN as an answer."""
    store = RecordStore(tmp_path / "jobs")
    submit(_request(bucket, "job-here"), FakeBackend(tmp_path / "results", polls_until_done=1000), store,
           staging_root=tmp_path / "work", environ=env)
    elsewhere = FakeBackend(tmp_path / "other-results")
    with pytest.raises(UsageError, match="has no trace of fake/job-here.*its record says"):
        observe_and_record(store.get("job-here"), elsewhere, store)
    assert store.get("job-here").state == "RUNNING"


def test_a_submit_that_fails_before_launch_says_why_in_the_record_and_a_retry_resumes_it(
        env: dict[str, str], bucket: str, s3_client: Any, tmp_path: Path) -> None:
    """A record left PENDING by a failed submit reads as a job about to start (and a collect of it
    as nothing wrong): the record says ERROR with the reason, and the same request submitted again
    — once the input exists — reopens it and runs the job under the same id."""
    store = RecordStore(tmp_path / "jobs")
    backend = FakeBackend(tmp_path / "results", polls_until_done=1000)
    request = _request(bucket, "job-missing-input").model_copy(update={"inputs": [
        parse_request({"schema_version": "1", "image": "i", "mode": "args", "command": "c", "args": [],
                       "inputs": [{"source": f"s3://{bucket}/later/", "kind": "folder", "target": "/data"}]},
                      environ={}).inputs[0]]})
    with pytest.raises(UsageError, match="holds no object"):
        submit(request, backend, store, staging_root=tmp_path / "work", environ=env)
    record = store.get("job-missing-input")
    assert record.state == "ERROR" and record.backend_ref is None
    assert record.message is not None and "holds no object" in record.message and "submit failed" in record.message

    s3_client.put_object(Bucket=bucket, Key="later/part-0.bin", Body=b"now it exists")
    done = submit(request, backend, store, staging_root=tmp_path / "work", environ=env)
    record = store.get("job-missing-input")
    assert done.started and record.state == "RUNNING" and backend.started == ["fake/job-missing-input"]
    assert [entry.state for entry in record.history] == ["PENDING", "ERROR", "PENDING", "PENDING", "RUNNING"]
    assert record.history[3].message == ("launched as fake/job-missing-input; "
                                         "waiting for the verdict from inside its frame")


def test_a_job_canceled_before_it_launched_is_not_launched_by_a_later_submit(env: dict[str, str], bucket: str,
                                                                            tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    backend = FakeBackend(tmp_path / "results", polls_until_done=1000)
    request = _request(bucket, "job-canceled-early")
    open_for(request, backend=backend.name, store=store)  # a submit that was canceled mid-staging
    assert cancel("job-canceled-early", backend, store).record.state == "CANCELED"
    with pytest.raises(UsageError, match="job-canceled-early was CANCELED before it launched"):
        submit(request, backend, store, staging_root=tmp_path / "work", environ=env)
    assert backend.started == [] and store.get("job-canceled-early").state == "CANCELED"


def test_waiting_shows_what_the_job_prints_once_and_a_new_watcher_goes_on_where_the_last_stopped(
        env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    backend = FakeBackend(tmp_path / "results", polls_until_done=6)
    submit(_request(bucket, "job-watched"), backend, store, staging_root=tmp_path / "work", environ=env)
    first: list[str] = []
    wait_for_end("job-watched", backend, store, poll_seconds=0.01, timeout=0, on_log=first.append)
    assert first == ["fake log line 1"]
    assert store.get("job-watched").log_cursor == "1"
    again: list[str] = []  # another watcher (a worker restarted): what is new, not the whole log again
    assert wait_for_end("job-watched", backend, store, poll_seconds=0.01, on_log=again.append).state == "COMPLETE"
    assert "\n".join(again).splitlines() == [f"fake log line {i}" for i in range(2, 7)]


def test_a_job_that_launched_is_never_recorded_as_failed_before_launch(env: dict[str, str], bucket: str,
                                                                      tmp_path: Path) -> None:
    """Once the backend has started the job, its record names it (backend_ref) whatever fails
    next — a verdict that never comes, a timeout — so cancel and collect still reach it."""
    store = RecordStore(tmp_path / "jobs")

    class VerdictNeverComes(FakeBackend):
        def verify(self, ref: str, plan: Any, *, timeout: float = 600.0) -> Any:
            raise TimeoutError("the verdict did not come in time")

    backend = VerdictNeverComes(tmp_path / "results", polls_until_done=1000)
    with pytest.raises(TimeoutError):
        submit(_request(bucket, "job-launched"), backend, store, staging_root=tmp_path / "work", environ=env)
    record = store.get("job-launched")
    assert record.backend_ref == "fake/job-launched" and record.state == "PENDING"
    assert cancel("job-launched", backend, store).record.state == "CANCELED"
    assert backend.status("fake/job-launched").state == "CANCELED"

    # A retried submit of such a job waits for its verdict, staging and starting nothing again.
    class VerdictLate(FakeBackend):
        late = True

        def verify(self, ref: str, plan: Any, *, timeout: float = 600.0) -> Any:
            if self.late:
                self.late = False
                raise TimeoutError("the verdict did not come in time")
            return super().verify(ref, plan, timeout=timeout)

    late = VerdictLate(tmp_path / "results", polls_until_done=1000)
    with pytest.raises(TimeoutError):
        submit(_request(bucket, "job-resumed"), late, store, staging_root=tmp_path / "work", environ=env)
    done = submit(_request(bucket, "job-resumed"), late, store, staging_root=tmp_path / "work", environ=env)
    assert not done.started and done.verdict.ok and late.started == ["fake/job-resumed"]
    assert store.get("job-resumed").state == "RUNNING"


def test_a_job_canceled_while_its_submit_launches_it_does_not_run(env: dict[str, str], bucket: str,
                                                                  tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")

    class CanceledMidLaunch(FakeBackend):
        def preflight(self, plan: Any, *, documents: Any = None) -> None:  # a cancel from elsewhere, now
            cancel(plan.job_id, self, store)

    backend = CanceledMidLaunch(tmp_path / "results", polls_until_done=1000)
    with pytest.raises(UsageError, match="CANCELED"):
        submit(_request(bucket, "job-raced"), backend, store, staging_root=tmp_path / "work", environ=env)
    assert store.get("job-raced").state == "CANCELED" and backend.started == []

    class CanceledWhileStarting(FakeBackend):
        def submit(self, plan: Any, **kwargs: Any) -> Any:
            done = super().submit(plan, **kwargs)
            cancel(plan.job_id, self, store)  # lands after the backend started it, before the record knows
            return done

    starting = CanceledWhileStarting(tmp_path / "results-2", polls_until_done=1000)
    with pytest.raises(UsageError, match="CANCELED"):
        submit(_request(bucket, "job-raced-2"), starting, store, staging_root=tmp_path / "work", environ=env)
    assert store.get("job-raced-2").state == "CANCELED"
    assert starting.status("fake/job-raced-2").state == "CANCELED"  # what started was stopped


def test_an_orchestrator_that_cannot_answer_does_not_stop_the_other_resyncs(env: dict[str, str], bucket: str,
                                                                            tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    backend = FakeBackend(tmp_path / "results", polls_until_done=1000)
    for job_id in ("job-a", "job-b"):
        submit(_request(bucket, job_id), backend, store, staging_root=tmp_path / "work", environ=env,
               owner="prefect-flow-run/00000000-0000-0000-0000-000000000001")

    def abandoned(owner: str) -> bool:
        raise ConnectionError("the orchestrator's API is unreachable")

    result = resync(store, backend, abandoned=abandoned, environ=env, settle_seconds=0)
    assert sorted(result.outcomes) == ["job-a", "job-b"] and result.canceled == []  # resynced, nothing canceled
