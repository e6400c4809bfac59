"""What the SLURM backend writes for one job, from the plan and the target alone (pure): the batch
script with its ``#SBATCH`` lines, the script each rank's step runs, and the container flags of
each ``srun``.

Why a script of our own, and not the TAO Execution SDK's ``timeout … ; requeue`` wrapper: its
last test sets the job's status, so a training that failed read ``COMPLETED 0:0``. Here:

* the verify probe is the job's first step, on every node, in the frame the command will run in
  (the same container flags); the script then waits for the host's word on the shared
  filesystem — ``go`` once the host judged every rank's report and saw the persistence token from
  outside, ``stop`` otherwise — so a failed verdict means the command never started;
* the command's step runs one task per node (``--kill-on-bad-exit``: one failing rank ends the
  others, as a Job's pods end), each rank writing its own exit status (SLURM keeps none per task)
  and its own log (``--output=…/rank-%t.log``); the script exits with the training's status —
  the first rank that failed by itself, not one stopped because of it;
* nothing of a value is ever in the script: variables are exported by name (``sbatch --export``,
  the value taken from sbatch's own environment, never argv), the request's plain variables are
  quoted whole, and every option comes from a validated field (never a shell fragment).

Layout on the shared filesystem, under ``<run root>/<job id>/run``::

    agent/     (read-only to the job) the batch script, the rank script, the probe, its checklist,
               the seccomp filter of a bubblewrap frame
    control/   (read-only to the job) where the host's ``go`` or ``stop`` appears
    report/    (the job's) the probe's reports, each rank's exit status and log, the batch log
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ...frame import AGENT_ROOT
from ...launch.agents import AWAIT_CHILD
from ...launch.plan import LaunchPlan
from ...launch.rendezvous import rendezvous_env
from ...launch.sandbox import FRAME_LANG, FRAME_PATH, FRAME_TMP, Host, node_frame_argv
from ...launch.sources import Bind
from ...quantities import cpu_millicores, quantity_bytes
from .settings import SlurmSettings

BATCH_FILE = "batch.sh"
RANK_FILE = "rank.sh"
PROBE_FILE = "probe.sh"
CHECKLIST_FILE = "checklist"
SECCOMP_FILE = "seccomp.bpf"
BATCH_LOG = "batch.log"
#: The host's word in the control directory: the command may start, may not, is to end (a cancel:
#: each rank's script hands the command SIGTERM and its grace), or the job has ended for good (a
#: run SLURM starts again after that — a requeue of the finished job — runs nothing).
GO, STOP, CANCEL, OVER = "go", "stop", "cancel", "over"
#: The job's secret: the persistence token, and the name of every file a rank reports in. In the
#: job's environment only (``sbatch --export`` by name, its value from sbatch's own environment),
#: never in a file another process of the job's user could read: every job of a target runs as one
#: user, and a job that reached another's report directory could otherwise write its verdict or
#: its exit status. The rank script takes it out of the environment before the command starts.
TOKEN_VARIABLE = "TAO_DATA_IO_TOKEN"
#: What the checklist on disk holds where the probe writes the token: the rank script puts it in.
TOKEN_PLACEHOLDER = "@TOKEN@"
#: The frame's own exit statuses: the verdict failed or the frame could not be made; a rank's
#: deadline passed (the command was ended, SIGTERM; SLURM's ``--time`` is the hard stop after it).
SETUP_EXIT = 125
DEADLINE_EXIT = 124
#: A rank's files in the report directory (the token, then ``N`` its ``SLURM_PROCID``).
PROBE_REPORT, PROBE_EXIT, RANK_EXIT = "probe-{}-{}", "probe-exit-{}-{}", "exit-{}-{}"
RANK_LOG = "rank-{}.log"
#: Where a frame (a pyxis container, a bubblewrap frame) sees the job's agent, control and report directories.
FRAME_AGENT = f"{AGENT_ROOT}/agent"
FRAME_CONTROL = f"{AGENT_ROOT}/control"
FRAME_REPORT = f"{AGENT_ROOT}/report"
#: The descriptor the rank script opens the seccomp filter on, for bubblewrap's ``--seccomp``.
SECCOMP_FD = 9
#: What a rank's rendezvous variables take from SLURM, filled in on the node.
_NODE_RANK = "${SLURM_NODEID}"
_MASTER = "${TAO_DATA_IO_MASTER_ADDR}"


@dataclass(frozen=True)
class JobFiles:
    """The host paths of one job's frame directories (see the module docstring)."""

    agent: str
    control: str
    report: str


