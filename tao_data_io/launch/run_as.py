"""Who a job's frames run as on the host: never root.

Why this needs deciding: bubblewrap maps the uid that starts it into the frame, so a frame
started by root held host uid 0 — and the kernel checks ``/proc/sys`` by uid, not by capability:
root in a frame with every capability dropped still wrote the host-wide ``kernel.core_pattern``
(a known route to root at the next crash of any program). Results written by uid 0 could also
carry a setuid-root binary out to the host. So:

* started by an unprivileged user, bubblewrap can map only that user, and the job runs as them
  (:func:`run_as` returns None: nothing to switch);
* started by root, the frame is set up the way a rootful container runtime sets up a container
  with ``--user``: bubblewrap makes the namespaces (owned by the host's user namespace, so the
  job can never gain a capability over them), and the command is started through util-linux's
  ``setpriv`` as ``run_as_user:run_as_group`` (nobody, 65534, unless the target says otherwise)
  with no supplementary group, no capability and an empty bounding set. bubblewrap keeps only
  ``CAP_SETUID``, ``CAP_SETGID`` and ``CAP_SETPCAP`` for that one exec of ``setpriv``, which
  drops them before the command starts; ``no_new_privs`` (bubblewrap sets it) and ``nosuid`` on
  every mount keep a setuid program from raising them again.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from .users import NOBODY
from ..schema import Strict
from .tools import SETPRIV_INSTALL, find_tool

#: What bubblewrap keeps for ``setpriv`` to switch the user and clear the bounding set.
SWITCH_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")


class RunAs(Strict):
    """The host user a root-started frame's command becomes, and the tool that makes it so."""

    uid: int
    gid: int
    setpriv: str

    def prefix(self) -> list[str]:
        """The argv before the command: become ``uid:gid`` with nothing else kept."""
        return [self.setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--"]


def run_as(user: int | None, group: int | None) -> RunAs | None:
    """Who this process's frames run as (see the module docstring): None when it is not root
    (bubblewrap maps this very user), else ``user:group`` (nobody by default). A uid or gid
    that cannot be honoured is refused, naming the setting and the fix."""
    me = os.geteuid()
    if me != 0:
        for field, asked, mine in (("run_as_user", user, me), ("run_as_group", group, os.getegid())):
            if asked is not None and asked != mine:
                raise UsageError(f"{field} is {asked}, but this backend runs as uid {me}, and bubblewrap started by "
                                 f"an unprivileged user can run a job only as that user ({mine}): leave {field} "
                                 "empty, or run the backend as root so it can switch")
        return None
    return RunAs(uid=NOBODY if user is None else user, gid=NOBODY if group is None else group,
                 setpriv=find_tool("setpriv", SETPRIV_INSTALL))
