"""The launch plan (pure), the verify probe run for real by /bin/sh, and the tier decision table."""

from __future__ import annotations

import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.launch.agents import VERIFY_SCRIPT
from tao_data_io.launch.plan import build_plan, command_argv
from tao_data_io.launch.probe import (PROBE_SCRIPT, Check, Verdict, checklist, checklist_text, parse_probe_output,
                                      termination_budget, with_persistence)
from tao_data_io.records import JobRecord, OutputRoute
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage_map import StagedSource, StagingMap
from tao_data_io.tier import Capabilities, ClusterFacts, TierDecision, VolumeFacts, choose_tier

BASE: dict[str, Any] = {"schema_version": "1", "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt"}


def req(**fields: Any) -> JobRequest:
    return JobRequest.model_validate({**BASE, **fields})


def config_req(command: str | list[str] = "dino train -e {config_path}", **fields: Any) -> JobRequest:
    return req(mode="config", command=command, config_format="yaml", spec={"train": {"epochs": 1}}, **fields)


CONFIG = "/tao-action-config/spec-abc.yaml"


@pytest.mark.parametrize(("request_", "argv", "shell"), [
    (config_req(), ["dino", "train", "-e", CONFIG], False),
    (config_req(["dino", "train", "-e", "{config_path}"]), ["dino", "train", "-e", CONFIG], False),
    (config_req("dino train -e {config_path} && echo done"), ["/bin/sh", "-c", f"dino train -e {CONFIG} && echo done"],
     True),
    (req(mode="args", command="python train.py", args=["--lr", "1e-3", "$(rm -rf /)", "a;b|c"]),
     ["python", "train.py", "--lr", "1e-3", "$(rm -rf /)", "a;b|c"], False),
    (req(mode="args", command=["sh", "-c"], args=["echo hi"]), ["sh", "-c", "echo hi"], False),
], ids=["split", "list", "shell-syntax", "args-stay-argv", "producer-declared-shell"])
def test_command_argv(request_: JobRequest, argv: list[str], shell: bool) -> None:
    assert command_argv(request_, CONFIG) == (argv, shell)


def test_a_shell_looking_spec_value_lands_in_the_config_never_in_argv() -> None:
    request = req(mode="config", command="train -e {config_path}", config_format="yaml",
                  spec={"note": "$(rm -rf /)"})
    argv, shell = command_argv(request, CONFIG)
    assert argv == ["train", "-e", CONFIG] and not shell


def _map(tmp_path: Path, *sources: StagedSource) -> StagingMap:
    return StagingMap(job_id="job-1", staging_dir=str(tmp_path), inputs_root="/tao-inputs", sources=list(sources))


def _record() -> JobRecord:
    now = datetime.now(timezone.utc)
    return JobRecord(job_id="job-1", backend="local", image="img", network_arch="dino", action="train",
                     storage_tier="B", results_dir="/results", state="PENDING", created_at=now, updated_at=now)


ROUTE = OutputRoute(route="s3", destination="s3://bkt-1/results/job-1/", reason="S3_BUCKET_NAME is set")
FOLDER = StagedSource(source="s3://bkt-1/coco/", kind="folder", sub_path="s3/bkt-1/coco",
                      container_path="/tao-inputs/s3/bkt-1/coco", local_path="/w/s3/bkt-1/coco", files=3, bytes=10)
COCO = {"source": "s3://bkt-1/coco/", "kind": "folder"}
CONFIG_SOURCE = StagedSource(source="config:sha256:abc", kind="config", sub_path="config/tao-action-config-abc.yaml",
                             container_path=CONFIG, local_path="/w/config/x.yaml", files=1, bytes=10)


