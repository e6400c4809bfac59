"""Prefect's own UI, in headless Chromium, against the demo's stack (Prefect's server, the
project's blocks and deployments, a process worker running jobs in the local frame): what a user
does with clicks and typing, checked through Prefect's API and the job's record.

1. The run form opens each block parameter on its picker, with the deployment's block chosen and
   the block type's logo shown (served by the stack's own server: there is no internet).
   A custom run of ``submit-tao-job/local``, the request typed field by field into its JobRequest
   form and the target and records blocks picked, runs to Completed on the picked blocks.
   The block catalog shows each of the project's blocks with its logo and its whole description.
2. A credential pasted into a request field is refused by the server when the run is created: the
   UI says so, no flow run exists, and the key is nowhere in the server's database.
3. Canceling a running ``run-tao-job`` from its page cancels the flow run and the job (CANCELED in
   its record, its processes gone).
4. The collect run of a training job (the stand-in) shows the job's log lines and its training
   progress and KPI table among its artifacts; its launch report fits the artifact page's column.
5. Retrying a failed ``run-tao-job`` from its page (the training failed after writing and
   uploading a checkpoint) runs the same job again: a second attempt whose results directory was
   restored from the first's upload, and the training resumes from that checkpoint to Completed.
6. A credential pasted into a credential block's field (which holds a variable's NAME) in the
   block's form is refused when it is saved: the form says why beside each field, the server's
   answer names the fields, no block exists, and the values are nowhere in the server's database
   (block documents, events) or its log. So is one pasted while editing a saved credential block,
   which keeps its names.

Waits are bounded deadlines (a busy machine is slow), never timing assertions.
"""

from __future__ import annotations

import os
import re
import shutil
import types
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterName,
                                            FlowRunFilterParentFlowRunId)

from tao_data_io.errors import UsageError
from tao_data_io.names import job_id_for_run
from tao_data_io.records import JobRecord, RecordStore

from ..helpers import STAND_IN, job_processes, wait_for
from .stack import PICKED_RECORDS, PICKED_TARGET, PrefectStack
from .ui import (UI_TIMEOUT_MS, field, fill_request, from_run_menu, missing, open_block_form, open_custom_run, paste,
                 pick_block, save_block, shot, submit, toast)

pytestmark = [pytest.mark.browser, pytest.mark.skipif(missing() is not None, reason=str(missing())),
              # The first test also waits for the stack to come up (about a minute on two busy cores).
              pytest.mark.timeout(600)]

#: How long a flow run may take to reach a state (the worker polls every second; a flow run
#: process imports Prefect and the project first).
RUN_DEADLINE_S = 240.0
#: A well-known credential's shape (made up): an AWS access key id.
ACCESS_KEY = "AKIA" + "Q2XM7TZ4W5R6N3PL"
#: A secret without a recognisable prefix (made up): an AWS secret access key, 40 base64 characters.
SECRET_KEY = "Hx7qP2vL9/mKc4Rt8+Wn3" + "Zb6Yd1Fg5Js0Ua7Ve4X"


def _deployment(stack: PrefectStack, name: str) -> Any:
    with stack.client() as client:
        return client.read_deployment_by_name(name)


def _run_tao_job(stack: PrefectStack, request: dict[str, Any]) -> UUID:
    """A flow run of ``run-tao-job/local-run`` for ``request``, created through the API."""
    deployment = _deployment(stack, "run-tao-job/local-run")
    with stack.client() as client:
        return UUID(str(client.create_flow_run_from_deployment(deployment.id, parameters={"request": request}).id))


def _flow_run(stack: PrefectStack, flow_run_id: UUID) -> Any:
    with stack.client() as client:
        return client.read_flow_run(flow_run_id)


def _final_state(stack: PrefectStack, flow_run_id: UUID) -> str:
    def ended() -> str | None:
        run = _flow_run(stack, flow_run_id)
        return run.state.name if run.state is not None and run.state.is_final() else None

    return wait_for(f"flow run {flow_run_id} to end", ended, RUN_DEADLINE_S)


def _runs_of(stack: PrefectStack, deployment_id: UUID) -> int:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with stack.client() as client:
        return int(client.count_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))))


def _record(store: RecordStore, job_id: str) -> JobRecord | None:
    try:
        return store.get(job_id)
    except UsageError:
        return None


def _kept_by_the_server(stack: PrefectStack, *values: str) -> list[str]:
    """The files of the server's (its SQLite database, write-ahead log included, and its log)
    that hold any of ``values``."""
    kept = [*(stack.home / "prefect").glob("prefect.db*"), stack.home / "prefect-server.log"]
    assert kept
    return [f"{path.name} holds {value[:4]}…" for path in kept for value in values
            if value.encode() in path.read_bytes()]


