"""The verify probe, run for real by /bin/sh: what it passes and fails, its termination message
within the kubelet's budget, and the verify wrapper."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tao_data_io.launch.agents import VERIFY_SCRIPT
from tao_data_io.launch.probe import (PROBE_SCRIPT, Check, Verdict, checklist_text, parse_probe_output,
                                      termination_budget, with_persistence)


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


def test_an_empty_read_only_pre_positioned_directory_fails_but_a_writable_one_may_be_empty(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    checks = [Check(kind="readable", path=str(tmp_path / "empty"), subject="/lustre/dataset"),
              Check(kind="present", path=str(tmp_path / "empty"), subject="/scratch")]
    done = _run_probe(tmp_path, checks)
    verdict = parse_probe_output(done.stdout, checks, done.returncode)
    assert [(c.kind, c.ok, c.detail) for c in verdict.checks] == [
        ("readable", False, "is an empty directory"), ("present", True, "present")]
