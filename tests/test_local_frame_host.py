"""The local frame against the host it runs on: a job never holds host root and cannot write the
kernel's settings; what it leaves in its results carries no privilege out to the host; every
tmpfs it can write is sized by its request; tao-data-io's state and other jobs' results are out
of a request's reach.

The suite runs as root here (as CI, containers and many Prefect workers do), so these jobs run
as the backend's ``run_as_user``; what an unprivileged backend does is the argv's table test in
``test_local_backend.py``. Nothing here writes a host setting: the one write a job tries puts
back the value it read, so a frame that could write shows it without changing the host.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.local.backend import LocalBackend
from tao_data_io.local.results_owner import disarm
from tao_data_io.records import OutputRoute, RecordStore
from tao_data_io.request import JobRequest
from tao_data_io.verbs import submit

from .helpers import args_request, wait_for
from .local_frame import control, finished, make_plan

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="what a root-started frame does needs root to see")

#: sh: say whether each kernel setting can be written, writing back only what it reads.
KERNEL_WRITES = r"""
    v=$(cat /proc/sys/kernel/core_pattern)
    if printf '%s\n' "$v" 2>/dev/null > /proc/sys/kernel/core_pattern; then echo "wrote core_pattern"; fi
    if printf 'x\n' 2>/dev/null > /proc/sys/kernel/hostname; then echo "wrote hostname"; fi
    for f in /proc/sys/vm/drop_caches /proc/sysrq-trigger /proc/sys/kernel/modprobe; do
      if [ -e "$f" ] && [ -w "$f" ]; then echo "writable $f"; fi
    done