def _block_id(stack: PrefectStack, slug_name: str) -> str:
    block_type, name = slug_name.split("/")
    with stack.client() as client:
        return str(client.read_block_document_by_name(name, block_type).id)


def test_custom_run_typed_into_the_form_completes_on_the_picked_blocks(page: Any, prefect_stack: PrefectStack,
                                                                        tmp_path: Path) -> None:
    deployment = _deployment(prefect_stack, "submit-tao-job/local")
    job_id = f"browser-form-{os.getpid()}"
    open_custom_run(page, prefect_stack.ui, deployment.id)
    fill_request(page, job_id=job_id, image="local", command="sh", mode="args",
                 args=["-c", "echo typed into the browser form"])
    pick_block(page, "target", "LocalTarget", PICKED_TARGET.split("/")[1])
    pick_block(page, "records", "JobRecords", PICKED_RECORDS.split("/")[1])
    shot(page, tmp_path / "shots", "filled")
    answer = submit(page, lambda: _runs_of(prefect_stack, deployment.id))
    assert answer.ok, f"the server answered {answer.status} to the form's Submit: {answer.text()[:2000]}"
    flow_run_id = UUID(answer.json()["id"])
    toast(page, "scheduled to start now")
    page.get_by_role("link", name="View run").or_(page.get_by_role("button", name="View run")).first.click()
    page.wait_for_url(re.compile(rf"/runs/flow-run/{flow_run_id}"))

    assert _final_state(prefect_stack, flow_run_id) == "Completed"
    shot(page, tmp_path / "shots", "run")
    run = _flow_run(prefect_stack, flow_run_id)
    assert run.deployment_id == deployment.id and run.name == f"submit-{job_id}"
    # What was typed is what the server stored, and the pickers stored references to the blocks.
    request = run.parameters["request"]
    assert {key: request[key] for key in ("job_id", "image", "command", "mode", "args")} == {
        "job_id": job_id, "image": "local", "command": "sh", "mode": "args",
        "args": ["-c", "echo typed into the browser form"]}
    assert run.parameters["target"] == {"$ref": {"block_document_id": _block_id(prefect_stack, PICKED_TARGET)}}
    assert run.parameters["records"] == {"$ref": {"block_document_id": _block_id(prefect_stack, PICKED_RECORDS)}}
    # The job was recorded where the picked records block says and ran in the picked target's run root.
    record = _record(RecordStore(prefect_stack.picked_records, environ=prefect_stack.env), job_id)
    assert record is not None and record.state == "RUNNING", record
    assert _record(RecordStore(prefect_stack.default_records, environ=prefect_stack.env), job_id) is None
    log = prefect_stack.home / "picked-local" / job_id / "run" / "rank-0.log"
    wait_for(f"the job's output in {log}", lambda: log.exists() and "typed into the browser form" in log.read_text())


def test_the_run_form_opens_each_block_parameter_on_its_picker_with_the_deployments_block(
        page: Any, prefect_stack: PrefectStack, tmp_path: Path) -> None:
    """The deployment file names its blocks as ``TYPE/NAME`` (the text tab); after the deploy step
    each is a reference by id, so the form opens on the block type's tab with that block chosen."""
    deployment = _deployment(prefect_stack, "submit-tao-job/local")
    open_custom_run(page, prefect_stack.ui, deployment.id)
    for parameter, tab in (("target", "LocalTarget"), ("records", "JobRecords"), ("s3_credentials", "S3EnvCredentials"),
                           ("hf_credentials", "HuggingFaceEnvCredentials"), ("ngc_credentials", "NGCEnvCredentials")):
        chosen = field(page, f"{parameter} (Optional)")
        assert chosen.get_by_role("tab", name=tab, exact=True).get_attribute("aria-selected") == "true", parameter
        block = deployment.parameters[parameter]  # the reference the deploy step wrote
        with prefect_stack.client() as client:
            saved = client.read_block_document(block["$ref"]["block_document_id"])
        chosen.get_by_role("button", name="Select a block").filter(has_text=saved.name).wait_for()
    # Each picker shows the block type's logo, which the stack's own server serves (no internet here).
    logos = page.locator("img[alt^='TAO ']")
    assert logos.count() == 5
    _served_and_loaded(page, prefect_stack, logos)
    shot(page, tmp_path / "shots", "opened")


