"""Where jobs run: a compute target block builds the core's backend, and says where the worker
stages each job's inputs.

Why blocks: a deployment names a target (``tao-local-target/local``,
``tao-kubernetes-target/prod``) and the same flow runs anywhere; the block holds settings only —
paths, a namespace, a context *name* — never kubeconfig contents or a credential. Each target
embeds its backend's settings model (``settings``) rather than repeating its fields, so the
block, the backend, the CLI and the job record share one declaration and its rules; and each
target block is made from its backend's declaration (:func:`target_block`), so a backend the
registry finds has its block without a line here. The Kubernetes
target finds its cluster the standard way at run time (in-cluster configuration inside a pod,
else the kubeconfig's context), so nothing about access is stored in Prefect.
"""

from __future__ import annotations

import logging
from abc import ABC
from collections.abc import Mapping
from typing import Any

from prefect.blocks.core import Block
from pydantic import Field

from blocks.picker import PICKABLE
from blocks.presentation import DOCUMENTATION_URL, LOGO_URL, code_example
from tao_data_io.backends import backend_from, declarations
from tao_data_io.launch.backend import Backend
from tao_data_io.launch.declaration import Declaration
from tao_data_io.schema import AbsolutePath

log = logging.getLogger(__name__)


class ComputeTarget(Block, ABC):
    """What every target has: a backend, and a staging root on the worker. Abstract, so
    ``prefect block register`` passes it over."""

    model_config = PICKABLE
    _logo_url = LOGO_URL
    _documentation_url = DOCUMENTATION_URL

    staging_root: AbsolutePath | None = Field(
        None, title="Staging root",
        description="Where the worker stages each job's inputs and writes its config, one directory per job. "
                    "Empty: $TAO_DATA_IO_WORKDIR, else ~/.tao-data-io/work.")

    def backend(self) -> Backend:
        """The core's backend for this target, built now (on the worker); a worker without what
        the backend imports is told what to install."""
        return backend_from(self.settings)


def target_block(declared: Declaration) -> type[ComputeTarget]:
    """The target block of the backend ``declared``: ``TAO <title> Target`` (slug ``tao-<name>-target``),
    embedding its settings model as ``settings`` — made from the backend's declaration, so a new
    backend gets its block, its form and its place in the flows' target parameter from its
    registry line alone. The slugs and names are those the blocks saved before had."""
    title = declared.label
    name = declared.block_class
    variable = f"{declared.name.replace('-', '_')}_target"
    namespace = {
        "__module__": __name__, "__qualname__": name, "__doc__": declared.summary,
        "__annotations__": {"settings": declared.settings},
        "settings": Field(default_factory=declared.settings, title=f"{title} backend",
                          description=declared.settings_summary),
        "_block_type_name": f"TAO {title} Target", "_block_type_slug": f"tao-{declared.name}-target",
        "_description": declared.summary,
        "_code_example": code_example(name, variable, f"backend = {variable}.backend()  # the core's {title} backend\n"
                                                      f"print({variable}.settings)"),
    }
    return type(name, (ComputeTarget,), namespace)


#: Every backend's target block, by backend name.
TARGETS: dict[str, type[ComputeTarget]] = {name: target_block(declared) for name, declared in declarations().items()}


def exported(members: Mapping[str, Any]) -> dict[str, type[ComputeTarget]]:
    """The target blocks to add to a module whose members are ``members``, by class name:
    ``prefect block register --file blocks/__init__.py`` registers the block classes it finds among
    a module's members, so each made class is one, under its own name (``LocalTarget``, …). A
    name the module already has (a plugin titled "Compute") is not taken over: that block is in
    :data:`TARGETS` and the flows' target parameter, and said in the log."""
    made = {}
    for target in TARGETS.values():
        if target.__name__ in members:
            log.warning("target block %s is not added to %s: the name is taken", target.__name__, members["__name__"])
        else:
            made[target.__name__] = target
    return made


#: The target blocks that are members of this module and of :mod:`blocks`, by class name.
EXPORTED = exported(globals())
globals().update(EXPORTED)