def test_build_plan_mounts_every_source_and_holds_no_secret_value(tmp_path: Path) -> None:
    request = config_req(environment={"EPOCHS": "3"}, forward_env=["AWS_SECRET_ACCESS_KEY"], inputs=[COCO],
                         mounts=[{"source": "/lustre/pretrained", "target": "/pretrained"}])
    env = {"AWS_SECRET_ACCESS_KEY": "very-secret-value-123"}
    plan = build_plan(request, _map(tmp_path, FOLDER, CONFIG_SOURCE), TierDecision(tier="B", reason="r"), _record(),
                      ROUTE, environ=env)
    assert plan.argv == ["dino", "train", "-e", CONFIG] and plan.config_path == CONFIG
    assert [(m.origin, m.source, m.target, m.expect) for m in plan.mounts] == [
        ("staged", "s3/bkt-1/coco", "/tao-inputs/s3/bkt-1/coco", "dir"),
        ("config", "config/tao-action-config-abc.yaml", CONFIG, "file"),
        ("pre-positioned", "/lustre/pretrained", "/pretrained", "any")]
    assert plan.env == {"EPOCHS": "3", "TAO_JOB_ID": "job-1", "TAO_RESULTS_DIR": "/results"}
    assert plan.forward_env == ["AWS_SECRET_ACCESS_KEY"]
    assert "very-secret-value-123" not in plan.model_dump_json()


def test_a_staging_map_entry_the_request_does_not_declare_never_becomes_a_mount(tmp_path: Path) -> None:
    """The renderer contract's "no undeclared sources": the staging map is a file between steps and
    machines, and a source added to it by hand would be mounted into the job."""
    smuggled = FOLDER.model_copy(update={"source": "s3://bkt-1/someone-elses/", "container_path": "/etc-data"})
    with pytest.raises(UsageError,
                       match=r"sources\[1\] \('s3://bkt-1/someone-elses/' at '/etc-data'\) is not an input"):
        build_plan(config_req(inputs=[COCO]), _map(tmp_path, FOLDER, smuggled, CONFIG_SOURCE),
                   TierDecision(tier="B", reason="r"), _record(), ROUTE)
    declared = config_req(inputs=[{"source": "s3://bkt-1/coco"}])  # the prefix without its slash: the same source
    assert build_plan(declared, _map(tmp_path, FOLDER, CONFIG_SOURCE), TierDecision(tier="B", reason="r"), _record(),
                      ROUTE).mounts[0].source == "s3/bkt-1/coco"


def test_a_secret_smuggled_into_environment_under_an_innocent_name_is_refused(tmp_path: Path) -> None:
    request = config_req(environment={"LEARNING_RATE": "very-secret-value-123"})
    with pytest.raises(UsageError, match="environment 'LEARNING_RATE'") as info:
        build_plan(request, _map(tmp_path, CONFIG_SOURCE), TierDecision(tier="B", reason="r"), _record(), ROUTE,
                   environ={"AWS_SECRET_ACCESS_KEY": "very-secret-value-123"})
    assert "very-secret-value-123" not in str(info.value)


def test_results_inside_a_read_only_input_is_refused(tmp_path: Path) -> None:
    request = config_req(outputs={"results_dir": "/tao-inputs/s3/bkt-1/coco/out"}, inputs=[COCO])
    with pytest.raises(UsageError, match="read-only input"):
        build_plan(request, _map(tmp_path, FOLDER, CONFIG_SOURCE), TierDecision(tier="B", reason="r"), _record(),
                   ROUTE)


# ----------------------------------------------------------------------------- the probe, for real
def _run_probe(tmp_path: Path, checks: list[Check]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "probe.sh").write_text(PROBE_SCRIPT)
    (tmp_path / "checklist").write_text(checklist_text(checks))
    return subprocess.run(["/bin/sh", str(tmp_path / "probe.sh"), str(tmp_path / "checklist")],
                          capture_output=True, text=True, timeout=30)