def _served_and_loaded(page: Any, stack: PrefectStack, images: Any) -> None:
    """Each of ``images`` comes from the stack's own server (there is no internet here) and has
    loaded (a broken image has no natural width)."""
    for image in images.all():
        assert image.evaluate("image => image.src").startswith(stack.server + "/")
        page.wait_for_function("image => image.complete && image.naturalWidth > 0", arg=image.element_handle(),
                               timeout=UI_TIMEOUT_MS)


def test_the_block_catalog_shows_every_tao_block_whole_with_its_logo(page: Any, prefect_stack: PrefectStack,
                                                                       tmp_path: Path) -> None:
    """Blocks → + (the catalog), in a 1,024-pixel-wide window: each TAO card's description is
    shown whole (the card cuts a longer one at six lines), and its logo is loaded."""
    from blocks import TARGETS, HuggingFaceEnvCredentials, JobRecords, NGCEnvCredentials, S3EnvCredentials, TaoS3Bucket

    page.set_viewport_size({"width": 1024, "height": 800})
    page.goto(f"{prefect_stack.ui}/blocks/catalog")
    for block in (S3EnvCredentials, HuggingFaceEnvCredentials, NGCEnvCredentials, JobRecords, TaoS3Bucket,
                  *TARGETS.values()):
        title = block.get_block_type_name()
        card = page.locator("div[data-slot='card']").filter(has=page.get_by_role("heading", name=title, exact=True))
        card.scroll_into_view_if_needed()
        card.get_by_text(block.get_description(), exact=True).wait_for()  # its markdown, rendered
        text = card.locator("div.prose")  # six lines high; a longer text scrolls inside it
        cut = text.evaluate("box => box.scrollHeight > box.clientHeight + 1")
        assert not cut, f"{title}'s card cuts its description"
        _served_and_loaded(page, prefect_stack, card.locator("img"))
    shot(page, tmp_path / "shots", "catalog")


def test_a_pasted_access_key_is_refused_and_no_run_is_created(page: Any, prefect_stack: PrefectStack,
                                                              tmp_path: Path) -> None:
    deployment = _deployment(prefect_stack, "submit-tao-job/local")
    before = _runs_of(prefect_stack, deployment.id)
    open_custom_run(page, prefect_stack.ui, deployment.id)
    fill_request(page, image="local", command="sh", mode="args", args=["-c"])
    given = field(page, "Args (Optional)")
    given.get_by_role("button", name="Add item").click()
    given.locator("textarea").nth(1).focus()
    page.keyboard.insert_text(f"--aws-key={ACCESS_KEY}")  # what a paste does: one input event, the whole text
    answer = submit(page, lambda: _runs_of(prefect_stack, deployment.id))

    assert answer.status == 409, f"the server answered {answer.status}: {answer.text()[:2000]}"
    said = toast(page, "Error creating flow run")
    shot(page, tmp_path / "shots", "refused")
    assert "request.args[1]" in said
    assert _runs_of(prefect_stack, deployment.id) == before
    assert page.get_by_text("scheduled to start now").count() == 0
    # Nothing the server keeps holds the key: its database (and write-ahead log) and its log.
    assert _kept_by_the_server(prefect_stack, ACCESS_KEY) == []


def test_canceling_a_running_run_tao_job_from_its_page_cancels_the_job(page: Any, prefect_stack: PrefectStack,
                                                                        tmp_path: Path) -> None:
    job_id = f"browser-cancel-{os.getpid()}"
    flow_run_id = _run_tao_job(prefect_stack, {
        "job_id": job_id, "image": "local", "command": ["sh", "-c", "sleep 900"], "mode": "args", "args": []})
    store = RecordStore(prefect_stack.default_records, environ=prefect_stack.env)
    wait_for(f"job {job_id} RUNNING", lambda: (r := _record(store, job_id)) is not None and r.state == "RUNNING",
             RUN_DEADLINE_S)
    local = types.SimpleNamespace(run_root=prefect_stack.home / "local")
    assert job_processes(local, job_id), "the job's command is not running"

    dialog = from_run_menu(page, f"{prefect_stack.ui}/runs/flow-run/{flow_run_id}", f"run-{job_id}", "Cancel",
                           "Are you sure you want to cancel")
    shot(page, tmp_path / "shots", "cancel-dialog")
    dialog.get_by_role("button", name="Cancel Flow Run").click()

    assert _final_state(prefect_stack, flow_run_id) == "Cancelled"
    record = wait_for(f"job {job_id} CANCELED", lambda: (r := _record(store, job_id)) is not None
                      and r.state == "CANCELED" and r, RUN_DEADLINE_S)
    assert record.state == "CANCELED", record
    wait_for(f"job {job_id}'s processes to end", lambda: not job_processes(local, job_id))
    page.reload()
    page.get_by_text("Cancelled").first.wait_for()
    shot(page, tmp_path / "shots", "cancelled")


