"""Where jobs run: a compute target block builds the core's backend, and says where the worker
stages each job's inputs.

Why blocks: a deployment names a target (``tao-local-target/local``,
``tao-kubernetes-target/prod``) and the same flow runs anywhere; the block holds settings only —
paths, a namespace, a context *name* — never kubeconfig contents or a credential. Each target
embeds its backend's settings model (``settings``) rather than repeating its fields, so the
block, the backend, the CLI and the job record share one declaration and its rules. The Kubernetes
target finds its cluster the standard way at run time (in-cluster configuration inside a pod,
else the kubeconfig's context), so nothing about access is stored in Prefect.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from prefect.blocks.core import Block
from pydantic import Field, model_validator

from blocks.picker import PICKABLE
from blocks.presentation import DOCUMENTATION_URL, LOGO_URL, code_example
from tao_data_io.backends import backend_from
from tao_data_io.errors import UsageError
from tao_data_io.kubernetes.settings import KubernetesSettings
from tao_data_io.launch.backend import Backend
from tao_data_io.local.settings import LocalSettings
from tao_data_io.schema import AbsolutePath


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

    #: A target block saved before it embedded its backend's settings kept them at the top level,
    #: some under older names (old name → settings field); they are moved into ``settings`` when
    #: such a block is loaded (Prefect keeps unknown fields of a block, so they would be ignored).
    _flat_settings: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _nest_flat_settings(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not cls._flat_settings.keys() & data.keys():
            return data
        data = dict(data)
        settings = dict(data.get("settings") or {})
        for old, new in cls._flat_settings.items():
            if old in data:
                settings.setdefault(new, data.pop(old))
        return {**data, "settings": settings}

    @abstractmethod
    def backend(self) -> Backend:
        """The core's backend for this target, built now (on the worker)."""


class LocalTarget(ComputeTarget):
    _block_type_name = "TAO Local Target"
    _block_type_slug = "tao-local-target"
    _description = ("Run each job on the worker's host in a bubblewrap sandbox that sees what a pod would: the "
                    "embedded default, for CPU work, tests and demos.")
    _code_example = code_example("LocalTarget", "local_target",
                                 "backend = local_target.backend()  # the core's local backend\n"
                                 "print(backend.settings.run_root)")
    _flat_settings = {"workdir_root": "run_root", "network": "allow_network"}

    settings: LocalSettings = Field(
        default_factory=LocalSettings, title="Local backend",
        description="Where on the worker's host each job runs, and whether a job that asks may use its network.")

    def backend(self) -> Backend:
        return backend_from(self.settings)


class KubernetesTarget(ComputeTarget):
    _block_type_name = "TAO Kubernetes Target"
    _block_type_slug = "tao-kubernetes-target"
    _description = ("Run each job as a Kubernetes Job. The cluster is found at run time: in-cluster configuration "
                    "inside a pod, else the kubeconfig context named here (or the current one). Nothing about "
                    "access is stored in Prefect.")
    _code_example = code_example("KubernetesTarget", "kubernetes_target",
                                 "print(kubernetes_target.settings.namespace)\n"
                                 "backend = kubernetes_target.backend()  # the core's Kubernetes backend")
    _flat_settings = {name: name for name in ("namespace", "context", "pvc_claim", "stager_image",
                                              "image_pull_secret", "ttl_seconds", "shm_size")}

    settings: KubernetesSettings = Field(
        default_factory=KubernetesSettings, title="Kubernetes backend",
        description="The namespace, the kubeconfig context's NAME, the claim, Secret NAMES, images, TTL and "
                    "scheduling of each job's objects; names only, never the kubeconfig or a Secret's contents.")

    def backend(self) -> Backend:
        """The Kubernetes backend; a worker without the official client (the ``kubernetes`` extra,
        which a worker that runs only local jobs need not have) is told to install it."""
        try:
            return backend_from(self.settings)
        except ImportError as exc:
            if exc.name == "kubernetes" or (exc.name or "").startswith("kubernetes."):
                raise UsageError("the Kubernetes target needs the official client on the worker: install "
                                 "tao-data-io[kubernetes]") from exc
            raise