def sbatch_options(plan: LaunchPlan, settings: SlurmSettings, files: JobFiles, *, uid: int | None,
                   gid: int | None) -> list[str]:
    """The batch script's ``#SBATCH`` options, one ``--name=value`` each (see the module docstring)."""
    options = [f"--job-name={plan.job_id}", f"--output={files.report}/{BATCH_LOG}", f"--nodes={plan.nodes}",
               "--ntasks-per-node=1", f"--chdir={files.report}", export_option(plan.forward_env)]
    if uid is not None and gid is not None:
        options += [f"--uid={uid}", f"--gid={gid}"]
    # A replacement rank cannot rejoin a static rendezvous; a lone node's run resumes from its
    # results on the shared filesystem.
    options.append("--no-requeue" if plan.nodes > 1 else "--requeue")
    if plan.gpus:
        options.append(f"--gres={settings.gres_name}:{plan.gpus}")
    if plan.deadline_seconds is not None:
        options.append(f"--time={math.ceil(plan.deadline_seconds / 60)}")
    if plan.memory is not None:
        options.append(f"--mem={_mebibytes(plan.memory)}M")
    if plan.cpu is not None:
        options.append(f"--cpus-per-task={_cpus(plan.cpu)}")
    for name in ("partition", "account", "qos", "reservation"):
        value = getattr(settings, name)
        if value:
            options.append(f"--{name}={value}")
    if settings.exclusive:
        options.append("--exclusive")
    options += [f"--{name}={value}" if value else f"--{name}" for name, value in sorted(settings.extra_options.items())]
    return options


def export_option(names: Sequence[str]) -> str:
    """``sbatch --export``: only these names and the job's token (their values from sbatch's own
    environment); SLURM adds its own ``SLURM_*`` variables. Never ``ALL``: the submitting host's
    whole environment — its own cloud credentials — would reach the job."""
    return "--export=" + ",".join(sorted({*names, TOKEN_VARIABLE}))


def pyxis_flags(plan: LaunchPlan, binds: Sequence[Bind], files: JobFiles, forward: Sequence[str]) -> list[str]:
    """One step's pyxis flags (as pyxis documents them: ``--container-image``,
    ``--container-name``, ``--container-mounts=SRC:DST[:ro],…``, ``--container-workdir``,
    ``--no-container-mount-home``, ``--container-env``): the request's image, imported once and
    named for the job's attempt, so the command's step runs in the very container the verify
    probe's step ran in (pyxis reuses a named container within the job); each bind at its target
    (read-only unless it is the results directory), the agent and control directories read-only
    and the report directory;
    the forwarded names' values taken over the image's own (pyxis keeps an image's ENV over the
    host's otherwise)."""
    mounts = [f"{bind.source}:{bind.target}" + (":ro" if bind.read_only else "") for bind in binds]
    mounts += [f"{files.agent}:{FRAME_AGENT}:ro", f"{files.control}:{FRAME_CONTROL}:ro",
               f"{files.report}:{FRAME_REPORT}"]
    flags = [f"--container-image={plan.image}", f"--container-name=tao-{plan.job_id}-a{plan.attempt}",
             "--container-mounts=" + ",".join(mounts), f"--container-workdir={FRAME_TMP}",
             "--no-container-mount-home"]
    return [*flags, "--container-env=" + ",".join(sorted({*forward, TOKEN_VARIABLE}))]


def bubblewrap_argv(plan: LaunchPlan, binds: Sequence[Bind], files: JobFiles, host: Host) -> list[str]:
    """The bubblewrap frame a step's script runs in, on the node, by path (see
    :func:`~tao_data_io.launch.sandbox.node_frame_argv`): the plan's binds, the agent and control
    directories read-only and the report directory. A multi-node job shares the nodes' network (its
    ranks meet there)."""
    frame_binds = [*binds, Bind(files.agent, FRAME_AGENT, read_only=True),
                   Bind(files.control, FRAME_CONTROL, read_only=True), Bind(files.report, FRAME_REPORT, False)]
    frame_binds.sort(key=lambda bind: bind.target.count("/"))
    return node_frame_argv(plan, host, frame_binds, ["/bin/sh", f"{FRAME_AGENT}/{RANK_FILE}"],
                           share_net=plan.network or plan.nodes > 1, seccomp_fd=SECCOMP_FD)


