"""The rendezvous variables of a multi-node job: the one list both backends render.

Why one list: a multi-node job's ranks find each other only through these variables, and each
launcher reads its own names. torchrun takes its defaults from ``PET_<OPTION>`` when it builds
its argument parser (``torch.distributed.argparse_util.env``: ``PET_NNODES``,
``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``), which is
how Kubeflow Trainer configures it too; TAO's Lightning-based entrypoints read ``WORLD_SIZE`` (as
the node count, not the process count), ``NUM_GPU_PER_NODE``, ``NODE_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``. A name no launcher reads is not rendered. Both backends call
:func:`rendezvous_env`, so the local frame's ranks see what an Indexed Job's pods see.
"""

from __future__ import annotations

from typing import TypeVar

#: Rank 0's rendezvous port: torchrun's and TAO's default.
MASTER_PORT = 29500

Rank = TypeVar("Rank")


def rendezvous_env(*, nodes: int, gpus_per_node: int, rank: Rank, master_addr: str,
                   master_port: int = MASTER_PORT) -> dict[str, str | Rank]:
    """Every rendezvous variable of one rank, name → value.

    ``rank`` is the rank as the backend gives it: the local frame knows each rank's number, an
    Indexed Job's pod template only a reference its pods resolve (the downward API's completion
    index), so it is passed through as given. torchrun starts one worker per GPU; a job without
    GPUs gets one worker per node (torchrun's own default), while ``NUM_GPU_PER_NODE`` still
    says 0.
    """
    port = str(master_port)
    return {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(max(gpus_per_node, 1)), "PET_NODE_RANK": rank,
            "PET_MASTER_ADDR": master_addr, "PET_MASTER_PORT": port,
            "WORLD_SIZE": str(nodes), "NUM_GPU_PER_NODE": str(gpus_per_node), "NODE_RANK": rank,
            "MASTER_ADDR": master_addr, "MASTER_PORT": port}


#: The names :func:`rendezvous_env` sets, which a multi-node job's own environment may not set.
RENDEZVOUS_NAMES = frozenset(rendezvous_env(nodes=2, gpus_per_node=1, rank="0", master_addr="rank-0"))
