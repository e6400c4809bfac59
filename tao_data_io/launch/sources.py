"""Host sources a frame binds: which the request may name, and binding what was checked.

Why in the launch seam: every backend that runs a job on this host's files — the local frame
(bubblewrap) and Docker (the daemon binds host paths) — must refuse the same sources (a system
directory, a home, tao-data-io's own state, another job's results) and bind the very object it
checked (:mod:`.binding`). One rule set, below both, so a new such backend cannot forget one.
"""

from __future__ import annotations

import os
import posixpath
import pwd
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..fs.atomic import atomic_write
from ..routing import RESULTS_ROOT_VARIABLE
from ..vocabulary import DEFAULT_RECORDS_ROOT, DEFAULT_WORKDIR, JOBS_DIR_VARIABLE, RECORDS_VARIABLE, WORKDIR_VARIABLE
from .binding import BoundSource, identify, open_source, resolved_path
from .plan import LaunchPlan, PlanMount


@dataclass(frozen=True)
class Bind:
    """One bind of a frame: the host source (a path, opened by :mod:`.binding`) and its target."""

    source: str
    target: str
    read_only: bool
    #: For a source tao-data-io made (a staged input, the results directory, the probe's files):
    #: the directory it was made beneath, where it must still lie exactly, with no symlink on
    #: the way. None for a pre-positioned source, which the request names.
    root: str | None = None


def mount_source(plan: LaunchPlan, mount: PlanMount) -> str:
    """Where ``mount``'s source is on this host."""
    return mount.source if mount.origin == "pre-positioned" else posixpath.join(plan.staging_dir, mount.source)


def plan_binds(plan: LaunchPlan, results_host: str) -> list[Bind]:
    """The binds of ``plan``'s frame, a parent before anything mounted inside it: its mounts
    (aliases of one target share one source: the plan checked it) and the results directory
    (``results_host`` at ``plan.results_dir``)."""
    binds: dict[str, Bind] = {}
    for mount in plan.mounts:
        root = None if mount.origin == "pre-positioned" else plan.staging_dir
        binds.setdefault(mount.target, Bind(mount_source(plan, mount), mount.target, mount.read_only, root))
    binds[plan.results_dir] = Bind(results_host, plan.results_dir, read_only=False,
                                   root=posixpath.dirname(results_host))
    return sorted(binds.values(), key=lambda bind: bind.target.count("/"))


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
    #: Code that runs outside every frame (the local supervisor imports it): read-only at most, nor
    #: anything around it.
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
    private = (next((root for root in rules.private if _inside(path, root) or _inside(root, path)), None)
               or _marked(path))
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
    the backend runs outside the frames and the results root may be mounted read-only at most — a writable
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
    results directory its own run directory, which the backend writes), not around the code
    the backend runs."""
    problem = _system_refusal(results) or _state_refusal(results, rules)
    if problem is None and (_inside(results, rules.package_root) or _inside(rules.package_root, results)):
        problem = f"it holds or lies in {rules.package_root}, the code this backend runs"
    return problem


def check_binds(plan: LaunchPlan, binds: Sequence[Bind], rules: SourceRules) -> dict[str, BoundSource]:
    """Open each bind's source once (:func:`~.binding.open_source`), refuse a pre-positioned one
    that :func:`source_refusal` names and one of ours that is no longer exactly where it was made
    (a symlink planted on its way), and return target → the identity of each object checked
    (what the frame binds, and only that: see :mod:`.binding`)."""
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
                raise UsageError(f"mount source {bind.source!r} (target {bind.target}) leads to {found.resolved}, "
                                 f"which is refused: {problem}; mount only the directories the job reads or writes")
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


def host_source_rules(plan: LaunchPlan, run_root: Path, package_root: Path) -> SourceRules:
    """What no pre-positioned source may show (see :func:`source_refusal`): tao-data-io's state
    is private, wherever this target or this submit keeps it — ``run_root`` (other jobs), the
    plan's state roots (the staging root and the records' directory this submit uses), and the
    ones the environment and the defaults name — and so is every home's hidden directories
    (credentials live there); every home — the password database's, whatever ``HOME`` says, and
    ``HOME`` — and the results root are never mounted whole; the results root and
    ``package_root`` (code that runs outside every frame) are read-only at most."""
    env = os.environ
    private = [run_root, *(Path(root) for root in plan.state_roots)]
    private += [Path(value).expanduser() for value in (env.get(RECORDS_VARIABLE), env.get(JOBS_DIR_VARIABLE),
                                                        DEFAULT_RECORDS_ROOT, env.get(WORKDIR_VARIABLE),
                                                        DEFAULT_WORKDIR)
                if value and not value.startswith("s3://")]
    homes = _homes()
    for home in homes:
        try:
            private += [entry for entry in home.iterdir() if entry.name.startswith(".")]
        except OSError:  # a home that is not there, or not a directory
            continue
    results = env.get(RESULTS_ROOT_VARIABLE)
    return SourceRules(private=[_real(p) for p in private], homes=[_real(p) for p in homes],
                       package_root=_real(package_root), results_root=_real(Path(results)) if results else None)


def check_results_mount(plan: LaunchPlan, rules: SourceRules) -> None:
    """Results that go to a mount (``$TAO_RESULTS_ROOT/<job id>``) go where a job may write: not in
    or around tao-data-io's state or a system directory (:func:`results_refusal`)."""
    if plan.route.route != "mount":
        return
    destination = plan.route.destination
    problem = results_refusal(Path(os.path.realpath(destination)), rules)
    if problem is not None:
        root = os.path.dirname(destination)
        raise UsageError(f"{RESULTS_ROOT_VARIABLE} {root!r} would put job {plan.job_id}'s results in {destination}, "
                         f"which is refused: {problem}; set it to a directory that holds results only, or unset it")


def check_results_ours(plan: LaunchPlan, results: Path, owners: set[int], backend: str) -> None:
    """A results directory on a mount that is already there must be this backend's (uid in
    ``owners``: this process's, or the job user's, left by an attempt whose end was not taken
    back); and on a first attempt, empty. The job id is the request's to choose: a directory
    under it that another user made (one granting itself a way in through an ACL) or that holds
    files (another record store's job, a dataset) would be handed to the job's user and written."""
    try:
        found = os.stat(results)
        with os.scandir(results) as entries:
            taken = next(entries, None) is not None
    except (FileNotFoundError, NotADirectoryError):
        return
    if found.st_uid not in owners:
        raise UsageError(f"job {plan.job_id}'s results directory {results} is already there and belongs to uid "
                         f"{found.st_uid}, not to the {backend} backend: another user made it. Submit under another "
                         f"job id, or remove that directory from {RESULTS_ROOT_VARIABLE}")
    if taken and plan.attempt == 1:
        raise UsageError(f"job {plan.job_id}'s results directory {results} already holds files, and this is the "
                         "job's first launch: it is another job's results or data. Submit under another job id, or "
                         f"move that directory out of {RESULTS_ROOT_VARIABLE}")


def _homes() -> list[Path]:
    """Every home directory on this host: each user's in the password database, and ``HOME``."""
    homes = {Path(entry.pw_dir) for entry in pwd.getpwall() if entry.pw_dir.startswith("/") and entry.pw_dir != "/"}
    if os.environ.get("HOME"):
        homes.add(Path(os.environ["HOME"]))
    return sorted(homes)


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))