def step_command(plan: LaunchPlan, settings: SlurmSettings, files: JobFiles, binds: Sequence[Bind],
                 host: Host | None) -> tuple[list[str], str]:
    """(the ``srun`` flags of each step, the shell text each task runs) for the target's runtime:
    pyxis's flags and the rank script inside its container; the bubblewrap frame around it (its
    seccomp filter opened on :data:`SECCOMP_FD`); or the rank script where it lies."""
    if settings.container_runtime == "pyxis":
        return pyxis_flags(plan, binds, files, plan.forward_env), f"/bin/sh {FRAME_AGENT}/{RANK_FILE}"
    if settings.container_runtime == "none":
        return [], f"/bin/sh {shlex.quote(files.agent)}/{RANK_FILE}"
    assert host is not None
    frame = " ".join(shlex.quote(part) for part in bubblewrap_argv(plan, binds, files, host))
    seccomp = f"{SECCOMP_FD}<{shlex.quote(files.agent)}/{SECCOMP_FILE}"
    return [], "/bin/sh -c " + shlex.quote(f'exec {frame} "$@" {seccomp}') + " frame"


def batch_script(plan: LaunchPlan, settings: SlurmSettings, files: JobFiles, binds: Sequence[Bind],
                 host: Host | None, *, uid: int | None, gid: int | None, wait_seconds: int) -> str:
    """The whole batch script (see the module docstring)."""
    flags, task = step_command(plan, settings, files, binds, host)
    srun = " ".join(["srun", "--export=ALL", "--ntasks-per-node=1", f"--ntasks={plan.nodes}",
                     *(shlex.quote(flag) for flag in flags)])
    report = shlex.quote(files.report)
    lines = ["#!/bin/sh", *(f"#SBATCH {option}" for option in sbatch_options(plan, settings, files, uid=uid, gid=gid))]
    lines.append(BATCH_BODY.format(
        control=shlex.quote(files.control), report=report, wait=int(wait_seconds), setup=SETUP_EXIT,
        ranks=" ".join(str(rank) for rank in range(plan.nodes)),
        probe_step=f"{srun} --kill-on-bad-exit=0 --output={report}/verify-%t.log {task} verify",
        run_step=f"{srun} --kill-on-bad-exit=1 --output={report}/rank-%t.log {task} run"))
    return "\n".join(lines) + "\n"


#: The batch script after its ``#SBATCH`` lines: it runs on the first node, as the job's user.
BATCH_BODY = r"""# tao-data-io SLURM batch script: verify on every node, wait for the host's word, run each rank.
set -u
control={control} report={report}
token=${{TAO_DATA_IO_TOKEN:-}}
say() {{ echo "tao-data-io: $*" >&2; }}
if [ -z "$token" ]; then say "the job's token is not in its environment: the command never started"; exit {setup}; fi
if [ -e "$control/over" ] || [ -e "$control/cancel" ] || [ -e "$control/stop" ]; then
  say "this job has ended (or was stopped) for tao-data-io: a run started again after that runs nothing"; exit {setup}
fi
rm -f "$report"/exit-*  # a requeued run's ranks write theirs again
if [ ! -e "$control/go" ]; then
  {probe_step}
  for rank in {ranks}; do
    if [ ! -f "$report/probe-$token-$rank" ]; then
      say "rank $rank's verify step did not report (its frame could not start): the command never started"
      tail -n 5 "$report/verify-$rank.log" >&2 2>/dev/null
      exit {setup}
    fi
  done
  ticks=$(( {wait} * 5 ))
  while :; do
    if [ -e "$control/stop" ]; then say "the verify probe failed: the command never started"; exit {setup}; fi
    [ -e "$control/go" ] && break
    if [ "$ticks" -le 0 ]; then
      say "no word from the host after the verify probe: the command never started"; exit {setup}
    fi
    sleep 0.2
    ticks=$((ticks - 1))
  done
fi
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
master=$(scontrol show node -o "$first" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
TAO_DATA_IO_MASTER_ADDR=${{master:-$first}}
export TAO_DATA_IO_MASTER_ADDR
trap 'say "asked to stop: the ranks have been signalled"' TERM
{run_step} &
step=$!
while :; do
  wait "$step"
  code=$?
  kill -0 "$step" 2>/dev/null || break
done
# The training's status: the first rank that failed by itself (143 and 137 are ranks SLURM
# stopped because another failed), else the first that failed, else the step's. An exit file is
# the job's to write: only a regular file (never through a link) of digits counts.
first_failed= stopped_failed=
for rank in {ranks}; do
  file="$report/exit-$token-$rank"
  [ -f "$file" ] && [ ! -L "$file" ] || continue
  said=$(head -c 8 "$file" | tr -d '\n')
  case "$said" in ''|*[!0-9]*) continue ;; esac
  case "$said" in
    0) ;;
    137|143) stopped_failed=${{stopped_failed:-$said}} ;;
    *) first_failed=${{first_failed:-$said}} ;;
  esac
done
[ -n "$first_failed" ] && exit "$first_failed"
[ -n "$stopped_failed" ] && exit "$stopped_failed"
exit "$code"
"""