"""


def _frame_uids(run: Path) -> dict[int, list[int]]:
    """pid → real, effective, saved and file-system uid of every process in rank 0's pid
    namespace, read from the host while the job holds."""
    sandbox = json.loads((run / "ranks.json").read_text())["ranks"][0]["sandbox"]["pid"]
    namespace = os.readlink(f"/proc/{sandbox}/ns/pid")
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        found[int(entry)] = [int(uid) for uid in status.split("\nUid:")[1].split("\n")[0].split()]
    return found


@needs_root
def test_a_job_started_by_root_never_holds_host_root(tmp_path: Path, local_backend: LocalBackend) -> None:
    """Run by root, a frame without a user switch left the job host uid 0, and uid 0 writes the
    host-wide ``kernel.core_pattern`` whatever capabilities were dropped (the kernel checks
    ``/proc/sys`` by uid). The job runs as nobody, with no capability, and ``/proc/sys`` and
    ``/proc/sysrq-trigger`` are read-only mounts besides."""
    core_pattern = Path("/proc/sys/kernel/core_pattern").read_bytes()
    script = KERNEL_WRITES + r"""
        grep -E ' /proc/sys(rq-trigger)? ' /proc/self/mountinfo | cut -d' ' -f5,6 > "$TAO_RESULTS_DIR/mounts"
        grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status > "$TAO_RESULTS_DIR/status"
        touch /control/ready
        while [ ! -e /control/release ]; do sleep 0.1; done
    """
    ref = local_backend.submit(make_plan(tmp_path, script=script)).backend_ref
    wait_for("the job to hold", lambda: (control(tmp_path) / "ready").exists())
    uids = _frame_uids(local_backend.run_root / "job-1" / "run")
    (control(tmp_path) / "release").touch()
    assert finished(local_backend, ref).state == "COMPLETE", local_backend.logs(ref)
    assert uids and all(0 not in ids for ids in uids.values()), f"a process of the frame holds host uid 0: {uids}"
    assert local_backend.logs(ref) == "", "the job wrote a kernel setting"
    results = Path(str(local_backend.results_path(ref)))
    mounts = dict(line.split() for line in (results / "mounts").read_text().splitlines())
    assert "/proc/sys" in mounts and all(options.startswith("ro,") for options in mounts.values()), mounts
    assert (results / "status").read_text().split() == ["CapEff:", "0000000000000000", "CapBnd:", "0000000000000000",
                                                       "NoNewPrivs:", "1"]
    assert Path("/proc/sys/kernel/core_pattern").read_bytes() == core_pattern


@needs_root
@pytest.mark.parametrize("route", ["run root", "results mount"])
def test_what_a_job_leaves_in_its_results_carries_no_privilege_to_the_host(
        tmp_path: Path, local_backend: LocalBackend, route: str) -> None:
    """A job's results are the host's once it ends: a setuid or setgid copy of a shell left
    there would run, for whoever executes it, as the job's user (as root, before jobs stopped
    being root). Every privilege bit is cleared before the job is reported ended, and the
    results belong to the job's user, never to root; below the run root, only the backend's user
    can reach them at all."""
    script = r"""
        r=$TAO_RESULTS_DIR
        cp /bin/sh "$r/setuid"; chmod 4755 "$r/setuid"
        cp /bin/sh "$r/setgid"; chmod 2755 "$r/setgid"
        mkdir "$r/group"; chmod 2775 "$r/group"
        cp /bin/sh "$r/group/both"; chmod 6755 "$r/group/both"
        ls -ln "$r" "$r/group" >&2
    """
    plan_route = {}
    if route == "results mount":
        (tmp_path / "shared").mkdir()
        plan_route = {"route": OutputRoute(route="mount", destination=str(tmp_path / "shared" / "job-1"),
                                           reason="TAO_RESULTS_ROOT")}
    ref = local_backend.submit(make_plan(tmp_path, script=script, **plan_route)).backend_ref
    assert finished(local_backend, ref).state == "COMPLETE", local_backend.logs(ref)
    results = Path(str(local_backend.results_path(ref)))
    left = {path.relative_to(results).as_posix(): path.lstat() for path in [results, *results.rglob("*")]}
    assert {"setuid", "setgid", "group", "group/both"} <= set(left), local_backend.logs(ref)
    privileged = {name: oct(found.st_mode) for name, found in left.items()
                  if found.st_mode & (stat.S_ISUID | stat.S_ISGID)}
    assert privileged == {}, f"the job left privilege bits in its results: {privileged}"
    assert {found.st_uid for found in left.values()} != {0} and all(found.st_uid != 0 for found in left.values())
    if route == "run root":
        assert stat.S_IMODE((local_backend.run_root / "job-1").stat().st_mode) & 0o077 == 0


@needs_root
def test_disarming_results_never_follows_a_link_and_removes_device_nodes(tmp_path: Path) -> None:
    """What :func:`disarm` meets in a job's results: setuid and setgid files and directories (bits
    cleared), a device node (removed: the job cannot make one, but the rule holds for whatever
    is found), a FIFO (not opened, so nothing blocks), and a symlink to a setuid file outside
    (not followed: the file outside keeps its bits)."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"#!/bin/sh\n")
    outside.chmod(0o4755)
    results = tmp_path / "results"
    (results / "deep").mkdir(parents=True)
    (results / "deep").chmod(0o2775)
    for name, mode in (("setuid", 0o4755), ("deep/setgid", 0o2755), ("plain", 0o644)):
        (results / name).write_bytes(b"x")
        (results / name).chmod(mode)
    os.mknod(results / "deep" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(results / "fifo")
    (results / "link").symlink_to(outside)
    fd = os.open(results, os.O_PATH | os.O_DIRECTORY)
    try:
        done = disarm(fd)
    finally:
        os.close(fd)
    assert sorted(done) == ["cleared the setuid/setgid bits of deep", "cleared the setuid/setgid bits of deep/setgid",
                            "cleared the setuid/setgid bits of setuid", "removed the device node deep/null"]
    assert [oct(stat.S_IMODE((results / name).lstat().st_mode)) for name in ("deep", "deep/setgid", "setuid", "plain")
            ] == [oct(0o775), oct(0o755), oct(0o755), oct(0o644)]
    assert not (results / "deep" / "null").exists() and stat.S_ISFIFO((results / "fifo").lstat().st_mode)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o4755


@pytest.mark.usefixtures("sandbox")
def test_every_tmpfs_a_job_can_write_is_sized_by_its_request(tmp_path: Path, local_backend: LocalBackend) -> None:
    """Only ``/tmp`` and ``/dev/shm`` were sized: the frame's root and ``/dev`` were tmpfs of
    half the host's memory each, and a job of 64Mi held 256 MiB in each. Now the root (with
    ``/tmp`` on it) is ``ephemeral_storage``, ``/dev/shm`` is ``shm_size``, and ``/etc`` and
    ``/dev`` are read-only once made: 16 MiB fits nowhere in a frame of 8Mi and 8Mi."""
    script = r"""
        for d in / /tmp /dev /dev/shm /etc; do
          if dd if=/dev/zero of="$d/filler" bs=1M count=16 2>/dev/null; then echo "held 16 MiB in $d"; fi
          rm -f "$d/filler" 2>/dev/null
        done
        grep ' - tmpfs ' /proc/self/mountinfo > "$TAO_RESULTS_DIR/tmpfs"
    """
    plan = make_plan(tmp_path, script=script, shape={"shm_size": "8Mi", "ephemeral_storage": "8Mi"})
    ref = local_backend.submit(plan).backend_ref
    assert finished(local_backend, ref).state == "COMPLETE", local_backend.logs(ref)
    assert local_backend.logs(ref) == ""
    writable = {}
    for line in (Path(str(local_backend.results_path(ref))) / "tmpfs").read_text().splitlines():
        fields = line.split()
        mount_point, options, super_options = fields[4], fields[5].split(","), fields[-1].split(",")
        if "rw" in options:
            writable[mount_point] = next((o for o in super_options if o.startswith("size=")), "no size")
    assert writable == {"/": "size=8192k", "/dev/shm": "size=8192k"}, writable


@pytest.mark.parametrize("reached", ["the staging root", "the records' directory"])
def test_a_request_cannot_mount_where_its_submit_keeps_state(tmp_path: Path, local_backend: LocalBackend,
                                                             no_cloud: None, reached: str) -> None:
    """A Prefect local target stages under its own ``staging_root``, and its records block may
    name any directory: neither came from the environment, so a job mounted the staging root
    read-write and rewrote another job's staged input. Submit refuses such a mount, whichever
    way the target and the records are configured, and nothing of the job runs."""
    staging, records = tmp_path / "staging", tmp_path / "records"
    (staging / "other-job").mkdir(parents=True)
    (staging / "other-job" / "input.bin").write_bytes(b"staged for another job")
    source = staging if reached == "the staging root" else records
    request = JobRequest.model_validate(args_request(
        job_id="reaching-job", command=["sh", "-c", "echo rewritten > /reached/other-job/input.bin"],
        mounts=[{"source": str(source), "target": "/reached", "read_only": False}]))
    with pytest.raises(UsageError, match=f"mount source '{source}' .*tao-data-io's own state") as refused:
        submit(request, local_backend, RecordStore(records), staging_root=staging)
    assert "mount only the directories" in str(refused.value)
    assert (staging / "other-job" / "input.bin").read_bytes() == b"staged for another job"
    assert not (local_backend.run_root / "reaching-job").exists()


def test_another_jobs_results_are_an_input_never_a_place_to_write(tmp_path: Path, local_backend: LocalBackend,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``$TAO_RESULTS_ROOT`` set, a job mounted ``$TAO_RESULTS_ROOT/<other job>`` read-write
    and overwrote its ``model.pth``: only a source holding the root was refused. Another job's
    results may be read (a pipeline's next step), never written."""
    root = tmp_path / "results-root"
    (root / "train-job").mkdir(parents=True)
    (root / "train-job" / "model.pth").write_bytes(b"trained weights")
    monkeypatch.setenv("TAO_RESULTS_ROOT", str(root))
    writing = make_plan(tmp_path, script="echo overwritten > /previous/model.pth",
                        mounts=[{"source": str(root / "train-job"), "target": "/previous", "read_only": False}])
    with pytest.raises(UsageError, match="would let the job write .*mount it read-only"):
        local_backend.preflight(writing)
    with pytest.raises(UsageError, match="would let the job write"):
        local_backend.submit(writing)
    reading = make_plan(tmp_path, "reading-job", script="cat /previous/model.pth",
                        mounts=[{"source": str(root / "train-job"), "target": "/previous"}])
    ref = local_backend.submit(reading).backend_ref
    assert finished(local_backend, ref).state == "COMPLETE" and local_backend.logs(ref) == "trained weights"
    assert (root / "train-job" / "model.pth").read_bytes() == b"trained weights"
