"""What the local backend checks before it creates anything: the tools are installed, bubblewrap
can make a frame on this kernel, and every path the plan binds exists on this host.

Why on the host and not only in the frame: these failures have one fix each that the user can
act on at once (install a package, set a sysctl, stage again), and they need no job to find.
The verify probe still checks every path *inside* the frame — a path can vanish in between.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from ...fs.atomic import atomic_write
from ...launch.plan import LaunchPlan
from ...reporting import human_size
from ...quantities import quantity_bytes
from ...routing import RESULTS_ROOT_VARIABLE
from .binding import BoundSource, identify, open_source, resolved_path
from .seccomp import filter_fd
from .sandbox import FRAME_PATH, Bind, Host, frame_memory_bytes, frame_root_bytes, mount_source, trivial_argv

USERNS_HINT = ("bubblewrap needs user namespaces: check `sysctl user.max_user_namespaces` (must be above 0), "
               "`sysctl kernel.unprivileged_userns_clone` (Debian kernels: must be 1) and "
               "`sysctl kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10 and later: 0, or an AppArmor "
               "profile for bwrap); inside a container, its seccomp profile must allow unshare(2)")
_CHECK_TIMEOUT_S = 30


def needs_nsenter(plan: LaunchPlan) -> bool:
    """Ranks above 0 join rank 0's private network with nsenter (see sandbox.Namespaces)."""
    return plan.nodes > 1 and not plan.network


def check_sandbox(host: Host) -> None:
    """Start a trivial frame made as a job's is (``true``, every namespace its own, the user
    switched where root starts it); raise with the fix if it fails."""
    seccomp = filter_fd()
    try:
        done = subprocess.run(trivial_argv(host, seccomp), env={"PATH": FRAME_PATH}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=_CHECK_TIMEOUT_S, pass_fds=(seccomp,))
    except subprocess.TimeoutExpired:
        raise UsageError(f"bubblewrap ({host.bwrap}) did not start a trivial sandbox within {_CHECK_TIMEOUT_S}s"
                         ) from None
    finally:
        os.close(seccomp)
    if done.returncode != 0:
        said = done.stderr.strip() or f"exit code {done.returncode}"
        raise UsageError(f"bubblewrap ({host.bwrap}) cannot start a sandbox here ({said}): {USERNS_HINT}")


#: Host directories no pre-positioned source may be, hold or lie in: the frame's own system, the
#: kernel's views, the host's runtime state and ``/var`` (cron spools and services' state, run as
#: root on the host).
_SYSTEM_ROOTS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr",
                 "/var")


@dataclass(frozen=True)
class SourceRules:
    """What no pre-positioned source may show a frame (see :func:`source_refusal`), and where no
    results directory may be (see :func:`results_refusal`)."""

    #: Never mounted, nor anything in or around them: tao-data-io's own state (run roots, staging
    #: roots, job records) and every home's hidden directories (credentials live there).
    private: Sequence[Path]
    #: Never mounted whole (a directory inside may be): every user's home.
    homes: Sequence[Path]
    #: The code the supervisor imports: read-only at most, nor anything around it.
    package_root: Path
    #: ``$TAO_RESULTS_ROOT``, which holds every job's results: never mounted whole, and a
    #: directory inside it (another job's results: a pipeline's next step reads them) read-only
    #: at most.
    results_root: Path | None = None


def _system_refusal(path: Path) -> str | None:
    if str(path) == "/" or any(_inside(path, Path(root)) for root in _SYSTEM_ROOTS):
        return "it is (or lies in) a system directory of this host"
    return None


#: The file that says "tao-data-io keeps state here" in a run root, a staging root and a records
#: directory (:func:`mark_state_root`): what no mount may lie in, whichever target or submit made it.
STATE_MARKER = ".tao-data-io-state"