def rank_script(plan: LaunchPlan, *, agent: str, control: str, report: str) -> str:
    """The script each step runs in the frame, as the job's user: ``verify`` runs the probe and
    writes its report; ``run`` sets the frame's environment (the plan's variables, a multi-node
    job's rendezvous variables from SLURM's own, HOME and PATH of the frame), runs the command —
    SIGTERM handed on, ended at ``compute_shape.deadline_seconds`` (to the second, where SLURM's
    ``--time`` counts minutes) — and writes its exit status once it ended: the command's own,
    or :data:`DEADLINE_EXIT` once its deadline passed (a command's own 124 becomes 1); a cancel
    (:data:`CANCEL` in the control directory) hands the command SIGTERM, and its grace runs until
    the host's ``scancel`` — SLURM's own SIGTERM would end the frame itself at once. ``agent``,
    ``control`` and ``report`` are where the frame sees them; the files it reports in are named
    with the job's token (:data:`TOKEN_VARIABLE`), which the command never sees."""
    env: dict[str, str] = {"PATH": FRAME_PATH, "LANG": FRAME_LANG, "HOME": FRAME_TMP, **plan.env}
    dynamic: dict[str, str] = {}
    if plan.nodes > 1:
        for name, value in rendezvous_env(nodes=plan.nodes, gpus_per_node=plan.gpus, rank=_NODE_RANK,
                                          master_addr=_MASTER).items():
            (dynamic if value in (_NODE_RANK, _MASTER) else env)[name] = value
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in sorted(env.items()))
    exports += "".join(f'export {name}="{value}"\n' for name, value in sorted(dynamic.items()))
    command = " ".join(shlex.quote(part) for part in plan.argv)
    return RANK_BODY.format(agent=shlex.quote(agent), control=shlex.quote(control), report=shlex.quote(report),
                            exports=exports, command=command, placeholder=TOKEN_PLACEHOLDER,
                            probe=PROBE_FILE, checklist=CHECKLIST_FILE, setup=SETUP_EXIT, late_exit=DEADLINE_EXIT,
                            deadline="" if plan.deadline_seconds is None else int(plan.deadline_seconds))


RANK_BODY = r"""# tao-data-io SLURM rank: the verify probe, or the command, in this rank's frame.
agent={agent} control={control} report={report}
rank=${{SLURM_PROCID:-0}}
token=${{TAO_DATA_IO_TOKEN:-}}
unset TAO_DATA_IO_TOKEN
say() {{ echo "tao-data-io: $*" >&2; }}
[ -n "$token" ] || {{ say "the job's token is not in this rank's environment"; exit {setup}; }}
case "${{1:-}}" in
  verify)
    sed "s/{placeholder}/$token/" "$agent/{checklist}" | /bin/sh "$agent/{probe}" /dev/stdin \
      > "$report/probe-$token-$rank.part" 2>/dev/null
    printf '%s\n' "$?" > "$report/probe-exit-$token-$rank" &&
      mv "$report/probe-$token-$rank.part" "$report/probe-$token-$rank"
    exit 0 ;;
  run) ;;
  *) say "unknown phase ${{1:-}}"; exit {setup} ;;
esac
if [ -e "$control/stop" ] || [ -e "$control/cancel" ] || [ ! -e "$control/go" ]; then
  say "the host did not say go: the command never started"; exit {setup}
fi
{exports}cd "$HOME" 2>/dev/null || cd /
stopped= late= timer= watcher=
trap 'stopped=1; kill -TERM "$child" 2>/dev/null' TERM INT USR2
trap 'late=1; kill -TERM "$child" 2>/dev/null' USR1
{command} &
child=$!
( trap - TERM INT; while [ ! -e "$control/cancel" ]; do sleep 0.2; done; kill -USR2 $$ ) &
watcher=$!
deadline={deadline}
if [ -n "$deadline" ]; then
  ( trap - TERM INT; sleep "$deadline"; kill -USR1 $$ ) &
  timer=$!
fi
""" + AWAIT_CHILD + r"""for helper in $timer $watcher; do kill "$helper" 2>/dev/null; done
if [ -n "$late" ]; then code={late_exit}
elif [ -n "$stopped" ]; then code=143
elif [ "$code" = {late_exit} ]; then
  say "the command exited {late_exit}, which this frame keeps for a passed deadline; exiting 1"; code=1
fi
printf '%s\n' "$code" > "$report/exit-$token-$rank"
exit "$code"
"""


def _mebibytes(memory: str) -> int:
    return max(1, math.ceil(quantity_bytes(memory) / 2**20))


def _cpus(cpu: str) -> int:
    return max(1, math.ceil(cpu_millicores(cpu) / 1000))