def test_probe_passes_a_good_frame_and_writes_the_persistence_token(tmp_path: Path) -> None:
    (tmp_path / "data" / ".hidden").mkdir(parents=True)
    (tmp_path / "cfg.yaml").write_text("a: 1\n")
    checks = [Check(kind="dir-nonempty", path=str(tmp_path / "data"), subject="s3://b/data/"),
              Check(kind="file", path=str(tmp_path / "cfg.yaml"), subject="config"),
              Check(kind="readable", path=str(tmp_path / "data"), subject="/lustre"),
              Check(kind="results-writable", path=str(tmp_path / "results" / "deep"), subject="results",
                    argument="tok123")]
    done = _run_probe(tmp_path, checks)
    verdict = parse_probe_output(done.stdout, checks, done.returncode)
    assert done.returncode == 0 and verdict.ok, done.stdout + done.stderr
    assert (tmp_path / "results" / "deep" / ".tao-data-io-verify").read_text() == "tok123"


def test_probe_refuses_an_input_that_resolves_outside_its_volume(tmp_path: Path) -> None:
    """A Kubernetes subPath that resolves, through symlinks, outside its volume is refused by the
    kubelet (pkg/volume/util/subpath): read from above, the probe must refuse it too, or it
    passes a job whose training container then cannot start."""
    volume = tmp_path / "volume"
    (volume / "datasets" / "coco").mkdir(parents=True)
    (volume / "datasets" / "coco" / "a.jpg").write_text("x")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "b.jpg").write_text("y")
    (volume / "datasets" / "escape").symlink_to(tmp_path / "elsewhere")
    (volume / "datasets" / "inside").symlink_to("coco")
    checks = [Check(kind="readable", path=str(volume / name), subject=name, argument=str(volume))
              for name in ("datasets/coco", "datasets/escape", "datasets/inside")]
    done = _run_probe(tmp_path, checks)
    verdict = {c.path: c for c in parse_probe_output(done.stdout, checks, done.returncode).checks}
    assert verdict[str(volume / "datasets/coco")].ok and verdict[str(volume / "datasets/inside")].ok
    escaped = verdict[str(volume / "datasets/escape")]
    assert not escaped.ok and escaped.detail.startswith("resolves outside its volume"), escaped


def test_probe_fails_missing_empty_unreadable_and_unwritable_paths(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "adir").mkdir()
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    checks = [Check(kind="dir-nonempty", path=str(tmp_path / "missing"), subject="a"),
              Check(kind="dir-nonempty", path=str(tmp_path / "empty"), subject="b"),
              Check(kind="file", path=str(tmp_path / "adir"), subject="c"),
              Check(kind="results-writable", path=str(tmp_path / "ro" / "sub"), subject="results", argument="t")]
    done = _run_probe(tmp_path, checks)
    verdict = parse_probe_output(done.stdout, checks, done.returncode)
    details = {Path(c.path).name: (c.ok, c.detail) for c in verdict.checks}
    assert done.returncode == 1 and not verdict.ok
    assert details["missing"] == (False, "does not exist") and details["empty"] == (False, "is empty")
    assert details["adir"] == (False, "is not a regular file")
    import os
    if os.geteuid() != 0:  # root writes through mode bits
        assert details["sub"][0] is False


def test_a_probe_that_stopped_early_never_passes() -> None:
    checks = [Check(kind="file", path="/a", subject="x"), Check(kind="file", path="/b", subject="y")]
    verdict = parse_probe_output("TAO-VERIFY\tok\tfile\t/a\treadable\n", checks, exit_code=None)
    assert not verdict.ok and verdict.checks[1].detail.startswith("not reported")
    assert not parse_probe_output("", checks).ok
    assert not parse_probe_output("TAO-VERIFY\tok\tfile\t/a\tr\nTAO-VERIFY\tok\tfile\t/b\tr\n", checks, 137).ok