def mark_state_root(root: Path) -> None:
    """Say in ``root`` (a directory tao-data-io keeps state in) that it does, once, so a later
    request's mount that lies in it is refused even by a backend that was told of other roots:
    another ``--workdir``, another target's staging root."""
    marker = root / STATE_MARKER
    if root.is_dir() and not os.path.lexists(marker):
        atomic_write(marker, b"tao-data-io keeps state in this directory: no job may mount what lies in it\n",
                     replace=False)


#: How far below a source its own state roots are looked for: a few levels, a bounded count of
#: entries (breadth first), so a dataset of a million files costs no more than this at submit.
_HELD_DEPTH = 3
_HELD_ENTRIES = 10_000


def _is_marker(directory: Path) -> bool:
    """Whether ``directory`` holds a marker this backend's user (or root) made: one a job planted
    in a read-write mount marks nothing."""
    try:
        found = os.lstat(directory / STATE_MARKER)
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode) and found.st_uid in (0, os.geteuid())


def _marked(path: Path) -> Path | None:
    """A directory of ``path``, above it or a few levels below it (:data:`_HELD_DEPTH`) that holds
    a :data:`STATE_MARKER`: the nearest above first; None when none is found."""
    above = next((directory for directory in (path, *path.parents) if _is_marker(directory)), None)
    if above is not None:
        return above
    level, seen = [path], 0
    for _ in range(_HELD_DEPTH):
        below: list[Path] = []
        for directory in level:
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        seen += 1
                        if seen > _HELD_ENTRIES:
                            return None
                        if entry.is_dir(follow_symlinks=False):
                            child = Path(entry.path)
                            if _is_marker(child):
                                return child
                            below.append(child)
            except OSError:
                continue
        level = below
    return None


def _state_refusal(path: Path, rules: SourceRules) -> str | None:
    """Why ``path`` — as something a job reads or writes — would show tao-data-io's state, a
    home, or a home's hidden directory; None when it would not."""
    home = next((home for home in rules.homes if _inside(home, path)), None)
    if home is not None:
        return f"it holds {home}, a home directory"
    private = next((root for root in rules.private if _inside(path, root) or _inside(root, path)), None) or _marked(path)
    if private is not None:
        return (f"it holds or lies in {private}: tao-data-io's own state (job records, staging and run roots) or a "
                "hidden directory of a home (~/.ssh, ~/.aws, …)")
    return None


def source_refusal(source: Path, read_only: bool, rules: SourceRules) -> str | None:
    """Why the object at ``source`` (its own path, symlinks resolved) may not be mounted, or None.

    A request names its mounts, and a request can come from anyone who can reach a deployment:
    so no source may be ``/`` or a system directory (or lie in one), no source may hold a home
    directory or the results root, no source may hold or lie in tao-data-io's private state (job
    records, staging and run roots) or a dot-directory of a home such as ``~/.ssh``, and the code
    the supervisor imports and the results root may be mounted read-only at most — a writable
    mount of the code would let one job plant code that runs outside every frame, with the next
    job's credentials, and one in the results root would let it rewrite another job's results.
    """
    problem = _system_refusal(source) or _state_refusal(source, rules)
    if problem is not None:
        return problem
    results = rules.results_root
    if results is not None and _inside(results, source):
        return f"it holds {results}, the results root (every job's results)"
    if read_only:
        return None
    for kept, what in ((rules.package_root, "the code this backend runs"),
                       (results, "the results root, which holds every job's results")):
        if kept is not None and (_inside(source, kept) or _inside(kept, source)):
            return f"it would let the job write {kept} ({what}); mount it read-only"
    return None


def results_refusal(results: Path, rules: SourceRules) -> str | None:
    """Why ``results`` (a results mount's directory, ``$TAO_RESULTS_ROOT/<job id>``, its own path)
    may not be where a job writes, or None: not in a system directory, not holding a home, not
    in or around tao-data-io's state (a results root set to the run root once made a job's
    results directory its own run directory, which the supervisor writes as root), not around
    the code the supervisor runs."""
    problem = _system_refusal(results) or _state_refusal(results, rules)
    if problem is None and (_inside(results, rules.package_root) or _inside(rules.package_root, results)):
        problem = f"it holds or lies in {rules.package_root}, the code this backend runs"
    return problem


