"""Docker: each rank of a job a container of the request's image on this host's Docker daemon,
driven through the Engine API with the ``docker`` package — the way most TAO users run TAO on a
GPU workstation. :mod:`.containers` builds each container from the plan (pure); :mod:`.frame` is
what runs in it around the command; :mod:`.backend` is the
:class:`~tao_data_io.launch.backend.Backend`, keeping each job's state in :mod:`.rundir` and
reading logs from a cursor (:mod:`.logs`).
"""

from ...launch.declaration import Declaration
from ...tier import Capabilities
from .settings import DockerSettings

DECLARATION = Declaration(
    settings=DockerSettings, implementation="tao_data_io.backends.docker.backend:DockerBackend", title="Docker",
    # Inputs are staged on this host (tier B) or pre-positioned (tier A) and bound into the containers;
    # ranks share rank 0's network on this one host.
    capabilities=Capabilities(stages_on_host=True, multi_node=True),
    summary="Run each job as containers of its image on this host's Docker daemon (a GPU workstation): inputs "
            "bound read-only, GPUs by id.",
    settings_summary="The daemon's socket, the run root, whom jobs run as, the GPUs they may use, and container "
                     "limits; no credential.")
