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
import subprocess
from pathlib import Path

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.backends.local.backend import LocalBackend
from tao_data_io.launch.results_owner import MAX_DEPTH, take_back
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


def _routed(tmp_path: Path, route: str) -> dict[str, OutputRoute]:
    """``make_plan``'s route for ``route``: the run root's results directory (its default), or a
    results mount (``$TAO_RESULTS_ROOT/job-1`` under ``tmp_path/shared``)."""
    if route != "results mount":
        return {}
    (tmp_path / "shared").mkdir()
    return {"route": OutputRoute(route="mount", destination=str(tmp_path / "shared" / "job-1"),
                                 reason="TAO_RESULTS_ROOT")}


def _remove_deep(tree: Path) -> None:
    """Remove a tree deeper than Python's recursion limit, which pytest's own clean-up of old
    temporary directories (``shutil.rmtree``) cannot."""
    subprocess.run(["rm", "-rf", "--", str(tree)], check=True)


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
    being root). Every privilege bit is cleared before the job is reported ended, and the results
    are the backend's user's again (nothing else running as the job's user can change them);
    below the run root, only the backend's user can reach them at all."""
    script = r"""
        r=$TAO_RESULTS_DIR
        cp /bin/sh "$r/setuid"; chmod 4755 "$r/setuid"
        cp /bin/sh "$r/setgid"; chmod 2755 "$r/setgid"
        mkdir "$r/group"; chmod 2775 "$r/group"
        cp /bin/sh "$r/group/both"; chmod 6755 "$r/group/both"
        ls -ln "$r" "$r/group" >&2
    """
    ref = local_backend.submit(make_plan(tmp_path, script=script, **_routed(tmp_path, route))).backend_ref
    assert finished(local_backend, ref).state == "COMPLETE", local_backend.logs(ref)
    results = Path(str(local_backend.results_path(ref)))
    left = {path.relative_to(results).as_posix(): path.lstat() for path in [results, *results.rglob("*")]}
    assert {"setuid", "setgid", "group", "group/both"} <= set(left), local_backend.logs(ref)
    privileged = {name: oct(found.st_mode) for name, found in left.items()
                  if found.st_mode & (stat.S_ISUID | stat.S_ISGID)}
    assert privileged == {}, f"the job left privilege bits in its results: {privileged}"
    assert {found.st_uid for found in left.values()} == {os.geteuid()}  # the backend's again: the job's user's no more
    if route == "run root":
        assert stat.S_IMODE((local_backend.run_root / "job-1").stat().st_mode) & 0o077 == 0


@needs_root
def test_a_job_that_hides_setuid_files_thousands_of_directories_deep_still_ends_recorded(
        tmp_path: Path, local_backend: LocalBackend) -> None:
    """The walk that takes results back failed half-way on a deep chain: setuid files stayed
    usable by host users, and the supervisor died before recording the job's end. Now the end is
    recorded, and every setuid or setgid file left lies below a directory closed to all but the
    backend's user."""
    script = r"""
        cd "$TAO_RESULTS_DIR"
        i=0; while [ $i -lt 1200 ]; do
          if [ $((i % 100)) -eq 3 ]; then cp /bin/sh evil; chmod 6755 evil; fi
          mkdir d && cd d || exit 9; i=$((i + 1))
        done
    """
    ref = local_backend.submit(make_plan(tmp_path, script=script)).backend_ref
    results = Path(str(local_backend.results_path(ref)))
    try:
        assert finished(local_backend, ref).state == "COMPLETE", local_backend.logs(ref, tail=5)
        found = subprocess.run(["find", str(results), "-perm", "/6000"], capture_output=True, text=True).stdout.split()
        assert found, "the job made no setuid file: the test proves nothing"

        def closed(path: Path) -> bool:
            return any(stat.S_IMODE(parent.stat().st_mode) == 0o700 and parent.stat().st_uid == os.geteuid()
                       for parent in path.parents if parent != results and results in parent.parents)

        assert [path for path in map(Path, found) if not closed(path)] == []
    finally:
        _remove_deep(results)


@needs_root
@pytest.mark.parametrize("route", ["run root", "results mount"])
def test_what_a_job_left_writable_by_others_is_writable_by_no_one_else_after_it(
        tmp_path: Path, local_backend: LocalBackend, route: str) -> None:
    """Given back to root, results kept the modes and ACLs the job set: others appended to a file
    it made 0666, planted files in a directory it made 0777, and a uid its ACL named rewrote a
    0600 file. After the job, nothing grants anyone but the owner a write, or anything an ACL
    or a file capability says."""
    script = r"""
        r=$TAO_RESULTS_DIR
        mkdir "$r/open" && chmod 0777 "$r/open" && chmod 0777 "$r"
        echo x > "$r/open/f" && chmod 0666 "$r/open/f"
        echo y > "$r/g" && chmod 0600 "$r/g"
        /usr/bin/python3 -c '
import os, struct, sys
def grant(path, default=False):
    mode = os.lstat(path).st_mode
    entries = [(1, (mode >> 6) & 7, -1), (2, 7, 1000), (4, (mode >> 3) & 7, -1), (0x10, 7, -1), (0x20, mode & 7, -1)]
    value = struct.pack("<I", 2) + b"".join(struct.pack("<HHi", t, p, i) for t, p, i in entries)
    os.setxattr(path, "system.posix_acl_default" if default else "system.posix_acl_access", value)
for path in sys.argv[1:]:
    grant(path)
grant(sys.argv[1], default=True)
print("granted")' "$r/open" "$r/g"
    """
    if not Path("/usr/bin/python3").exists():
        pytest.skip("the host userland has no /usr/bin/python3")
    ref = local_backend.submit(make_plan(tmp_path, script=script, **_routed(tmp_path, route))).backend_ref
    assert finished(local_backend, ref).state == "COMPLETE", local_backend.logs(ref)
    assert local_backend.logs(ref) == "granted\n", "the job could not set the ACLs: the test proves nothing"
    results = Path(str(local_backend.results_path(ref)))
    for path in [results, *results.rglob("*")]:
        found = path.lstat()
        assert stat.S_IMODE(found.st_mode) & 0o7022 == 0, (path, oct(found.st_mode))
        assert not {name for name in os.listxattr(path, follow_symlinks=False)
                    if name.startswith("system.posix_acl") or name == "security.capability"}, path


@needs_root
def test_a_results_directory_another_user_made_is_never_handed_over(tmp_path: Path, local_backend: LocalBackend,
                                                                   no_cloud: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty ``$TAO_RESULTS_ROOT/<job id>`` another user made (granting itself a way in by an
    ACL) passed as new: the job wrote there, and that user changed its results after. A results
    directory already there must be this backend's."""
    root = tmp_path / "results-root"
    (root / "their-job").mkdir(parents=True)
    os.chown(root / "their-job", 1000, 1000)
    monkeypatch.setenv("TAO_RESULTS_ROOT", str(root))
    request = JobRequest.model_validate(args_request(job_id="their-job", command=["true"]))
    with pytest.raises(UsageError, match="belongs to uid 1000, not to the local backend"):
        submit(request, local_backend, RecordStore(tmp_path / "records"), staging_root=tmp_path / "staging")
    assert (root / "their-job").stat().st_uid == 1000


@needs_root
@pytest.mark.parametrize("owner", [None, (0, 0)], ids=["unprivileged-backend", "root-backend"])
def test_taking_results_back_never_follows_a_link_and_removes_device_nodes(tmp_path: Path,
                                                                           owner: tuple[int, int] | None) -> None:
    """What :func:`take_back` meets in a job's results: setuid and setgid files and directories (bits
    cleared), a device node and a FIFO (removed, never opened: no result is one), and a symlink to
    a setuid file outside (not followed: the file outside keeps its bits and its owner); with an
    owner (a root backend), everything is the backend's user's again."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"#!/bin/sh\n")
    os.chown(outside, 65534, 65534)  # before the modes: a chown clears a file's setuid bit
    outside.chmod(0o4755)
    results = tmp_path / "results"
    (results / "deep").mkdir(parents=True)
    for name in ("setuid", "deep/setgid", "plain"):
        (results / name).write_bytes(b"x")
    os.mknod(results / "deep" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(results / "fifo")
    (results / "link").symlink_to(outside)
    for path in [results, *results.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    for name, mode in (("deep", 0o2775), ("setuid", 0o4755), ("deep/setgid", 0o2755), ("plain", 0o644)):
        (results / name).chmod(mode)
    fd = os.open(results, os.O_PATH | os.O_DIRECTORY)
    try:
        done = take_back(fd, owner)
    finally:
        os.close(fd)
    assert sorted(done) == ["cleared the setuid/setgid bits of deep", "cleared the setuid/setgid bits of deep/setgid",
                            "cleared the setuid/setgid bits of setuid", "removed the special file deep/null",
                            "removed the special file fifo"]
    assert [oct(stat.S_IMODE((results / name).lstat().st_mode)) for name in ("deep", "deep/setgid", "setuid", "plain")
            ] == [oct(0o755), oct(0o755), oct(0o755), oct(0o644)]
    assert not (results / "deep" / "null").exists() and not (results / "fifo").exists()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o4755 and outside.stat().st_uid == 65534
    owners = {path.lstat().st_uid for path in [results, *results.rglob("*")]}
    assert owners == ({65534} if owner is None else {0})


@needs_root
def test_results_thousands_of_directories_deep_are_taken_back_or_closed(tmp_path: Path) -> None:
    """A chain of directories deeper than Python's recursion limit made the walk (``os.fwalk``)
    fail half-way: setuid files were left, and the supervisor died before recording the job's
    end. The walk keeps one open directory per level and no recursion; past :data:`MAX_DEPTH` a
    directory is closed (the backend's user's alone, 0700), so nothing below it is reachable."""
    results = tmp_path / "results"
    results.mkdir()
    fd = os.open(results, os.O_DIRECTORY)
    try:
        for depth in range(1500):
            if depth in (3, MAX_DEPTH - 1, MAX_DEPTH + 5, 1400):
                made = os.open("setuid", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
                os.fchmod(made, 0o4755)
                os.close(made)
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    top = os.open(results, os.O_PATH | os.O_DIRECTORY)
    try:
        done = take_back(top, (0, 0))
        closed = "/".join(["d"] * MAX_DEPTH)
        assert done == ["cleared the setuid/setgid bits of " + "/".join(["d"] * 3 + ["setuid"]),
                        "cleared the setuid/setgid bits of " + "/".join(["d"] * (MAX_DEPTH - 1) + ["setuid"]),
                        f"closed {closed}: deeper than {MAX_DEPTH} levels, not walked, now the backend's user's alone"]
        assert stat.S_IMODE((results / closed).stat().st_mode) == 0o700 and (results / closed).stat().st_uid == 0
    finally:
        os.close(top)
        _remove_deep(results)


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


#: Python in the frame, asking the kernel for what the frame's filter refuses; each line says
#: what happened ("made" or the errno's name).
NAMESPACE_AND_KEYRING = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def said(result):
    return "made" if result >= 0 else errno.errorcode[ctypes.get_errno()]
print("unshare-user", said(libc.unshare(0x10000000)))
print("add_key", said(libc.syscall({"x86_64": 248, "aarch64": 217}[os.uname().machine], b"user", b"tao-test",
                                    b"shared", 6, ctypes.c_int(-2))))  # the process keyring: gone with it
"""


@pytest.mark.usefixtures("sandbox")
def test_a_job_makes_no_user_namespace_and_reaches_no_kernel_keyring(tmp_path: Path,
                                                                       local_backend: LocalBackend) -> None:
    """Inside a user namespace of its own a job is root of new mount namespaces: one mounted a
    tmpfs with no size (half the host's memory) past every size of its frame. And jobs of one
    user shared its kernel keyring: one job's ``add_key`` was the next one's to read. Both are
    refused by the frame's seccomp filter (EPERM); ``unshare -Urm`` fails the same way."""
    if not Path("/usr/bin/python3").exists():
        pytest.skip("the host userland has no /usr/bin/python3")
    script = f"/usr/bin/python3 -c '{NAMESPACE_AND_KEYRING}'; unshare -Urm true 2>/dev/null || echo unshare-refused"
    ref = local_backend.submit(make_plan(tmp_path, script=script)).backend_ref
    assert finished(local_backend, ref).state == "COMPLETE", local_backend.logs(ref)
    assert local_backend.logs(ref).splitlines() == ["unshare-user EPERM", "add_key EPERM", "unshare-refused"]


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


def test_a_request_cannot_mount_the_run_root_of_another_backend(tmp_path: Path, local_backend: LocalBackend) -> None:
    """Only this backend's run root was private: a job submitted with one ``--workdir`` mounted a
    job's results under another ``--workdir`` read-write and wrote there. Every root tao-data-io
    keeps state in says so (a marker), and what lies in one is refused, whichever backend asks."""
    from tao_data_io.backends.local.settings import LocalSettings

    first = local_backend.submit(make_plan(tmp_path, "first-job", script="echo mine > $TAO_RESULTS_DIR/model.pth"))
    assert finished(local_backend, first.backend_ref).state == "COMPLETE"
    elsewhere = LocalBackend(LocalSettings(run_root=str(tmp_path / "other-workdir")))
    results = local_backend.run_root / "first-job" / "results"
    plan = make_plan(tmp_path, "second-job", script="echo planted > /previous/model.pth",
                     mounts=[{"source": str(results), "target": "/previous", "read_only": False}])
    with pytest.raises(UsageError, match="which is refused: it holds or lies in .*tao-data-io's own state"):
        elsewhere.submit(plan)
    assert (results / "model.pth").read_text() == "mine\n"


def test_a_mount_that_holds_another_backends_state_is_refused_and_a_planted_marker_marks_nothing(
        tmp_path: Path, local_backend: LocalBackend) -> None:
    """A mount of a directory that holds another ``--workdir`` (not one inside it) read its jobs'
    logs and records: the roots a few levels below a source are looked for too. And a marker is
    the backend's own: one a job planted in a read-write mount does not refuse that data."""
    from tao_data_io.backends.local.settings import LocalSettings

    team = tmp_path / "team"
    other = LocalBackend(LocalSettings(run_root=str(team / "alice" / "work")))
    ref = other.submit(make_plan(tmp_path, "alices-job", script="true")).backend_ref
    assert finished(other, ref).state == "COMPLETE"
    holding = make_plan(tmp_path, "reader", script="true", mounts=[{"source": str(team), "target": "/team"}])
    with pytest.raises(UsageError, match="which is refused: it holds or lies in .*alice/work"):
        local_backend.preflight(holding)
    data = tmp_path / "data"
    data.mkdir()
    (data / ".tao-data-io-state").write_text("planted by a job")
    os.chown(data / ".tao-data-io-state", 65534, 65534)
    local_backend.preflight(make_plan(tmp_path, "planted", script="true", mounts=[{"source": str(data),
                                                                                   "target": "/data"}]))


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


@pytest.mark.parametrize("where", ["the run root", "a system directory", "the staging root"])
def test_a_results_mount_that_would_hold_tao_data_ios_state_is_refused(tmp_path: Path, local_backend: LocalBackend,
                                                                      no_cloud: None, monkeypatch: pytest.MonkeyPatch,
                                                                      where: str) -> None:
    """``$TAO_RESULTS_ROOT`` set to the run root made a job's results directory its own job
    directory: the run directory was handed to the job's user and bound read-write, and a job
    that planted ``run/rank-0.log.1 -> <a root-only file>`` had the supervisor (root) append its
    output there. A results root that is, holds or lies in tao-data-io's state or a system
    directory is refused before anything is made; nothing of the job runs."""
    staging = tmp_path / "staging"
    root = {"the run root": local_backend.run_root, "a system directory": Path("/var/tmp"),
            "the staging root": staging}[where]
    root.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TAO_RESULTS_ROOT", str(root))
    request = JobRequest.model_validate(args_request(job_id="results-job", command=["true"]))
    with pytest.raises(UsageError, match=f"TAO_RESULTS_ROOT {str(root)!r} .*; set it to a directory") as refused:
        submit(request, local_backend, RecordStore(tmp_path / "records"), staging_root=staging)
    assert "results-job" in str(refused.value)
    assert not (local_backend.run_root / "results-job" / "run").exists()  # nothing launched
    assert all(path.stat().st_uid == os.geteuid() for path in root.rglob("*"))  # nothing handed to the job's user


def test_a_job_id_never_takes_over_a_directory_under_the_results_root(tmp_path: Path, local_backend: LocalBackend,
                                                                      no_cloud: None,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Results go to ``$TAO_RESULTS_ROOT/<job id>``, and a request names its job id: one named
    after a directory already there (another store's job, a dataset) had it handed to the job's
    user and bound read-write. A first attempt's results directory is new or empty, or refused."""
    root = tmp_path / "results-root"
    (root / "shared-dataset").mkdir(parents=True)
    (root / "shared-dataset" / "important.txt").write_text("kept")
    monkeypatch.setenv("TAO_RESULTS_ROOT", str(root))
    request = JobRequest.model_validate(args_request(
        job_id="shared-dataset", command=["sh", "-c", 'echo overwritten > "$TAO_RESULTS_DIR/important.txt"']))
    with pytest.raises(UsageError, match="already holds files, .*another job's results or data"):
        submit(request, local_backend, RecordStore(tmp_path / "records"), staging_root=tmp_path / "staging")
    assert (root / "shared-dataset" / "important.txt").read_text() == "kept"
    assert (root / "shared-dataset").stat().st_uid == os.geteuid()


@pytest.mark.parametrize("uid", [4294967295, 4294967296, 2**40, 0, -1])
def test_a_run_as_id_that_is_root_or_no_id_at_all_is_refused(uid: int) -> None:
    """setpriv reads 4294967295 as -1, "leave it as it is": the job ran as root. Every value that
    is not an unprivileged id is refused by the settings, naming it."""
    from tao_data_io.backends.local.settings import LocalSettings

    with pytest.raises(UsageError, match=f"run_as_user {uid} is "):
        LocalSettings.from_mapping({"run_as_user": uid})


def test_the_job_directory_is_its_backends_users_alone_when_staging_shares_it(tmp_path: Path,
                                                                                no_cloud: None) -> None:
    """The command keeps its run root and staging root in one ``--workdir``: staging made the job
    directory first (0755), so the results below it were open to every host user while the job
    ran. It is the backend's user's alone, however it was made."""
    from tao_data_io.backends.local.settings import LocalSettings

    work = tmp_path / "work"
    backend = LocalBackend(LocalSettings(run_root=str(work)))
    request = JobRequest.model_validate(args_request(job_id="shared-dir", command=["true"]))
    submit(request, backend, RecordStore(tmp_path / "records"), staging_root=work)
    assert finished(backend, "local/shared-dir").state == "COMPLETE"
    assert stat.S_IMODE((work / "shared-dir").stat().st_mode) & 0o077 == 0