def test_the_collect_runs_page_shows_the_training_log_and_its_progress(page: Any, prefect_stack: PrefectStack,
                                                                       tmp_path: Path) -> None:
    job_id = f"browser-train-{os.getpid()}"
    flow_run_id = _run_tao_job(prefect_stack, {
        "job_id": job_id, "image": "local", "mode": "config", "config_format": "yaml",
        "command": "sh /stand-in/train.sh -e {config_path}", "spec": {"train": {"num_epochs": 2}},
        "mounts": [{"source": str(STAND_IN), "target": "/stand-in"}],
        "environment": {"EPOCHS": "2", "EPOCH_SECONDS": "1"}})
    assert _final_state(prefect_stack, flow_run_id) == "Completed"
    with prefect_stack.client() as client:
        collect = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]), name=FlowRunFilterName(
                any_=[f"collect-{job_id}"])))
    assert len(collect) == 1

    page.goto(f"{prefect_stack.ui}/runs/flow-run/{collect[0].id}")
    page.get_by_text(f"collect-{job_id}").first.wait_for()
    page.get_by_role("tab", name="Logs", exact=True).click()
    # The job's own lines (the stand-in's), handed on by the collect's watch.
    page.get_by_text("epoch 2/2 done").first.wait_for()
    page.get_by_text("train.sh[rank 0]: done").first.wait_for()
    shot(page, tmp_path / "shots", "logs")
    page.get_by_role("tab", name="Artifacts", exact=True).click()
    # The training's progress (from TAO's status.json) and its KPI table, keyed by the job.
    page.get_by_text(f"training of job {job_id}").first.wait_for()
    page.get_by_text(f"training-{job_id}").first.wait_for()
    shot(page, tmp_path / "shots", "artifacts")
    # The launch report (a check per path, with the config's and the mount's long paths) fits the
    # artifact page's column: nothing of it runs under the page's side panel.
    with prefect_stack.client() as client:
        (launch,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"launch-{job_id}"])))
    page.goto(f"{prefect_stack.ui}/artifacts/artifact/{launch.id}")
    report = page.locator("div.prose").filter(has=page.get_by_role("heading", name=re.compile("^Verified inside")))
    report.get_by_text("/stand-in").first.wait_for()
    assert report.evaluate("box => box.scrollWidth <= box.clientWidth"), "the launch report is wider than its column"
    shot(page, tmp_path / "shots", "launch-report")


def test_retrying_a_failed_run_tao_job_from_its_page_resumes_the_training_from_its_checkpoint(
        page: Any, prefect_stack: PrefectStack, tmp_path: Path) -> None:
    flow_run_id = _run_tao_job(prefect_stack, {  # no job id: the run's own, the same on every retry
        "image": "local", "mode": "config", "config_format": "yaml",
        "command": "sh /stand-in/train.sh -e {config_path}", "spec": {"train": {"num_epochs": 2}},
        "mounts": [{"source": str(STAND_IN), "target": "/stand-in"}], "outputs": {"results_dir": "/results"},
        # Fails after epoch 1's checkpoint; a run that finds it resumes at epoch 2, never failing again.
        "environment": {"EPOCHS": "2", "EPOCH_SECONDS": "0", "FAIL_AFTER_EPOCH": "1"}})
    assert _final_state(prefect_stack, flow_run_id) == "Failed"
    job_id = job_id_for_run(str(flow_run_id))
    store = RecordStore(prefect_stack.default_records, environ=prefect_stack.env)
    record = _record(store, job_id)
    assert record is not None and [(a.number, a.state) for a in record.attempts] == [(1, "ERROR")], record
    # The next attempt starts with an empty results directory, as on another worker or a new pod:
    # what it resumes from can only be what the first attempt uploaded.
    results = prefect_stack.home / "local" / job_id / "results"
    assert (results / "checkpoint_epoch_1.pth").exists()
    shutil.rmtree(results)
    runs_before = _flow_run(prefect_stack, flow_run_id).run_count

    dialog = from_run_menu(page, f"{prefect_stack.ui}/runs/flow-run/{flow_run_id}", f"run-{job_id}", "Retry",
                           "Retry the flow run")
    shot(page, tmp_path / "shots", "retry-dialog")
    dialog.get_by_role("button", name="Retry", exact=True).click()
    said = toast(page, "retry")  # the UI toasts what the server said: scheduled, or why it refused
    assert "scheduled for retry" in said, said

    def ended_again() -> str | None:
        run = _flow_run(prefect_stack, flow_run_id)
        return run.state.name if run.run_count > runs_before and run.state.is_final() else None

    assert wait_for(f"flow run {flow_run_id} to run again and end", ended_again, RUN_DEADLINE_S) == "Completed"
    record = _record(store, job_id)
    assert record is not None and record.state == "COMPLETE", record
    assert [(a.number, a.state) for a in record.attempts] == [(1, "ERROR"), (2, "COMPLETE")], record
    assert record.attempts[0].restored is None
    restored = str(record.attempts[1].restored)
    assert re.match(r"[1-9][0-9]* file\(s\)", restored), restored  # the checkpoint, status.json, train.log
    log = (prefect_stack.home / "local" / job_id / "run" / "rank-0.log").read_text()  # the second attempt's
    assert "resumed from checkpoint_epoch_1.pth" in log and "epoch 2/2 done" in log and "epoch 1/2 done" not in log
    page.reload()
    page.get_by_text("Completed").first.wait_for()
    shot(page, tmp_path / "shots", "retried")