def test_termination_message_fits_4kib_failures_first_and_round_trips() -> None:
    checks = [Check(kind="dir-nonempty", path=f"/tao-inputs/s3/bucket/dataset-{i:03d}", subject=f"s{i}")
              for i in range(200)]
    lines = "".join(f"TAO-VERIFY\t{'fail' if i == 150 else 'ok'}\tdir-nonempty\t/tao-inputs/s3/bucket/dataset-{i:03d}"
                    f"\t{'is empty' if i == 150 else 'readable, not empty'}\n" for i in range(200))
    verdict = parse_probe_output(lines, checks, 1)
    message = verdict.termination_message()
    assert len(message.encode()) <= 4096
    assert message.startswith("TAO-VERIFY\tfail\tdir-nonempty\t/tao-inputs/s3/bucket/dataset-150")
    again = parse_probe_output(message, checks, 1)
    assert not again.ok and [c.path for c in again.failures][0].endswith("dataset-150")
    passing = parse_probe_output(lines.replace("\tfail\t", "\tok\t"), checks, 0)
    assert parse_probe_output(passing.termination_message(), checks, 0).ok


def test_a_more_line_says_whether_the_checks_it_left_out_passed() -> None:
    """verify.sh lists failures first and ends a cut message with ``more<TAB>N not shown, M of
    them passed``: M == N is a pass cut short; M < N fails, saying how many failures went unseen."""
    checks = [Check(kind="file", path=f"/in/{i}", subject=f"s{i}") for i in range(4)]
    shown = "TAO-VERIFY\tok\tfile\t/in/0\treadable\n"
    passed = parse_probe_output(shown + "TAO-VERIFY\tmore\t3 not shown, 3 of them passed\n", checks, 0)
    assert passed.ok and passed.checks[3].detail.startswith("passed (not shown")
    failed = parse_probe_output(shown + "TAO-VERIFY\tmore\t3 not shown, 1 of them passed\n", checks, 1)
    assert not failed.ok and not failed.checks[3].ok
    assert "2 of the 3 checks left out failed" in failed.checks[3].detail
    miscounted = parse_probe_output(shown + "TAO-VERIFY\tmore\t2 not shown, 2 of them passed\n", checks, 0)
    assert not miscounted.ok and miscounted.checks[3].detail.startswith("not reported")


def test_the_termination_budget_is_the_kubelets_12_kib_shared_by_the_pods_containers() -> None:
    """normalizeStatus (pkg/kubelet/status/status_manager.go) keeps 12 KiB / (containers +
    initContainers) of each termination message, of the at most 4 KiB the kubelet read; a passing
    verdict cut to that still reads as passed."""
    assert [termination_budget(n) for n in (1, 3, 4, 5, 6)] == [4096, 4096, 3072, 2457, 2048]
    checks = [Check(kind="dir-nonempty", path=f"/workspace/datasets/coco-2017/train-shard-{i:03d}", subject=f"s{i}")
              for i in range(33)]
    lines = "".join(f"TAO-VERIFY\tok\tdir-nonempty\t{c.path}\treadable, not empty\n" for c in checks)
    message = parse_probe_output(lines, checks, 0).termination_message(termination_budget(5))
    assert len(message.encode()) <= 2457 < len(lines.encode()) and parse_probe_output(message, checks, 0).ok


def test_the_verify_wrapper_cuts_a_passing_verdict_to_the_budget_it_is_given(tmp_path: Path) -> None:
    """verify.sh's LIMIT argument (the renderer's termination_budget) is the same cut as
    Verdict.termination_message, so what the kubelet keeps of a passing verdict still passes."""
    checks = [Check(kind="present", path=str(tmp_path / f"input-shard-{i:03d}-of-a-long-dataset-name"),
                    subject=f"s{i}") for i in range(33)]
    for check in checks:
        Path(check.path).write_text("x")
    (tmp_path / "probe.sh").write_text(PROBE_SCRIPT)
    (tmp_path / "verify.sh").write_text(VERIFY_SCRIPT)
    (tmp_path / "checklist").write_text(checklist_text(checks))
    done = subprocess.run(["/bin/sh", str(tmp_path / "verify.sh"), str(tmp_path / "probe.sh"),
                           str(tmp_path / "checklist"), str(tmp_path / "log"), str(termination_budget(5))],
                          capture_output=True, text=True, timeout=60)
    message = (tmp_path / "log").read_text()
    assert done.returncode == 0 and len(done.stdout.encode()) > 2457 >= len(message.encode()), done.stderr
    assert message == parse_probe_output(done.stdout, checks, 0).termination_message(termination_budget(5))
    assert parse_probe_output(message, checks, 0).ok and message.splitlines()[-1].startswith("TAO-VERIFY\tmore\t")


