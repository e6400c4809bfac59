"""Where jobs run: a compute target block builds the core's backend, and says where the worker
stages each job's inputs.

Why blocks: a deployment names a target (``tao-local-target/local``,
``tao-kubernetes-target/prod``) and the same flow runs anywhere; the block holds settings only —
paths, a namespace, a context *name* — never kubeconfig contents or a credential. The local target
embeds its backend's settings model (``settings``) rather than repeating its fields, so the
block, the backend, the CLI and the job record share one declaration and its rules. The Kubernetes
target finds its cluster the standard way at run time (in-cluster configuration inside a pod,
else the kubeconfig's context), so nothing about access is stored in Prefect.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from prefect.blocks.core import Block
from pydantic import Field, model_validator

from tao_data_io.backends import backend_for, backend_from
from tao_data_io.errors import UsageError
from tao_data_io.kubernetes.settings import DEFAULT_TTL_SECONDS, RenderSettings
from tao_data_io.launch.backend import Backend
from tao_data_io.local.settings import LocalSettings
from tao_data_io.schema import AbsolutePath
from tao_data_io.steps import workdir_for


class ComputeTarget(Block, ABC):
    """What every target has: a backend, and a staging root on the worker. Abstract, so
    ``prefect block register`` passes it over."""

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

    def workdir(self, job_id: str) -> Path:
        """The job's staging directory on the worker."""
        return workdir_for(job_id, self.staging_root)


class LocalTarget(ComputeTarget):
    _block_type_name = "TAO Local Target"
    _block_type_slug = "tao-local-target"
    _description = ("Run each job on the worker's host in a bubblewrap sandbox that sees what a pod would: the "
                    "embedded default, for CPU work, tests and demos.")
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

    namespace: str = Field("default", title="Namespace", description="The namespace the job's objects live in.")
    context: str | None = Field(
        None, title="Kubeconfig context",
        description="The NAME of a context in the worker's kubeconfig ($KUBECONFIG or ~/.kube/config). Empty: "
                    "in-cluster configuration when the worker runs in a pod, else the current context.")
    pvc_claim: str | None = Field(
        None, title="PersistentVolumeClaim",
        description="A Bound claim: tier B stages into its cache/, pre-positioned inputs and results live on it. "
                    "Empty: tier C (the pod fetches its inputs and uploads its results).")
    stager_image: str | None = Field(
        None, title="Stager image",
        description="The image with tao-data-io (docker/stager/Dockerfile): tier B's stage Job, tier C's stager "
                    "and the results sidecar run it.")
    image_pull_secret: str | None = Field(
        None, title="Image pull Secret", description="The NAME of a Secret in the namespace for pulling images "
                                                     "(nvcr.io); its contents stay in the cluster.")
    ttl_seconds: int = Field(DEFAULT_TTL_SECONDS, title="TTL after finished (s)",
                             description="How long a finished Job and its logs stay; the job record outlives it.")
    shm_size: str | None = Field(None, title="/dev/shm size",
                                 description="Overrides the request's compute_shape.shm_size, e.g. 16Gi.")

    @model_validator(mode="after")
    def _settings(self) -> KubernetesTarget:
        self.render_settings()  # the renderer's own rules, once
        return self

    def render_settings(self) -> RenderSettings:
        return RenderSettings(namespace=self.namespace, pvc_claim=self.pvc_claim,
                              image_pull_secret=self.image_pull_secret, stager_image=self.stager_image,
                              ttl_seconds=self.ttl_seconds, shm_size=self.shm_size)

    def backend_settings(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "context": self.context, "pvc_claim": self.pvc_claim,
                "stager_image": self.stager_image,
                "image_pull_secret": self.image_pull_secret, "ttl_seconds": self.ttl_seconds,
                "shm_size": self.shm_size}

    def backend(self) -> Backend:
        try:
            return backend_for("kubernetes", self.backend_settings())
        except ImportError as exc:
            if exc.name == "kubernetes" or (exc.name or "").startswith("kubernetes."):
                raise UsageError("the Kubernetes target needs the official client on the worker: install "
                                 "tao-data-io[kubernetes]") from exc
            raise UsageError("this installation of tao-data-io has no Kubernetes backend yet "
                             f"({exc.name or 'tao_data_io.kubernetes.backend'} is missing): run the job on a local "
                             "target, or upgrade tao-data-io on the worker") from exc
