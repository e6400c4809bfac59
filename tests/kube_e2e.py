"""What the real-cluster suite sets up around a job, with a cluster admin's kubeconfig: a namespace
(with the Pod Security level, LimitRange or ResourceQuota a test names), and a claim from the
cluster's default StorageClass (kind's local-path provisioner) holding what a tier A job reads,
written by a pod; everything is removed afterwards."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

WAIT_S = 300
#: A small image with the POSIX sh the seeding and checking pods run.
TOOLBOX = os.environ.get("TAO_E2E_IMAGE", "busybox:1.36")


class RealCluster:
    """The admin's view of the cluster TAO_E2E_KUBECONFIG names."""

    def __init__(self) -> None:
        api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"], persist_config=False)
        self.core = client.CoreV1Api(api)

    def namespace(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        """A fresh namespace ``name`` with ``labels`` (a Pod Security level): an older one of that
        name is deleted first, so no earlier run's objects or labels linger."""
        try:
            self.core.delete_namespace(name)
            _until(lambda: self._gone(name), f"namespace {name} to go")
        except ApiException as exc:
            if exc.status != 404:
                raise
        self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": name, "labels": dict(labels or {})}})
        return name

    def _gone(self, name: str) -> bool:
        try:
            self.core.read_namespace(name)
        except ApiException as exc:
            return exc.status == 404
        return False

    def delete_namespace(self, name: str) -> None:
        try:
            self.core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def create(self, namespace: str, obj: dict[str, Any]) -> None:
        """A LimitRange or a ResourceQuota in ``namespace``."""
        kind = obj["kind"]
        if kind == "LimitRange":
            self.core.create_namespaced_limit_range(namespace, obj)
        elif kind == "ResourceQuota":
            self.core.create_namespaced_resource_quota(namespace, obj)
        else:
            raise ValueError(f"no create for {kind}")

    def claim(self, namespace: str, name: str, files: Mapping[str, str]) -> str:
        """A ReadWriteOnce claim ``name`` from the default StorageClass, holding ``files`` (path on
        the claim → text), written by a pod — which also binds a WaitForFirstConsumer claim, so the
        job's pod follows it to its node."""
        self.core.create_namespaced_persistent_volume_claim(namespace, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
        script = "set -e\n" + "".join(f'mkdir -p "$(dirname "/v/{path}")"\nprintf %s "$F{index}" > "/v/{path}"\n'
                                      for index, path in enumerate(files))
        env = [{"name": f"F{index}", "value": text} for index, text in enumerate(files.values())]
        assert self.run(namespace, name, script, env) == "Succeeded"
        return name

    def holds(self, namespace: str, claim: str, path: str) -> bool:
        """Whether ``path`` exists on the claim, asked by a pod that mounts its root."""
        return self.run(namespace, claim, f'test -e "/v/{path}"') == "Succeeded"

    def run(self, namespace: str, claim: str, script: str, env: list[dict[str, str]] | None = None) -> str:
        """The phase a one-shot pod running ``script`` with the claim's root at /v ends in."""
        name = f"e2e-tool-{uuid.uuid4().hex[:8]}"
        self.core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "tool", "image": TOOLBOX, "command": ["/bin/sh", "-c", script], "env": env or [],
                "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}})
        try:
            phase = _until(lambda: self._ended(namespace, name), f"pod {namespace}/{name} to end")
        finally:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        return phase

    def _ended(self, namespace: str, name: str) -> str | None:
        phase = self.core.read_namespaced_pod(name, namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None


def _until(done: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (found := done()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {WAIT_S}s for {what}")
        time.sleep(1)
    return found
