"""The Kubernetes backend's adapter, against the stand-in: the job's pods take the steps of their
script (:mod:`tests.kube.kubelet`), one each time the backend reads the Job, and the suite adds
the step that ends them; what the training container and the status sidecar print goes into
their logs through the control plane; time passes by moving the Job's start back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tao_data_io.request import JobRequest

from ..kube.apiserver import KubeStandIn
from ..kube.kubelet import TRAIN_SCRIPT, exited
from ..kube.objects import JOB_NAME, RESOURCES
from ..kube_cluster import NAMESPACE, every_object_of_ours, job_request, make_backend
from .harness import Ending, Harness, Launched


class KubernetesHarness(Harness):
    name = "kubernetes"
    cannot = {"restored files": "the stand-in runs no container, so nothing lists the results directory; that "
                                "rank 0's stager, before training, is told what to restore is pinned in "
                                "test_kubernetes_attempts"}

    def __init__(self, kube: KubeStandIn, tmp_path: Path, environ: Mapping[str, str]) -> None:
        super().__init__(make_backend(), tmp_path, environ)
        self.kube = kube
        self.plane = kube.server.control

    def request(self, job_id: str, *, verify_fails: bool, deadline: bool) -> JobRequest:
        self.plane.scripts[job_id] = list(TRAIN_SCRIPT)  # running, until the suite ends it
        if verify_fails:
            self.plane.verify_failures["/data"] = "does not exist"
        return job_request(job_id=job_id, compute_shape={"gpus": 1, **({"deadline_seconds": 60} if deadline else {})})

    def unknown_ref(self) -> str:
        return f"{NAMESPACE}/never-submitted"

    def starts(self, job: Launched) -> int:
        return self.plane.starts[job.job_id, "train"]

    def running(self, job: Launched) -> list[str]:
        """The job's pods that have not stopped, once every pod deleted has had its grace."""
        self.kube.run(self.kube.server.end_terminating)
        return sorted(name for name, pod in self._pods(job).items()
                      if pod["status"].get("phase") not in ("Succeeded", "Failed"))

    def kept(self, job: Launched) -> Any:
        """Every object of the job, by its uid: what collect reads its logs and end from."""
        return sorted([(obj["kind"], obj["metadata"]["name"], obj["metadata"]["uid"])
                       for obj in every_object_of_ours(self.kube)]
                      + [("Pod", name, pod["metadata"]["uid"]) for name, pod in self._pods(job).items()])

    def print(self, job: Launched, lines: list[str]) -> None:
        self._prints(job, "train", lines)

    def progress(self, job: Launched, events: list[dict[str, Any]]) -> None:
        self._prints(job, "status", [json.dumps(event) for event in events])  # the status sidecar follows the file

    def leave_results(self, job: Launched, files: Mapping[str, bytes]) -> None:
        """The results stay in the pod (its sidecar uploads them): nothing this host can read."""

    def end(self, job: Launched, ending: Ending) -> None:
        step = {"exit": lambda: "succeeded" if ending.number == 0 else exited(ending.number),
                "signal": lambda: exited(128 + ending.number), "oom": lambda: "oomkilled"}[ending.kind]()
        self.plane.scripts[job.job_id].append(step)

    def pass_deadline(self, job: Launched) -> None:
        def started_long_ago() -> None:
            found = self.kube.server.objects[RESOURCES["Job"], NAMESPACE, job.job_id]
            found["status"] = {**found.raw["status"], "startTime": "2020-01-01T00:00:00Z"}

        self.kube.run(started_long_ago)

    def _prints(self, job: Launched, container: str, lines: list[str]) -> None:
        text = "".join(line + "\n" for line in lines)
        self.kube.run(lambda: self.plane.prints(self.kube.server, NAMESPACE, job.job_id, container, text))

    def _pods(self, job: Launched) -> dict[str, dict[str, Any]]:
        return {name: pod for name, pod in self.kube.server.alive("Pod", NAMESPACE).items()
                if pod["metadata"]["labels"].get(JOB_NAME) == job.job_id}
