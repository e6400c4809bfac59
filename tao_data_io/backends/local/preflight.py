"""What the local backend checks before it creates anything: the tools are installed, bubblewrap
can make a frame on this kernel, and the plan fits this host's memory. Which host paths a frame
may bind is the launch seam's rule (:mod:`tao_data_io.launch.sources`), shared with every backend
that binds this host's files.

Why on the host and not only in the frame: these failures have one fix each that the user can
act on at once (install a package, set a sysctl, stage again), and they need no job to find.
The verify probe still checks every path *inside* the frame — a path can vanish in between.
"""

from __future__ import annotations

import os
import subprocess

from ...errors import UsageError
from ...launch.plan import LaunchPlan
from ...reporting import human_size
from ...quantities import quantity_bytes
from ...launch.seccomp import filter_fd
from ...launch.sandbox import FRAME_PATH, Host, frame_memory_bytes, frame_root_bytes, trivial_argv

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
