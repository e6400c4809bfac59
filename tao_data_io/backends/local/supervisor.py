"""The detached supervisor of one local job: ``python -m tao_data_io.backends.local.supervisor RUN_DIR``.

Why a process of its own: submit must return at once, and the job must outlive whatever
submitted it (a CLI that exits, a Prefect worker that restarts, a terminal that closes). The
supervisor runs the verify probe, then the ranks, and records how they ended (see
:mod:`.runner`); everything it knows is in the run directory (:mod:`.rundir`).

How it detaches: submit starts it in a new session and waits for it to exit. It forks at once;
the child starts a session of its own (no signal aimed at the submitter's process group or
terminal reaches it), records its pid and start time in ``supervisor.json``, and only then lets
the parent exit 0. So when submit returns, the job has a live supervisor on record, and the
submitting process has no child left to reap.

Credentials arrive in the environment only — never argv, never disk — each under
``TAO_DATA_IO_FORWARD_<NAME>``: the prefix keeps a forwarded name from steering this Python
process (a ``PYTHONPATH`` or ``LD_PRELOAD`` among the forwarded names would act here, outside the
frame). They are taken out of ``os.environ`` at once and handed to the rank frames only.

Imports: submit waits for the detach, so this module imports only the standard library and two
small modules of ours; the runner (pydantic, the plan, the probe) is imported after the parent
has been released.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ...fs.atomic import atomic_write
from .process import ProcessId

CREDENTIAL_PREFIX = "TAO_DATA_IO_FORWARD_"
#: The supervisor's identity record, in the run directory.
RECORD_NAME = "supervisor.json"


def credentials_env(values: Mapping[str, str]) -> dict[str, str]:
    """The supervisor's environment entries that carry ``values`` (see the module docstring)."""
    return {CREDENTIAL_PREFIX + name: value for name, value in values.items()}


def _take_credentials() -> dict[str, str]:
    names = [name for name in os.environ if name.startswith(CREDENTIAL_PREFIX)]
    return {name[len(CREDENTIAL_PREFIX):]: os.environ.pop(name) for name in names}


def _detach(run_path: Path) -> None:
    """Fork; the parent exits 0 once the child (in its own session) is on record, 1 if it never is."""
    ready_read, ready_write = os.pipe()
    if os.fork():
        os.close(ready_write)
        os._exit(0 if os.read(ready_read, 1) == b"1" else 1)
    os.close(ready_read)
    os.setsid()
    me = ProcessId.of(os.getpid())
    assert me is not None  # this very process
    atomic_write(run_path / RECORD_NAME, json.dumps(me.to_dict()).encode(), mode=0o600)  # as RunDir.write
    os.write(ready_write, b"1")
    os.close(ready_write)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tao_data_io.backends.local.supervisor RUN_DIR (started by LocalBackend.submit)",
              file=sys.stderr)
        return 2
    run_path = Path(args[0])
    credentials = _take_credentials()
    _detach(run_path)
    from .runner import supervise  # only now: the parent is released (see the module docstring)

    return supervise(run_path, credentials)


if __name__ == "__main__":
    sys.exit(main())
