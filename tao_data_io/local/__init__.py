"""The local compute frame, the embedded default backend: bubblewrap sandboxes on this host.

:mod:`.sandbox` builds a frame's argv and environment from a LaunchPlan (pure); :mod:`.preflight`
checks the host; :mod:`.backend` is the :class:`~tao_data_io.launch.backend.Backend`; it starts a
detached :mod:`.supervisor`, which runs the verify probe and then the ranks (:mod:`.runner`);
they share only the run directory (:mod:`.rundir`) and name processes by identity (:mod:`.process`).
"""
