"""The deployment files, read as `prefect deploy` reads them: every entrypoint names a flow of
that name, every parameter is one the flow takes, the resync deployment is scheduled and runs one
at a time; the blocks they name are the ones `python -m deployments.blocks` saves; the Kubernetes
RBAC manifests are valid objects. (`prefect deploy --all` itself runs in `make demo`.)"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from .kube.rbac import Attributes, Authorizer

REPO = Path(__file__).resolve().parents[1]
FLOWS = {"submit-tao-job": "flows/submit.py:submit_tao_job", "collect-tao-job": "flows/collect.py:collect_tao_job",
         "resync-tao-outputs": "flows/resync.py:resync_tao_outputs", "run-tao-job": "flows/run.py:run_tao_job",
         "cancel-tao-job": "flows/cancel.py:cancel_tao_job"}


def deployments(prefect_file: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load((REPO / prefect_file).read_text())["deployments"])


@pytest.mark.parametrize(("prefect_file", "name", "pool"), [("prefect.yaml", "local", "tao-local"),
                                                            ("deployments/kubernetes.yaml", "kubernetes", "tao-k8s"),
                                                            ("deployments/docker.yaml", "docker", "tao-docker"),
                                                            ("deployments/slurm.yaml", "slurm", "tao-slurm")])
def test_each_flow_has_a_deployment_whose_parameters_it_takes(prefect_file: str, name: str, pool: str) -> None:
    found = deployments(prefect_file)
    assert sorted(d["entrypoint"] for d in found) == sorted(FLOWS.values())
    for deployment in found:
        path, function = deployment["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), function)
        assert deployment["name"].startswith(name) and deployment["work_pool"]["name"] == pool
        assert set(deployment["parameters"]) <= set(inspect.signature(flow.fn).parameters), deployment["entrypoint"]
        assert FLOWS[flow.name] == deployment["entrypoint"]
    names = [deployment["name"] for deployment in found]
    assert len(set(names)) == len(names)  # a list of deployments reads as what each one does, not five "local"s
    assert next(d["name"] for d in found if d["entrypoint"] == FLOWS["submit-tao-job"]) == name  # the documented one


@pytest.mark.parametrize("prefect_file", ["prefect.yaml", "deployments/kubernetes.yaml", "deployments/docker.yaml",
                                          "deployments/slurm.yaml"])
def test_resync_runs_on_an_interval_one_at_a_time(prefect_file: str) -> None:
    resync = next(d for d in deployments(prefect_file) if d["entrypoint"] == FLOWS["resync-tao-outputs"])
    assert resync["schedules"][0]["interval"] > 0
    assert resync["concurrency_limit"] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}


def test_the_local_deployments_leave_the_working_directory_to_prefect_deploy() -> None:
    assert "pull" not in yaml.safe_load((REPO / "prefect.yaml").read_text())  # deploy records the checkout


def test_the_rbac_manifests_are_valid_kubernetes_objects() -> None:
    documents = list(yaml.safe_load_all((REPO / "deployments" / "kubernetes-rbac.yaml").read_text()))
    for document in documents:
        kubernetes_validate.validate(document, "1.32", strict=True)
    kinds = {document["kind"] for document in documents}
    assert kinds == {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def test_a_worker_in_its_own_namespace_may_run_flow_runs_in_the_jobs_namespace() -> None:
    """Issue 39, finding 9: a Prefect worker installed in its own namespace (the Helm chart's
    default) has a Role there only; the flow runs of deployments/kubernetes.yaml go to ``tao``,
    so the worker needs a Role and a RoleBinding in ``tao`` too — shipped, schema-valid, and
    granting the chart's worker what it does with a flow run's Job and pod there."""
    path = REPO / "deployments" / "prefect-worker-rbac.yaml"
    documents = list(yaml.safe_load_all(path.read_text()))
    for document in documents:
        kubernetes_validate.validate(document, "1.32", strict=True)
    pool_namespace = yaml.safe_load((REPO / "deployments" / "kubernetes.yaml").read_text())[
        "definitions"]["work_pools"]["kubernetes"]["job_variables"]["namespace"]
    rbac = Authorizer.shipped(path)
    for verb in ("create", "watch", "delete"):
        assert rbac.allowed(Attributes(verb, "batch", "jobs", namespace=pool_namespace))
    assert rbac.allowed(Attributes("get", "", "pods", "log", namespace=pool_namespace))
    assert not rbac.allowed(Attributes("get", "", "secrets", namespace=pool_namespace))
    assert not rbac.allowed(Attributes("create", "batch", "jobs", namespace="prefect"))  # the chart's own Role does
    # The worker's observer (prefect-kubernetes, a kopf operator) watches pods and Jobs — in the
    # namespaces its setting names, else cluster-wide, which needs a ClusterRole — and kopf posts
    # what its handlers log as events.
    for group, resource in (("", "pods"), ("batch", "jobs")):
        assert all(rbac.allowed(Attributes(verb, group, resource, namespace=pool_namespace))
                   for verb in ("list", "watch"))
    assert rbac.allowed(Attributes("create", "", "events", namespace=pool_namespace))
    assert f"PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES=prefect,{pool_namespace}" in path.read_text()


def test_the_blocks_module_saves_every_block_the_local_docker_and_slurm_deployments_name_and_a_rerun_keeps_them(
        prefect_harness: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m deployments.blocks`` (what ``make demo`` does through the API) leaves every block
    prefect.yaml's deployments name loadable, and a rerun keeps them: an edit made in the UI stays."""
    from prefect.blocks.core import Block

    from deployments import blocks

    args = ["--records", str(tmp_path / "jobs"), "--run-root", str(tmp_path / "local")]
    assert blocks.main(args) == 0
    first = dict(line.split(" ", 2)[:2][::-1] for line in capsys.readouterr().out.splitlines())
    named = {value for prefect_file in ("prefect.yaml", "deployments/docker.yaml", "deployments/slurm.yaml")
             for deployment in deployments(prefect_file) for value in deployment["parameters"].values()}
    assert named <= set(first) and set(first.values()) <= {"saved", "kept"}
    assert all(Block.load(slug_name) for slug_name in named)
    assert blocks.main(args) == 0
    assert all(line.startswith("kept ") for line in capsys.readouterr().out.splitlines())


