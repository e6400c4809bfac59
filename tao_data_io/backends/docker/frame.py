"""What runs inside each rank's container before, around and after the job's command: the frame
script (the container's command, under Docker's init as PID 1), and the credentials file it reads.

Why one container and a word from the host, not a probe container and then the job's: Docker binds
a mount by its path when a container starts, so a probe container proves nothing of the next
container's mounts — a source swapped between the two would be bound unchecked. Here the verify
probe runs in the very container the command will run in, with its mounts, user, devices and
environment; and the host, through the container's own root and never through the job's tools,
proves each mount target is the object it checked (device and inode). The script then waits for
the host: ``go`` once every rank's
verdict passed and the host saw the persistence token from outside, ``stop`` otherwise — so the
command starts only after the whole job was proved, and never after a failed verdict.

Nothing of the image runs before ``go``: the verify phase (:data:`FRAME_SCRIPT`) is run by this
host's static busybox, copied beside the scripts, whose applets come before any program of the
image; only then does the image's own ``/bin/sh`` run the command (:data:`RUN_SCRIPT`).

Layout in the container (each a bind the backend makes):

* ``/tao-data-io/agent`` (read-only): the scripts, busybox, the probe and its checklist;
* ``/tao-data-io/control`` (read-only): where the host's ``go`` or ``stop`` appears;
* ``/tao-data-io/report`` (this rank's own, writable): the probe's lines and exit status;
* ``/tao-data-io/credentials`` (read-only, only when the request forwards credentials): a 0400
  file of ``export NAME='value'`` lines on a host tmpfs, unlinked on the host once the
  container started — never in the container's configuration (``docker inspect`` shows
  ``Config.Env`` and the daemon stores it in clear), argv or a label.

Exit status: the command's; 143 once the container was stopped (a cancel: Docker's init hands
SIGTERM to this script, which hands it to the command); :data:`DEADLINE_EXIT` once the job's
``compute_shape.deadline_seconds`` passed; :data:`SETUP_EXIT` when the frame could not be made.
A command that exits 143 or 124 by itself exits 1 instead, said on stderr, so it is never taken
for stopped or late.
"""

from __future__ import annotations

import shlex
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path

from ...errors import UsageError
from ...frame import AGENT_ROOT
from ...launch.agents import AWAIT_CHILD

AGENT_DIR = f"{AGENT_ROOT}/agent"
CONTROL_DIR = f"{AGENT_ROOT}/control"
REPORT_DIR = f"{AGENT_ROOT}/report"
CREDENTIALS_FILE = f"{AGENT_ROOT}/credentials"
FRAME_FILE = "frame.sh"
RUN_FILE = "run.sh"
#: This host's static busybox, copied beside the scripts: the verify phase's shell and tools.
SHELL_FILE = "busybox"
PROBE_FILE = "probe.sh"
CHECKLIST_FILE = "checklist"
#: What the probe printed, and its exit status (written first: the host waits for the lines).
PROBE_OUTPUT = "probe"
PROBE_EXIT = "probe-exit"
#: The host's word in the control directory.
GO, STOP = "go", "stop"
#: The frame's own exit statuses, which a command's own are mapped away from.
DEADLINE_EXIT = 124
STOPPED_EXIT = 143
SETUP_EXIT = 125
#: The environment variables the script reads (no value is ever spliced into its text).
WAIT_VARIABLE = "TAO_DATA_IO_WAIT_SECONDS"
DEADLINE_VARIABLE = "TAO_DATA_IO_DEADLINE_SECONDS"
GRACE_VARIABLE = "TAO_DATA_IO_GRACE_SECONDS"

