"""The local compute frame, the embedded default backend: bubblewrap sandboxes on this host.

:mod:`tao_data_io.launch.sandbox` builds a frame's argv and environment from a LaunchPlan (pure);
:mod:`.preflight` checks the host; :mod:`.backend` is the :class:`~tao_data_io.launch.backend.Backend`;
it starts a detached :mod:`.supervisor`, which runs the verify probe and then the ranks
(:mod:`.runner`); they share only the run directory (:mod:`.rundir`) and name processes by
identity (:mod:`.process`).
"""

from ...launch.declaration import Declaration
from ...tier import Capabilities
from .settings import LocalSettings

DECLARATION = Declaration(
    settings=LocalSettings, implementation="tao_data_io.backends.local.backend:LocalBackend", title="Local",
    # Inputs are staged on this host (tier B) or pre-positioned (tier A): a frame without network and
    # without an upload sidecar cannot fetch its own (tier C).
    capabilities=Capabilities(stages_on_host=True, multi_node=True),
    summary="Run each job on the worker's host in a bubblewrap sandbox that sees what a pod would: the embedded "
            "default, for CPU work, tests and demos.",
    settings_summary="Where on the worker's host each job runs, and whether a job that asks may use its network.")