def test_every_request_path_the_kubernetes_docs_run_is_in_the_flows_image() -> None:
    """A flow-run pod reads ``request_path`` inside the flows image: each one the Kubernetes
    deployment file and docs name must be copied into it."""
    import re

    copied = {line.split()[1] for line in (REPO / "docker" / "flows" / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ")}
    texts = [(REPO / "deployments" / "kubernetes.yaml").read_text(), (REPO / "docs" / "prefect.md").read_text()]
    named = {match for text in texts for match in re.findall(r"request_path=([\w./-]+\.ya?ml)", text)}
    kubernetes = {path for path in named if path.startswith("examples/")}
    assert kubernetes and all(path.split("/")[0] in copied and (REPO / path).is_file() for path in kubernetes)


def test_flow_runs_on_the_kubernetes_pool_keep_their_results_in_the_bucket_block_the_blocks_module_saves(
        prefect_harness: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each flow run on a Kubernetes pool is a fresh pod: a result on its disk is gone with it, so
    the pool's runs are given a tao-s3-bucket as result storage, and ``deployments.blocks`` saves it."""
    from blocks import TaoS3Bucket
    from deployments import blocks

    pool = yaml.safe_load((REPO / "deployments" / "kubernetes.yaml").read_text())["definitions"]["work_pools"]
    slug_name = pool["kubernetes"]["job_variables"]["env"]["PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK"]
    assert blocks.main(["--records", str(tmp_path / "jobs"), "--results", "s3://team-bucket/prefect-results/"]) == 0
    assert f"saved {slug_name}" in capsys.readouterr().out
    saved = TaoS3Bucket.load(slug_name.split("/")[1])
    assert (saved.bucket_name, saved.bucket_folder) == ("team-bucket", "prefect-results/")


def test_the_demo_imports_prefect_only_once_it_has_given_prefect_its_server() -> None:
    """Prefect reads its settings from the environment when it is first imported; the demo sets
    ``PREFECT_API_URL`` only once its server's port is known. Imported earlier (through the blocks,
    for the logo's variable), the demo's own calls went to a temporary server of their own: its
    work pool was created there, not on the demo's server."""
    import subprocess
    import sys

    imported = subprocess.run([sys.executable, "-c", "import sys, deployments.demo; "
                               "print(sorted(n for n in ('prefect', 'blocks') if n in sys.modules))"],
                              cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    assert imported.stdout.strip() == "[]", imported.stdout
