"""What the local backend checks before it creates anything: the tools are installed, bubblewrap
can make a frame on this kernel, and every path the plan binds exists on this host.

Why on the host and not only in the frame: these failures have one fix each that the user can
act on at once (install a package, set a sysctl, stage again), and they need no job to find.
The verify probe still checks every path *inside* the frame — a path can vanish in between.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ..errors import UsageError
from ..launch.plan import LaunchPlan
from ..routing import RESULTS_ROOT_VARIABLE
from .sandbox import FRAME_PATH, Host, SystemDir, mount_source, trivial_argv

BWRAP_INSTALL = "install it: apt-get install bubblewrap (Debian, Ubuntu), dnf install bubblewrap (Fedora, RHEL)"
NSENTER_INSTALL = "install it: apt-get install util-linux (Debian, Ubuntu), dnf install util-linux (Fedora, RHEL)"
USERNS_HINT = ("bubblewrap needs user namespaces: check `sysctl user.max_user_namespaces` (must be above 0), "
               "`sysctl kernel.unprivileged_userns_clone` (Debian kernels: must be 1) and "
               "`sysctl kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10 and later: 0, or an AppArmor "
               "profile for bwrap); inside a container, its seccomp profile must allow unshare(2)")
_CHECK_TIMEOUT_S = 30


def find_tool(name: str, install: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UsageError(f"{name} is not installed here (not on PATH), and the local backend needs it: {install}")
    return path


def needs_nsenter(plan: LaunchPlan) -> bool:
    """Ranks above 0 join rank 0's private network with nsenter (see sandbox.Namespaces)."""
    return plan.nodes > 1 and not plan.network


def check_sandbox(bwrap: str, system: Sequence[SystemDir]) -> None:
    """Start a trivial frame (``true`` with every namespace unshared); raise with the fix if it fails."""
    try:
        done = subprocess.run(trivial_argv(Host(bwrap=bwrap, system=tuple(system))), env={"PATH": FRAME_PATH}, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError(f"bubblewrap ({bwrap}) did not start a trivial sandbox within {_CHECK_TIMEOUT_S}s") from None
    if done.returncode != 0:
        said = done.stderr.strip() or f"exit code {done.returncode}"
        raise UsageError(f"bubblewrap ({bwrap}) cannot start a sandbox here ({said}): {USERNS_HINT}")


#: Host directories no pre-positioned source may be, hold or lie in: the frame's own system, the
#: kernel's views and the host's runtime state.
_SYSTEM_ROOTS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr",
                 "/var/run")


def check_mount_sources(plan: LaunchPlan, *, package_root: Path, private: Sequence[Path],
                        home: Path | None) -> None:
    """Refuse a pre-positioned source that would show the frame more of the host than data.

    A request names its mounts, and a request can come from anyone who can reach a deployment:
    so no source may be ``/`` or a system directory (or lie in one), no source may hold the
    user's home directory, no source may hold or lie in tao-data-io's private state (job records,
    other jobs' work directories) or a dot-directory of the home such as ``~/.ssh``, and the code
    the supervisor imports (``package_root``) may be mounted read-only at most — a writable mount
    there would let one job plant code that runs outside every frame, with the next job's
    credentials.
    """
    for mount in plan.mounts:
        if mount.origin != "pre-positioned":
            continue
        source = Path(os.path.realpath(mount.source))
        problem = None
        if str(source) == "/" or any(_inside(source, Path(root)) for root in _SYSTEM_ROOTS):
            problem = "it is (or lies in) a system directory of this host"
        elif home is not None and _inside(home, source):
            problem = f"it holds the home directory {home}"
        elif any(_inside(source, root) or _inside(root, source) for root in private):
            problem = "it holds or lies in tao-data-io's own state (job records, job work directories) or a " \
                      "hidden directory of the home (~/.ssh, ~/.aws, …)"
        elif not mount.read_only and (_inside(package_root, source) or _inside(source, package_root)):
            problem = (f"it would let the job write the code this backend runs ({package_root}); mount it "
                       "read-only, or mount a directory of data")
        if problem:
            raise UsageError(f"mount source {mount.source!r} (target {mount.target}) is refused: {problem}; "
                             "mount only the directories the job reads or writes")


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