#: The verify phase, run by this host's static busybox (``/tao-data-io/agent/busybox sh``, its
#: applets preferred to any program of the image): nothing of the image runs before the host's
#: ``go`` — an image's own ``sh`` or ``stat`` would otherwise run, with the job's user, while a
#: source swapped after the check is bound, before the host's check refuses it.
FRAME_SCRIPT = r"""# tao-data-io Docker frame: verify in this container, wait for the host's word, then run the command.
set -u
agent=/tao-data-io/agent control=/tao-data-io/control report=/tao-data-io/report
say() { echo "tao-data-io: $*" >&2; }
if [ -e /tao-data-io/credentials ]; then
  . /tao-data-io/credentials || { say "the forwarded credentials could not be read"; exit 125; }
fi
"$agent/busybox" sh "$agent/probe.sh" "$agent/checklist" > "$report/probe.part" 2>/dev/null
printf '%s\n' "$?" > "$report/probe-exit" && mv "$report/probe.part" "$report/probe" || {
  say "this rank's report directory is not writable"; exit 125; }
ticks=$(( ${TAO_DATA_IO_WAIT_SECONDS:-600} * 20 ))
while [ ! -e "$control/go" ]; do
  if [ -e "$control/stop" ]; then say "the verify probe failed: the command never started"; exit 125; fi
  if [ "$ticks" -le 0 ]; then
    say "no word from the host after the verify probe: the command never started"; exit 125
  fi
  sleep 0.05
  ticks=$((ticks - 1))
done
exec /bin/sh "$agent/run.sh" "$@"
"""

#: The run phase, in the image's own ``/bin/sh`` once the host said ``go``: the command as its
#: child, SIGTERM handed on, the deadline kept.
RUN_SCRIPT = r"""# tao-data-io Docker frame: the command, its signals and its deadline.
say() { echo "tao-data-io: $*" >&2; }
stopped= late= timer= killer=
trap 'stopped=1; kill -TERM "$child" 2>/dev/null' TERM INT
trap 'late=1; kill -TERM "$child" 2>/dev/null
      ( sleep "${TAO_DATA_IO_GRACE_SECONDS:-30}"; kill -KILL "$child" 2>/dev/null ) & killer=$!' USR1
"$@" &
child=$!
if [ -n "${TAO_DATA_IO_DEADLINE_SECONDS:-}" ]; then
  ( trap - TERM INT; sleep "$TAO_DATA_IO_DEADLINE_SECONDS"; kill -USR1 $$ ) &
  timer=$!
fi
""" + AWAIT_CHILD + r"""for helper in $timer $killer; do kill "$helper" 2>/dev/null; done
[ -n "$stopped" ] && exit 143
[ -n "$late" ] && exit 124
case "$code" in
  124|143|125) say "the command exited $code, which this frame keeps for itself; exiting 1"; exit 1 ;;
esac
exit "$code"
"""


def credentials_file(values: Mapping[str, str]) -> bytes:
    """The credentials file's text: one ``export NAME='value'`` line each, quoted for ``sh`` —
    the names are environment names the request validated, the values are whatever the
    environment held, so each is quoted whole and nothing of it is ever read as shell text."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in sorted(values.items())).encode()


#: Where a static busybox is looked for besides ``PATH`` (Debian's and Ubuntu's busybox-static).
_BUSYBOX_PLACES = ("/bin/busybox", "/usr/bin/busybox")
_BUSYBOX_INSTALL = "apt-get install busybox-static (Debian, Ubuntu)"


def host_busybox() -> Path:
    """This host's static busybox, the verify phase's shell (:data:`FRAME_SCRIPT`): one linked
    against nothing, so it runs in any image and no library of the image runs with it. A missing
    or dynamic one is refused, naming the package."""
    found = [shutil.which("busybox"), *_BUSYBOX_PLACES]
    for place in (Path(path) for path in found if path):
        if place.is_file() and is_static(place):
            return place
    raise UsageError(f"the Docker backend needs a static busybox on this host to verify each job before anything of "
                     f"its image runs, and found none (looked on PATH and in {', '.join(_BUSYBOX_PLACES)}): "
                     f"{_BUSYBOX_INSTALL}")


def is_static(path: Path) -> bool:
    """Whether the ELF executable at ``path`` asks for no program interpreter (``PT_INTERP``):
    statically linked, so the image's loader and libraries never run with it."""
    try:
        with open(path, "rb") as program:
            header = program.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:  # 64-bit ELF only
                return False
            order = "<" if header[5] == 1 else ">"
            phoff, = struct.unpack_from(order + "Q", header, 32)
            entry_size, count = struct.unpack_from(order + "HH", header, 54)
            program.seek(phoff)
            table = program.read(entry_size * count)
    except OSError:
        return False
    return all(struct.unpack_from(order + "I", table, n * entry_size)[0] != _PT_INTERP for n in range(count)
               if len(table) >= (n + 1) * entry_size)


_PT_INTERP = 3