def check_binds(plan: LaunchPlan, binds: Sequence[Bind], rules: SourceRules) -> dict[str, BoundSource]:
    """Open each bind's source once (:func:`~.binding.open_source`), refuse a pre-positioned one
    that :func:`source_refusal` names and one of ours that is no longer exactly where it was made
    (a symlink planted on its way), and return target → the identity of each object checked
    (what the supervisor binds, and only that: see :mod:`.binding`)."""
    checked: dict[str, BoundSource] = {}
    for bind in binds:
        fd = open_source(bind.source)
        if fd is None:
            continue
        try:
            found = identify(bind.source, fd)
        finally:
            os.close(fd)
        if bind.root is not None:
            expected = _made_at(bind)
            if found.resolved != expected:
                raise UsageError(f"{bind.source} (for {bind.target}) is not where tao-data-io made it: it leads to "
                                 f"{found.resolved}, not {expected} (a symlink on its way). Nothing was bound: remove "
                                 "it, then stage and submit again")
        else:
            problem = source_refusal(Path(found.resolved), bind.read_only, rules)
            if problem:
                raise UsageError(f"mount source {bind.source!r} (target {bind.target}) leads to {found.resolved}, which "
                                 f"is refused: {problem}; mount only the directories the job reads or writes")
        checked[bind.target] = found
    return checked


def _made_at(bind: Bind) -> str:
    """Where a source tao-data-io made must be: its root as the kernel names it, and below that
    exactly the path it was made at."""
    assert bind.root is not None
    root = open_source(bind.root)
    if root is None:
        return bind.source
    try:
        return os.path.join(resolved_path(root), os.path.relpath(bind.source, bind.root))
    finally:
        os.close(root)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_paths(plan: LaunchPlan) -> None:
    """Every mount source exists on this host, and a results mount's root is a directory."""
    missing = [f"{mount.input} → {mount.target} ({mount_source(plan, mount)})" for mount in plan.mounts
               if not os.path.exists(mount_source(plan, mount))]
    if missing:
        raise UsageError(f"{len(missing)} input(s) of job {plan.job_id} are not on this host: {'; '.join(missing)}; "
                         "stage the request again, or fix the mount's source")
    if plan.route.route == "mount":
        root = Path(plan.route.destination).parent
        if not root.is_dir():
            raise UsageError(f"results go to the mount {root} ({RESULTS_ROOT_VARIABLE}), which is not a directory "
                             f"on this host: mount or create it, or unset {RESULTS_ROOT_VARIABLE}")


def check_memory_sizes(plan: LaunchPlan, memory_bytes: int | None) -> None:
    """Every tmpfs a job can write (its root with /tmp, and /dev/shm:
    :func:`~.sandbox.frame_memory_bytes`) is memory: for every rank together they may not exceed
    this host's (``memory_bytes``, from /proc/meminfo; None: unknown, nothing checked) — a job
    filling them would take the host's RAM from everything else."""
    if memory_bytes is None:
        return
    total = frame_memory_bytes(plan) * plan.nodes  # each rank's frame has its own
    if total > memory_bytes:
        tmp, shm = frame_root_bytes(plan), quantity_bytes(plan.shm_size)
        ranks = f" for each of its {plan.nodes} ranks" if plan.nodes > 1 else ""
        raise UsageError(f"job {plan.job_id}'s root with /tmp ({human_size(tmp)}: compute_shape.ephemeral_storage) "
                         f"and /dev/shm ({human_size(shm)}: compute_shape.shm_size){ranks} are memory in the local "
                         f"frame, {human_size(total)} in all, more than this host's {human_size(memory_bytes)}: "
                         "lower them")


def host_memory_bytes() -> int | None:
    """MemTotal of /proc/meminfo, in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