def test_a_secret_pasted_into_a_credential_blocks_field_is_refused_and_never_stored(
        page: Any, prefect_stack: PrefectStack, tmp_path: Path) -> None:
    name = f"pasted-{os.getpid()}"

    def saved() -> bool:
        from prefect.exceptions import ObjectNotFound

        with prefect_stack.client() as client:
            try:
                client.read_block_document_by_name(name, "tao-s3-credentials")
            except ObjectNotFound:
                return False
        return True

    open_block_form(page, prefect_stack.ui, "tao-s3-credentials")
    page.get_by_label("Name", exact=True).fill(name)
    paste(page, field(page, "Access key id (Optional)").locator("input, textarea").first, ACCESS_KEY)
    paste(page, field(page, "Secret access key (Optional)").locator("input, textarea").first, SECRET_KEY)
    shot(page, tmp_path / "shots", "pasted")
    answer = save_block(page, saved)

    assert answer.status == 422, f"the server answered {answer.status}: {answer.text()[:2000]}"
    detail = answer.text()
    assert "access_key_id_env" in detail and "secret_access_key_env" in detail, detail
    assert ACCESS_KEY not in detail and SECRET_KEY not in detail, detail  # the refusal does not repeat it
    # The form's own check (answered by the demo's server, as Prefect answers it) shows why beside
    # each field; the save the v2 UI sends all the same is refused, and it toasts its own words.
    for label in ("Access key id (Optional)", "Secret access key (Optional)"):
        field(page, label).get_by_text("must be the NAME of the variable on the worker").wait_for()
    toast(page, "Unknown error while creating block")
    shot(page, tmp_path / "shots", "refused")
    assert page.url.endswith("/blocks/catalog/tao-s3-credentials/create"), page.url
    assert not saved()
    assert page.get_by_text("Block created successfully").count() == 0
    # Nothing the server keeps holds either value: block documents, events, its log.
    assert _kept_by_the_server(prefect_stack, ACCESS_KEY, SECRET_KEY) == []


def test_a_secret_pasted_while_editing_a_credential_block_is_refused_and_the_block_is_unchanged(
        page: Any, prefect_stack: PrefectStack, tmp_path: Path) -> None:
    """A saved block's Edit form: the form's check shows why beside the field, the form sends no
    save (its ``PATCH``, which the server refuses all the same: ``tests/test_blocks.py``), and the
    saved block keeps its names."""
    with prefect_stack.client() as client:
        before = client.read_block_document_by_name("default", "tao-s3-credentials")
    page.goto(f"{prefect_stack.ui}/blocks/block/{before.id}/edit")
    box = field(page, "Secret access key (Optional)").locator("input, textarea").first
    box.wait_for()
    paste(page, box, SECRET_KEY)
    saves: list[str] = []
    page.on("request", lambda request: saves.append(request.url) if request.method == "PATCH" else None)
    page.get_by_role("button", name="Save", exact=True).click()
    field(page, "Secret access key (Optional)").get_by_text("must be the NAME of the variable on the worker").wait_for()
    shot(page, tmp_path / "shots", "edit-refused")
    # The edit form heeds its check: it sends no save (the server would refuse it: 422, as above).
    assert saves == [] and page.url.endswith("/edit"), (saves, page.url)
    with prefect_stack.client() as client:
        after = client.read_block_document_by_name("default", "tao-s3-credentials")
    assert after.data == before.data and after.data["secret_access_key_env"] == "AWS_SECRET_ACCESS_KEY"
    assert _kept_by_the_server(prefect_stack, SECRET_KEY) == []
