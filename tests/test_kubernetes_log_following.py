"""Following a Kubernetes pod's log: a look cut by the byte limit, a line longer than a look, and
a pod printing more between two looks than one read returns."""

from __future__ import annotations

from pathlib import Path

from tao_data_io.backends.kubernetes.follow import new_lines

from . import kube_cluster
from .kube_cluster import NAMESPACE, job_request, make_backend, ours, submit
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


def test_a_followed_line_cut_by_the_byte_limit_waits_for_the_next_look() -> None:
    text = "2026-12-01T10:00:00.5Z one\n2026-12-01T10:00:01Z two\n2026-12-01T10:00:02.000000001Z thr"
    assert new_lines(text, None) == (["one", "two"], "2026-12-01T10:00:01Z")
    # Trailing zeros are dropped by the kubelet, so times compare as times, not as text.
    assert new_lines("2026-12-01T10:00:00.5Z old\n2026-12-01T10:00:00.50001Z new\n", "2026-12-01T10:00:00.5Z") == (
        ["new"], "2026-12-01T10:00:00.50001Z")
    # Lines written in the same instant are all new after an older cursor.
    same = "2026-12-01T10:00:03Z a\n2026-12-01T10:00:03Z b\n2026-12-01T10:00:04Z c\n"
    assert new_lines(same, "2026-12-01T10:00:02Z") == (["a", "b", "c"], "2026-12-01T10:00:04Z")


def test_a_followed_line_longer_than_a_look_is_passed_over_not_waited_for_forever() -> None:
    """A look reads at most ``limitBytes`` from the start of its window, and the window starts
    before the last line shown (the margin): a line that does not fit comes back cut every time,
    and waiting for its end held back every line after it for good. It is passed over, said, and
    never shown in part (a part could be half a secret no mask knows)."""
    seen = "2026-12-01T10:00:04Z shown before\n"
    look = (seen + "2026-12-01T10:00:05Z " + "A" * 100)[:120]
    lines, newest = new_lines(look, "2026-12-01T10:00:04Z", limit=120)
    assert newest == "2026-12-01T10:00:05Z" and lines == [
        "[tao-data-io: a line too long for one look (120 bytes with the lines before it) was not shown]"]
    assert new_lines(look, "2026-12-01T10:00:05Z", limit=120) == ([], "2026-12-01T10:00:05Z")  # passed over once
    assert new_lines(look[:80], "2026-12-01T10:00:04Z", limit=120) == ([], "2026-12-01T10:00:04Z")  # not full: wait
    whole = seen + "2026-12-01T10:00:05Z new\n2026-12-01T10:00:06Z " + "B" * 100
    assert new_lines(whole[:120], "2026-12-01T10:00:04Z", limit=120) == (["new"], "2026-12-01T10:00:05Z")


def test_following_a_chatty_pod_keeps_showing_its_newest_lines(kube: KubeStandIn, tmp_path: Path) -> None:
    """A pod printing more between two looks than one read returns: the newest lines are shown
    and the cursor moves on (a read of the oldest part of the window would never catch up). Encodes
    PodLogOptions as the kubelet applies it: tailLines and sinceSeconds together give the newest
    lines of the window, and limitBytes cuts the answer."""
    kube.server.control.scripts["job-1"] = ["pulling", "staging", "verifying", "verified", "running"]
    backend = make_backend()
    done = submit(tmp_path, job_request(), backend)
    pod = next(iter(ours(kube, "Pod")))
    kube.server.logs[NAMESPACE, pod, "train"] = "start\n"
    first = backend.follow_logs(done.backend_ref, None)
    kube.server.logs[NAMESPACE, pod, "train"] += "".join(f"progress {i:06d} {'=' * 80}\n" for i in range(5000))
    looks = [backend.follow_logs(done.backend_ref, first.cursor)]
    looks.append(backend.follow_logs(done.backend_ref, looks[-1].cursor))
    assert "progress 004999" in looks[0].text and looks[0].cursor != first.cursor
    assert looks[1].text == ""