def test_persistence_is_its_own_check() -> None:
    verdict = with_persistence(Verdict(ok=True, checks=[]), "/results", False, "the token was not seen outside")
    assert not verdict.ok and verdict.checks[-1].kind == "persistent"


def test_checklist_dedupes_aliased_targets_and_ends_with_results(tmp_path: Path) -> None:
    plan = build_plan(config_req(inputs=[COCO]), _map(tmp_path, FOLDER, CONFIG_SOURCE),
                      TierDecision(tier="B", reason="r"), _record(), ROUTE)
    checks, token = checklist(plan)
    assert [c.kind for c in checks] == ["dir-nonempty", "file", "results-writable"]
    assert checks[-1].argument == token and len(token) == 32


# ----------------------------------------------------------------------------- tier decision
S3_INPUT = {"inputs": [{"source": "s3://bkt-1/coco/"}]}
LOCAL_INPUT = {"inputs": [{"source": "/pvc/coco", "target": "/data/coco"}]}
BOUND = VolumeFacts(name="data", phase="Bound")
#: What the decision reads: a cluster's frames mount claims and fetch their own inputs; a host
#: stages them itself; an old cluster only mounts claims.
CLUSTER = Capabilities(fetches_in_frame=True, binds_claims=True)
HOST = Capabilities(stages_on_host=True)
CLAIMS_ONLY = Capabilities(binds_claims=True)


@pytest.mark.parametrize(("fields", "facts", "tier", "fragment"), [
    (LOCAL_INPUT, ClusterFacts(backend="kubernetes", capabilities=CLUSTER), "A", "pre-positioned"),
    ({**LOCAL_INPUT, "storage": {"air_gapped": True}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER),
     "A", "air-gapped"),
    (S3_INPUT, ClusterFacts(backend="local", capabilities=HOST), "B", "staging root"),
    ({**S3_INPUT, "storage": {"pvc_claim": "data"}},
     ClusterFacts(backend="kubernetes", capabilities=CLUSTER, volumes=[BOUND]), "B", "Bound"),
    ({**S3_INPUT, "storage": {"pvc_claim": "data"}},
     ClusterFacts(backend="kubernetes", capabilities=CLUSTER,
                  volumes=[BOUND.model_copy(update={"holds_inputs": True})]), "B", "nothing moves"),
    (S3_INPUT, ClusterFacts(backend="kubernetes", capabilities=CLUSTER, volumes=[BOUND]), "C", "names none"),
    ({**S3_INPUT, "storage": {"pvc_claim": "data"}},
     ClusterFacts(backend="kubernetes", capabilities=CLUSTER,
                  volumes=[BOUND.model_copy(update={"phase": "Pending"})]), "C", "Pending"),
    ({**S3_INPUT, "storage": {"tier": "C", "pvc_claim": "data"}},
     ClusterFacts(backend="kubernetes", capabilities=CLUSTER, volumes=[BOUND]), "C", "was asked"),
    ({**LOCAL_INPUT, "storage": {"tier": "B"}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER),
     "A", "nothing moves"),
], ids=["pre-positioned", "air-gapped-local", "local-frame", "bound-pvc", "cache-hit", "no-claim-named",
        "claim-pending", "explicit-c", "b-asked-nothing-remote"])
