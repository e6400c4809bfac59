"""What the real-cluster suite sets up around a job: a namespace, and a claim bound to a hostPath
volume (the air-gapped tier A of a one-node kind or minikube cluster), removed afterwards."""

from __future__ import annotations

import os
import time
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

BIND_TIMEOUT_S = 120


class HostPathClaim:
    """``with HostPathClaim(namespace, name) as claim:`` — a Bound ReadWriteMany claim ``name`` on
    ``/tmp/<name>`` of the node, in ``namespace`` (created if missing), for the length of a test."""

    def __init__(self, namespace: str, name: str) -> None:
        self.namespace, self.name = namespace, name
        self.volume = f"{name}-{namespace}"
        api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"], persist_config=False)
        self.core = client.CoreV1Api(api)

    def __enter__(self) -> str:
        try:
            self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        except ApiException as exc:
            if exc.status != 409:
                raise
        modes = ["ReadWriteMany"]
        self.core.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": self.volume},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": modes, "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Delete",
                     "hostPath": {"path": f"/tmp/{self.volume}", "type": "DirectoryOrCreate"},
                     "claimRef": {"namespace": self.namespace, "name": self.name}}})
        self.core.create_namespaced_persistent_volume_claim(self.namespace, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": self.name},
            "spec": {"accessModes": modes, "storageClassName": "", "volumeName": self.volume,
                     "resources": {"requests": {"storage": "1Gi"}}}})
        deadline = time.monotonic() + BIND_TIMEOUT_S
        while self._phase() != "Bound":
            if time.monotonic() > deadline:
                raise RuntimeError(f"claim {self.namespace}/{self.name} did not bind within {BIND_TIMEOUT_S}s")
            time.sleep(1)
        return self.name

    def _phase(self) -> Any:
        return self.core.read_namespaced_persistent_volume_claim(self.name, self.namespace).status.phase

    def __exit__(self, *exc: object) -> None:
        for delete in (lambda: self.core.delete_namespaced_persistent_volume_claim(self.name, self.namespace),
                       lambda: self.core.delete_persistent_volume(self.volume)):
            try:
                delete()
            except ApiException as error:
                if error.status != 404:
                    raise
