"""One frame from a LaunchPlan: the bubblewrap argv and the environment. Pure, but for
:func:`host_system_dirs`, which reads what this host's userland looks like.

Why pure: what a job can see is the security property of this backend, so it is decided in one
place from the plan and a description of the host, and table-tested without starting anything.

What the frame sees — what a pod would see, and nothing else of the host:

* new mount, pid, ipc, uts and cgroup namespaces, and no network unless ``plan.network``; ranks
  above 0 of a multi-node job join rank 0's network (see :class:`Namespaces`). Who the job is on
  the host is :mod:`.run_as`'s decision: the unprivileged user that started bubblewrap (in a user
  namespace of its own), or — started by root — ``run_as_user`` through ``setpriv``, never root;
* the host's userland read-only (``/usr``, ``/bin``, ``/sbin``, ``/lib``, ``/lib64`` and the parts
  of ``/etc`` a program needs, :data:`ETC_ENTRIES`, where present; a symlink such as usrmerge's
  ``/bin -> usr/bin`` stays a symlink). The plan's ``image`` is recorded, never pulled: this
  backend runs the host's programs;
* a root of its own: a tmpfs of ``plan.ephemeral_storage`` (a container's writable layer), holding
  a world-writable ``/tmp`` (also ``HOME`` and the working directory: lost at exit); a fresh
  ``/proc`` whose ``/proc/sys`` and ``/proc/sysrq-trigger`` are read-only; a ``/dev`` of device
  nodes only, read-only once made; ``/dev/shm`` of ``plan.shm_size``. Every tmpfs a job can write
  has a size, so what a job keeps in files in memory is what the request says
  (:func:`frame_memory_bytes`);
* each mount of the plan at its target (read-only where the plan says so), the results directory
  read-write from its host directory, and — for the verify probe only — the probe's files.
  Each is bound from a descriptor the supervisor opened and checked (``--bind-fd``, see
  :mod:`tao_data_io.launch.binding`), never from a path that could be swapped meanwhile; a source with no
  descriptor leaves its target absent, and the verify probe, run inside, says so per path
  (preflight reports it earlier, on the host). bubblewrap mounts every bind ``nosuid``;
* no capabilities (``--cap-drop ALL``): the job obeys file modes like a pod's user does, so an
  unreadable input fails verification, and no read-only bind can be remounted writable; and no
  user namespace of its own, nor the kernel keyring (a seccomp filter, :mod:`.seccomp`);
* its own session (``--new-session``: no terminal to inject keystrokes into). There is no
  ``--die-with-parent``: the job outlives whoever submitted it;
* the command as pid 1 of its pid namespace (``--as-pid-1``), as a container's entrypoint is:
  when it ends, the kernel ends every other process of the frame with it — what it left in
  the background (``nohup``, ``setsid``) included — and a process of the job that stops pid 1
  (``ptrace``) stops the command itself, so the job is then truly still running. (bubblewrap's
  own reaper as pid 1 would outlive the command for as long as any orphan ran.) ``setpriv``, when
  there is one, execs the command in its own place, so the command is still pid 1.

Environment: bubblewrap passes its own environment on, so the caller starts it with exactly
:func:`frame_env` — never ``--setenv``, because argv is world-readable in ``/proc``.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .plan import PROBE_DIR, LaunchPlan
from .rendezvous import rendezvous_env
from .sources import Bind, plan_binds
from ..quantities import quantity_bytes
from .run_as import SWITCH_CAPABILITIES, RunAs

#: The host directories that make up the userland a frame runs.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64")
#: What of the host's ``/etc`` a program needs (users, name resolution, the loader's cache,
#: CA certificates, time zone) — and nothing else: the host's ``/etc`` also holds ``shadow``, SSH
#: host keys, cluster credentials and private TLS keys (``ssl/private``), which a frame running as
#: root would otherwise read.
ETC_ENTRIES = ("alternatives", "ca-certificates", "ca-certificates.conf", "debian_version", "gai.conf", "group",
               "host.conf", "hosts", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "mime.types",
               "nsswitch.conf", "os-release", "passwd", "protocols", "python3", "resolv.conf", "services",
               "ssl/certs", "ssl/openssl.cnf", "timezone")
FRAME_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FRAME_LANG = "C.UTF-8"
#: HOME and the working directory (no home directory of the host is visible), on the frame's root.
FRAME_TMP = "/tmp"
#: The frame's root (its writable layer, /tmp included) when the request gives no
#: ephemeral_storage: what a laptop spares.
DEFAULT_FRAME_ROOT = "4Gi"
#: Where anyone may write, as on any Unix: the sticky bit keeps each user's files their own.
_SHARED_DIR_MODE = "1777"
#: Ranks share one loopback (see :class:`Namespaces`), so rank 0 is reached at 127.0.0.1 (on
#: :data:`~tao_data_io.launch.rendezvous.MASTER_PORT`).
MASTER_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class SystemDir:
    path: str
    #: The link's target when the host path is a symlink (``usr/bin`` for a usrmerged ``/bin``).
    link: str | None = None


def host_system_dirs() -> tuple[SystemDir, ...]:
    """The :data:`SYSTEM_DIRS` this host has, as the frame must reproduce them."""
    found = []
    for path in (*SYSTEM_DIRS, *(f"/etc/{entry}" for entry in ETC_ENTRIES)):
        if os.path.islink(path):
            found.append(SystemDir(path, os.readlink(path)))
        elif os.path.exists(path):
            found.append(SystemDir(path))
    return tuple(found)


@dataclass(frozen=True)
class Host:
    """Where the tools are on this host and what its userland looks like."""

    bwrap: str
    system: tuple[SystemDir, ...]
    #: Needed only for ranks above 0 of a multi-node job without network.
    nsenter: str | None = None
    #: Who the command becomes when bubblewrap runs as root (:mod:`.run_as`); None: bubblewrap
    #: runs as an unprivileged user, whom its own user namespace maps.
    run_as: RunAs | None = None


@dataclass(frozen=True)
class Namespaces:
    """Rank 0's user and network namespaces, as paths a rank's ``nsenter`` opens.

    Why: each frame gets a fresh network namespace with only a loopback, so two ranks in two
    frames could not reach each other, and sharing the host's network would expose every service
    on this host's loopback to the job. So ranks above 0 start inside rank 0's network namespace
    (``nsenter`` joins rank 0's user namespace, which owns it, then the namespace; bubblewrap then
    keeps it): all ranks share one private loopback where rank 0 listens on
    ``MASTER_ADDR:MASTER_PORT``, and the host's network stays out of reach. Everything else —
    mounts, pids, ``/tmp``, ``/dev/shm``, hostname — stays per rank, as per pod. A frame started
    by root has no user namespace of its own (``user`` None): root joins the network namespace
    alone.
    """

    user: str | None
    net: str


def frame_argv(plan: LaunchPlan, host: Host, binds: Sequence[Bind], opened: Mapping[str, int],
               command: Sequence[str], *, rank: int = 0, join: Namespaces | None = None,
               status_fd: int | None = None, seccomp_fd: int | None = None) -> list[str]:
    """The argv that runs ``command`` in ``plan``'s frame (see the module docstring).

    ``binds`` are :func:`frame_binds`; ``opened`` maps a bind's target to the descriptor of its
    source (a bind without one is left out: its target stays absent); ``join`` rank 0's
    namespaces for a higher rank; ``status_fd`` a descriptor on which bubblewrap reports the
    sandbox's pid and the command's exit code; ``seccomp_fd`` the filter of :mod:`.seccomp`
    (bubblewrap reads it whole, so one descriptor per frame).
    """
    argv: list[str] = []
    if join is not None:
        if host.nsenter is None:
            raise ValueError("joining rank 0's namespaces needs nsenter")
        argv += [host.nsenter, *([f"--user={join.user}"] if join.user is not None else []), f"--net={join.net}", "--"]
    argv += [host.bwrap, *namespace_args(host, share_net=plan.network or join is not None), "--as-pid-1",
             "--new-session", *capability_args(host), "--hostname", f"{plan.job_id}-{rank}",
             *userland_args(host.system, root_bytes=frame_root_bytes(plan), shm_bytes=quantity_bytes(plan.shm_size))]
    for directory in mount_parents(bind.target for bind in binds if bind.target in opened):
        argv += ["--dir", directory]
    for bind in binds:
        if bind.target in opened:
            argv += ["--ro-bind-fd" if bind.read_only else "--bind-fd", str(opened[bind.target]), bind.target]
    if status_fd is not None:
        argv += ["--json-status-fd", str(status_fd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    prefix = host.run_as.prefix() if host.run_as is not None else []
    return argv + ["--chdir", FRAME_TMP, "--", *prefix, *command]


def node_frame_argv(plan: LaunchPlan, host: Host, binds: Sequence[Bind], command: Sequence[str], *,
                    share_net: bool, seccomp_fd: int) -> list[str]:
    """The frame of :func:`frame_argv`, for a command started on another host (a SLURM node) by
    its own unprivileged user. Two things differ, each for that host: each bind is made from its
    source's path (no descriptor travels between hosts; the bind is made by the job's own user,
    in its own user namespace, so a source swapped after the check gives it nothing that user
    could not read anyway); and the command is not pid 1 — SLURM ends a step by signalling each
    of its processes, and a namespace's init ignores a signal it has no handler for, so a shell
    command would outlive its cancel until the kill. When the command ends, bubblewrap's own init
    ends, and the kernel ends every process left in the frame with it."""
    argv = [host.bwrap, *namespace_args(host, share_net=share_net), "--new-session", *capability_args(host),
            "--hostname", plan.job_id,
            *userland_args(host.system, root_bytes=frame_root_bytes(plan), shm_bytes=quantity_bytes(plan.shm_size))]
    for directory in mount_parents(bind.target for bind in binds):
        argv += ["--dir", directory]
    for bind in binds:
        argv += ["--ro-bind" if bind.read_only else "--bind", bind.source, bind.target]
    return argv + ["--seccomp", str(seccomp_fd), "--chdir", FRAME_TMP, "--", *command]


def mount_parents(targets: Iterable[str]) -> list[str]:
    """The directories above the mount targets that the frame's root must hold, parents first
    and none inside another target (that is the mounted source's own). Made here, not left to
    bubblewrap, which makes a target's missing parents mode 0700: a job that is not root could
    not reach its own inputs."""
    targets = set(targets)
    parents: set[str] = set()
    for target in targets:
        parent = posixpath.dirname(target)
        while parent != "/" and parent not in parents:
            parents.add(parent)
            parent = posixpath.dirname(parent)
    inside_a_target = {parent for parent in parents for target in targets
                       if parent == target or parent.startswith(target + "/")}
    return sorted(parents - inside_a_target, key=lambda directory: (directory.count("/"), directory))


def namespace_args(host: Host, *, share_net: bool) -> list[str]:
    """Every namespace of the frame its own, the network unless ``share_net``; a user namespace
    only for an unprivileged bubblewrap, which maps its own user (see :mod:`.run_as`)."""
    owned = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if host.run_as is None:
        owned.insert(0, "--unshare-user")
    return owned if share_net else [*owned, "--unshare-net"]


def capability_args(host: Host) -> list[str]:
    """No capability for the command; a root-started bubblewrap keeps only what ``setpriv``
    needs for its one exec (:data:`~.run_as.SWITCH_CAPABILITIES`), and ``setpriv`` drops them."""
    argv = ["--cap-drop", "ALL"]
    if host.run_as is not None:
        for capability in SWITCH_CAPABILITIES:
            argv += ["--cap-add", capability]
    return argv


def frame_root_bytes(plan: LaunchPlan) -> int:
    """The frame's root, ``/tmp`` on it: what a container's writable layer is, so the request's
    ``ephemeral_storage`` — memory here (a tmpfs), so bound, never half the host's RAM."""
    return quantity_bytes(plan.ephemeral_storage or DEFAULT_FRAME_ROOT)


def frame_memory_bytes(plan: LaunchPlan) -> int:
    """The most memory one rank's frame can hold in files: every tmpfs a job can write (its root
    and ``/dev/shm``; ``/etc`` and ``/dev`` are read-only once made)."""
    return frame_root_bytes(plan) + quantity_bytes(plan.shm_size)


def userland_args(system: Sequence[SystemDir], *, root_bytes: int, shm_bytes: int) -> list[str]:
    """A root of ``root_bytes`` holding the host's userland, read-only; the chosen ``/etc``
    entries sit on an ``/etc`` of the frame's own, made read-only once they are in place; a
    world-writable ``/tmp``; a fresh ``/proc`` with the kernel's settings read-only; a ``/dev``
    of device nodes, read-only once ``/dev/shm`` (``shm_bytes``) is in it."""
    argv = ["--size", str(root_bytes), "--tmpfs", "/"]
    etc = [entry for entry in system if entry.path.startswith("/etc/")]
    if etc:
        argv += ["--tmpfs", "/etc"]
    for directory in system:
        argv += (["--symlink", directory.link, directory.path] if directory.link is not None
                 else ["--ro-bind", directory.path, directory.path])
    if etc:
        argv += ["--remount-ro", "/etc"]
    return argv + ["--perms", _SHARED_DIR_MODE, "--dir", FRAME_TMP,
                   "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
                   "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger",
                   "--dev", "/dev", "--perms", _SHARED_DIR_MODE, "--size", str(shm_bytes), "--tmpfs", "/dev/shm",
                   "--remount-ro", "/dev"]


def trivial_argv(host: Host, seccomp_fd: int) -> list[str]:
    """A frame as a job's is made that runs ``true``: can bubblewrap (with ``setpriv`` and the
    seccomp filter) work here?"""
    prefix = host.run_as.prefix() if host.run_as is not None else []
    return [host.bwrap, *namespace_args(host, share_net=False), *capability_args(host),
            *userland_args(host.system, root_bytes=1 << 20, shm_bytes=1 << 20), "--seccomp", str(seccomp_fd), "--",
            *prefix, "true"]


def frame_binds(plan: LaunchPlan, results_host: str, probe_dir: str | None = None) -> list[Bind]:
    """Every bind of the frame, a parent before anything mounted inside it: the plan's
    (:func:`~tao_data_io.launch.sources.plan_binds`) and, for the probe's frame only,
    ``probe_dir`` (the probe's files, read-only at :data:`PROBE_DIR`)."""
    binds = plan_binds(plan, results_host)
    if probe_dir is not None:
        binds.append(Bind(probe_dir, PROBE_DIR, read_only=True, root=posixpath.dirname(probe_dir)))
    return sorted(binds, key=lambda bind: bind.target.count("/"))


def frame_env(plan: LaunchPlan, *, rank: int = 0, credentials: Mapping[str, str] | None = None) -> dict[str, str]:
    """The frame's whole environment: a fixed PATH/LANG/HOME, the plan's variables, the rendezvous
    variables of a multi-node job (:func:`~tao_data_io.launch.rendezvous.rendezvous_env`, as an
    Indexed Job's pods get them), and the projected credentials — nothing of the host's."""
    env = {"PATH": FRAME_PATH, "LANG": FRAME_LANG, "HOME": FRAME_TMP, **plan.env}
    if plan.nodes > 1:
        env.update(rendezvous_env(nodes=plan.nodes, gpus_per_node=plan.gpus, rank=str(rank), master_addr=MASTER_ADDR))
    env.update(credentials or {})
    return env