def test_choose_tier(fields: dict[str, Any], facts: ClusterFacts, tier: str, fragment: str) -> None:
    decision = choose_tier(req(mode="args", command="train", args=[], **fields), facts)
    assert decision.tier == tier and fragment in decision.reason, decision
    named_otherwise = facts.model_copy(update={"backend": "a-third-backend"})  # the decision reads abilities only
    assert choose_tier(req(mode="args", command="train", args=[], **fields), named_otherwise).tier == tier


@pytest.mark.parametrize(("fields", "facts", "fragment"), [
    ({**S3_INPUT, "storage": {"air_gapped": True}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER), "s3://bkt-1/coco/"),
    (S3_INPUT, ClusterFacts(backend="kubernetes", capabilities=CLUSTER, air_gapped=True), "air-gapped"),
    ({**S3_INPUT, "storage": {"tier": "A"}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER), "impossible"),
    ({**S3_INPUT, "storage": {"tier": "B"}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER), "needs a Bound"),
    ({**S3_INPUT, "storage": {"tier": "C"}}, ClusterFacts(backend="kubernetes", capabilities=CLAIMS_ONLY), "1.29"),
    (S3_INPUT, ClusterFacts(backend="kubernetes", capabilities=CLAIMS_ONLY), "no tier is possible"),
], ids=["air-gapped-remote", "cluster-air-gapped", "a-with-remote", "b-without-pvc", "c-unsupported", "nothing-works"])
def test_choose_tier_refusals(fields: dict[str, Any], facts: ClusterFacts, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        choose_tier(req(mode="args", command="train", args=[], **fields), facts)
    with pytest.raises(UsageError, match=fragment):
        choose_tier(req(mode="args", command="train", args=[], **fields),
                    facts.model_copy(update={"backend": "a-third-backend"}))


def test_tier_c_warns_about_idle_gpus_above_the_threshold() -> None:
    facts = ClusterFacts(backend="kubernetes", capabilities=CLUSTER, input_bytes=50 * 1024**3)
    decision = choose_tier(req(mode="args", command="train", args=[], **S3_INPUT), facts)
    assert decision.tier == "C" and "idle GPU" in decision.warnings[0]
    assert choose_tier(req(mode="args", command="train", args=[], **S3_INPUT),
                       facts.model_copy(update={"input_bytes": 1024})).warnings == []


def test_an_empty_read_only_pre_positioned_directory_fails_but_a_writable_one_may_be_empty(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    checks = [Check(kind="readable", path=str(tmp_path / "empty"), subject="/lustre/dataset"),
              Check(kind="present", path=str(tmp_path / "empty"), subject="/scratch")]
    done = _run_probe(tmp_path, checks)
    verdict = parse_probe_output(done.stdout, checks, done.returncode)
    assert [(c.kind, c.ok, c.detail) for c in verdict.checks] == [
        ("readable", False, "is an empty directory"), ("present", True, "present")]


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"storage": {"pvc_claim": "data"}}, "storage.pvc_claim 'data' names a volume claim, which the host backend does "
                                         "not mount: drop storage.pvc_claim"),
    ({"compute_shape": {"nodes": 2}}, "compute_shape.nodes 2 asks for 2 nodes, and the host backend runs a job on one"),
    ({"compute_shape": {"disruption_retries": 2}}, "compute_shape.disruption_retries 2 asks for a lost pod to be "
                                                   "replaced, which the host backend never does"),
], ids=["claim", "multi-node", "disruption-retries"])
def test_what_a_backend_cannot_honour_is_refused_naming_the_field_and_the_backend(fields: dict[str, Any],
                                                                                 fragment: str) -> None:
    from tao_data_io.tier import refuse_unsupported

    request = req(mode="args", command="train", args=[], **S3_INPUT, **fields)
    with pytest.raises(UsageError, match=re.escape(fragment)):
        refuse_unsupported(request, "host", HOST)
    refuse_unsupported(request, "cluster", Capabilities(binds_claims=True, multi_node=True, replaces_disrupted=True))
