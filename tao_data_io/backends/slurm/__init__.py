"""SLURM: each job a batch job of the target's cluster, submitted from this host (a login node)
with SLURM's own commands, its inputs and results on the filesystem the nodes share — the way TAO
runs on HPC clusters. :mod:`.script` writes the batch script and each rank's (pure);
:mod:`.commands` runs SLURM's commands; :mod:`.backend` is the
:class:`~tao_data_io.launch.backend.Backend`, keeping each job's state in :mod:`.rundir`.
"""

from ...launch.declaration import Declaration
from ...tier import Capabilities
from .settings import SlurmSettings

DECLARATION = Declaration(
    settings=SlurmSettings, implementation="tao_data_io.backends.slurm.backend:SlurmBackend", title="SLURM",
    # Inputs are staged by this host onto the shared filesystem (tier B) or pre-positioned there
    # (tier A); a job never fetches or uploads inside its allocation. Ranks are one task per node.
    capabilities=Capabilities(stages_on_host=True, multi_node=True),
    summary="Run each job as a SLURM batch job from this login node: inputs on the shared filesystem, one task "
            "per node, results uploaded from here.",
    settings_summary="The cluster's slurm.conf, the shared run root and directories, the container runtime, whom "
                     "jobs run as and the scheduler options; no credential.")
