"""The Kubernetes renderer: every example renders and passes kubernetes-validate (strict, 1.29 and
1.32); the pod shapes; the adversarial cases; the verify wrapper and the sidecar run for real."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError
import yaml

from tao_data_io.errors import UNWRITABLE_EXIT, UsageError
from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.launch.probe import PROBE_SCRIPT, Check, parse_probe_output
from tao_data_io.backends.kubernetes.pods import STOPPED_EXIT
from tao_data_io.backends.kubernetes.render import RenderedJob, failure_policy, literal, read_config, render_job
from tao_data_io.backends.kubernetes.apply import step_of
from tao_data_io.launch.agents import SIDECAR_SCRIPT, STAGER_SCRIPT, STATUS_SCRIPT, TRAIN_WRAPPER, VERIFY_SCRIPT
from tao_data_io.backends.kubernetes.settings import KubernetesSettings
from tao_data_io.quantities import quantity_bytes
from tao_data_io.records import OutputRoute
from tao_data_io.request import JobRequest, load_request

from .helpers import run_cli, torchrun_arguments, wait_for
from .kube_helpers import STAGER, plan_for, req
from .kube.pod_security import pod_security_violations
from .kube.validation import invalid

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SECRET_ENV = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY12345", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-very-secret",
              "AWS_ENDPOINT_URL": "http://s3.internal:8333", "NGC_KEY": "nvapi-secret-ngc-key-987"}
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def render(request: JobRequest, tmp_path: Path, tier: str, *, route: OutputRoute | None = None,
           environ: dict[str, str] | None = None, plan: LaunchPlan | None = None, suspend_training: bool = False,
           **settings: Any) -> RenderedJob:
    built, record = plan_for(request, tmp_path, tier, route, environ)
    plan = plan or built
    given = KubernetesSettings.from_mapping({"namespace": "default", "stager_image": STAGER, **settings})
    return render_job(plan, given, request=request, record=record, config=read_config(plan), environ=environ or {},
                      suspend_training=suspend_training)


def validate(rendered: RenderedJob) -> None:
    for version in ("1.29", "1.32"):
        for obj in rendered.objects:
            kubernetes_validate.validate(json.loads(json.dumps(obj)), version, strict=True)


def kinds(rendered: RenderedJob) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in rendered.objects]


def training_pod(rendered: RenderedJob) -> dict[str, Any]:
    job = [o for o in rendered.objects if o["kind"] == "Job"][-1]
    return job["spec"]["template"]["spec"]


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


# ----------------------------------------------------------------------------- examples
EXAMPLE_CASES = {
    "tier-c.yaml": ("C", {}, ["ConfigMap/dino-tier-c-files", "Job/dino-tier-c"]),
    "tier-b.yaml": ("B", {"shards": 4},
                    ["ConfigMap/dino-tier-b-files", "Job/dino-tier-b-stage-4eb488b27b38607168775b5ce38f3cd879e9",
                     "Job/dino-tier-b"]),
    "multi-node.yaml": ("C", {}, ["ConfigMap/torchrun-2x8-files", "Service/probe-torchrun-2x8",
                                   "Job/torchrun-2x8-probe-41e0286844ff891cb36c79f24d356d58b4b",
                                   "Service/ranks-torchrun-2x8", "Job/torchrun-2x8"]),
    "config-mode.yaml": ("C", {}, ["ConfigMap/dino-train-coco-files", "Job/dino-train-coco"]),
    "args-mode.yaml": ("C", {}, ["ConfigMap/example-job-files", "Job/example-job"]),
    "air-gapped.yaml": ("A", {"pvc_claim": "lustre"}, ["ConfigMap/example-job-files", "Job/example-job"]),
}


@pytest.mark.parametrize("name", sorted(EXAMPLE_CASES))
def test_every_example_renders_and_passes_strict_validation(name: str, tmp_path: Path, s3_server, s3_client) -> None:  # type: ignore[no-untyped-def]
    request = load_request(EXAMPLES / name)
    s3_server.create_bucket("tao-demo")  # config-mode's spec names a key without a trailing slash: one HEAD
    s3_client.put_object(Bucket="tao-demo", Key="datasets/coco-mini/annotations.json", Body=b"{}")
    tier, settings, expected = EXAMPLE_CASES[name]
    if request.storage.pvc_claim:
        settings = {"pvc_claim": request.storage.pvc_claim, **settings}
    route = OutputRoute(route="mount", destination="/lustre/results") if tier == "A" else None
    rendered = render(request, tmp_path, tier, route=route, environ={**SECRET_ENV, **s3_server.env()}, **settings)
    assert kinds(rendered) == expected
    validate(rendered)
    for obj in rendered.objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "tao-data-io"
        assert DNS_LABEL.fullmatch(labels["tao-data-io/job-id"])
        assert obj["metadata"]["annotations"]["tao-data-io/job-id"] == (request.job_id or "example-job")
        assert invalid(obj) == []  # what a real API server refuses (the stand-in's rules)
    text = rendered.to_yaml()
    assert [o["kind"] for o in yaml.safe_load_all(text) if o] == [o["kind"] for o in rendered.objects]
    assert not any(value in text for value in SECRET_ENV.values() if value.startswith(("AKIA", "wJal", "nvapi")))
    pod = training_pod(rendered)
    assert pod["initContainers"][-1]["name"] == "verify" and pod["restartPolicy"] == "Never"
    # Issue 39 (cosmetic): a Job's pod template is immutable (pkg/apis/batch/validation
    # ValidateJobSpecUpdate), so kubectl apply of a changed render under the same id changes the
    # rest and refuses the Job: the output says so, naming the delete that comes first.
    job_name = next(o["metadata"]["name"] for o in rendered.objects if o["kind"] == "Job"
                    and o["metadata"]["labels"]["tao-data-io/step"] == "train")
    assert f"kubectl delete job {job_name}" in text and "immutable" in text


# ----------------------------------------------------------------------------- pod shapes
def test_single_pod_tier_c_shape(tmp_path: Path) -> None:
    request = req(mode="config", command="dino train -e {config_path}", args=None, config_format="yaml",
                  spec={"data": "s3://bkt-1/data/"}, compute_shape={"gpus": 2, "shm_size": "8Gi"},
                  environment={"TAO_LOG_LEVEL": "INFO"}, inputs=[{"source": "s3://bkt-1/data/", "target": "/data/a"},
                                                                   {"source": "s3://bkt-1/ann.json", "kind": "file"}])
    rendered = render(request, tmp_path, "C", image_pull_secrets=["ngc-pull", "stager-pull"],
                      node_selector={"gpu": "a100"},
                      tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    validate(rendered)
    job = rendered.objects[-1]
    # One pod: replaced after a disruption (twice, by default), failed at any non-zero exit.
    assert (job["spec"]["backoffLimit"], job["spec"]["ttlSecondsAfterFinished"]) == (2, 3600)
    assert job["spec"]["podFailurePolicy"] == failure_policy(job["spec"]["template"]["spec"])
    pod = training_pod(rendered)
    assert [c["name"] for c in pod["initContainers"]] == ["stager", "results", "status", "verify"]
    stager, sidecar, _, verify = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and stager["image"] == sidecar["image"] == STAGER
    assert verify["image"] == request.image and verify["terminationMessagePath"] == "/dev/termination-log"
    assert verify["command"][:2] == ["/bin/sh", "/tao-data-io-verify/verify.sh"]
    train = pod["containers"][0]
    # The results volume's bound (outputs.results_limit, 20Gi) is reserved on the node's disk.
    assert train["resources"] == {"requests": {"memory": "8Gi", "ephemeral-storage": "20480Mi"},
                                  "limits": {"nvidia.com/gpu": "2"}}
    assert train["command"] == ["/bin/sh", "-c", TRAIN_WRAPPER, "tao-train"]  # PID 1 hands SIGTERM on
    assert train["args"][:3] == ["dino", "train", "-e"]
    mounts = by_name_list(train["volumeMounts"])
    config_path = train["args"][3]
    assert mounts[config_path] == {"name": "files", "mountPath": config_path, "subPath": config_path.rsplit("/", 1)[1],
                                   "readOnly": True}
    assert mounts["/data/a"]["name"] == "staging" and mounts["/data/a"]["readOnly"] is True
    assert mounts["/dev/shm"]["name"] == "shm" and mounts["/results"]["name"] == "results"
    volumes = by_name(pod["volumes"])
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert pod["imagePullSecrets"] == [{"name": "ngc-pull"}, {"name": "stager-pull"}]
    assert pod["nodeSelector"] == {"gpu": "a100"}
    assert pod["terminationGracePeriodSeconds"] > 60
    verify_mounts = by_name_list(verify["volumeMounts"])
    assert all(verify_mounts[m["mountPath"]] == m for m in train["volumeMounts"])  # the same mounts
    # The same projected credentials; and where it marks its pass for the results sidecar, which
    # the training container does not see (nothing the job does can make a failed pod look verified).
    assert verify["env"] == [*train["env"], {"name": "TAO_DATA_IO_VERDICT", "value": "/tao-data-io/verdict"}]
    assert verify_mounts["/tao-data-io/verdict"]["name"] == "verdict" and "verdict" not in {
        m["name"] for m in train["volumeMounts"]}
    assert by_name_list(sidecar["volumeMounts"])["/tao-data-io/verdict"]["readOnly"] is True
    checklist = rendered.objects[0]["data"]["checklist"]
    assert "persistent\t/results\t/tao-data-io/state/upload-check" in checklist  # tier C: the upload is the check


def by_name_list(mounts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in mounts}


def test_aliased_targets_share_one_source_subpath(tmp_path: Path) -> None:
    request = req(mode="config", command="t {config_path}", args=None, config_format="json",
                  spec={"a": "s3://bkt-1/data/", "b": "s3://bkt-1/data"},
                  inputs=[{"source": "s3://bkt-1/data/", "target": "/data/a"}])
    plan, _ = plan_for(request, tmp_path, "C")
    alias = plan.mounts[0].model_copy(update={"target": "/data/alias"})
    plan = plan.model_copy(update={"mounts": [*plan.mounts, alias]})
    rendered = render(request, tmp_path, "C", plan=plan)
    mounts = by_name_list(training_pod(rendered)["containers"][0]["volumeMounts"])
    assert mounts["/data/a"]["subPath"] == mounts["/data/alias"]["subPath"] == "s3/bkt-1/data"


def test_multi_node_indexed_job_and_headless_service(tmp_path: Path) -> None:
    rendered = render(req(compute_shape={"gpus": 8, "nodes": 4}), tmp_path, "C")
    validate(rendered)
    service = next(o for o in rendered.objects if o["kind"] == "Service" and step_of(o) == "train")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": "job-1"}
    job = rendered.objects[-1]
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 4, 4)
    pod = training_pod(rendered)
    assert pod["subdomain"] == service["metadata"]["name"] == "ranks-job-1"
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}
    assert (env["WORLD_SIZE"], env["PET_NNODES"], env["NUM_GPU_PER_NODE"], env["PET_NPROC_PER_NODE"]) == (
        "4", "4", "8", "8")
    assert env["NODE_RANK"] == env["PET_NODE_RANK"] == {"fieldRef": {"fieldPath": COMPLETION_INDEX}}
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == (
        "job-1-0.ranks-job-1", "29500")


def pod_environment(container: dict[str, Any], index: int) -> dict[str, str]:
    """The variables the kubelet gives ``container`` in the pod of completion index ``index``:
    each ``value`` with ``$$`` read as ``$`` (the kubelet's escape), and the downward API's
    completion index from the annotation the Job controller puts on that pod. Credentials
    (``secretKeyRef``) are left out: a Secret holds them, not the render."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"].replace("$$", "$")
        elif "fieldRef" in item["valueFrom"]:
            assert item["valueFrom"]["fieldRef"] == {"fieldPath": COMPLETION_INDEX}, item
            env[item["name"]] = str(index)
        else:
            assert set(item["valueFrom"]) == {"secretKeyRef"}, item
    return env


@pytest.mark.parametrize("index", [0, 1])
def test_torchrun_takes_its_rendezvous_from_each_pods_environment(tmp_path: Path, index: int) -> None:
    """torchrun's own parser, built in the environment the pod of completion index ``index`` gets,
    takes the node count, the GPUs per node, the rank and rank 0's address and port from it (its
    ``PET_*`` defaults) — for a bare command line and for the example's; TAO's Lightning-based
    entrypoints read ``WORLD_SIZE`` (the node count), ``NUM_GPU_PER_NODE``, ``NODE_RANK`` and
    ``MASTER_ADDR``/``MASTER_PORT``."""
    request = load_request(EXAMPLES / "multi-node.yaml")
    rendered = render(request, tmp_path, "C")
    validate(rendered)
    service = next(o for o in rendered.objects if o["kind"] == "Service" and step_of(o) == "train")
    job = rendered.objects[-1]
    pod = training_pod(rendered)
    assert pod["subdomain"] == service["metadata"]["name"]
    rank_0 = f"{job['metadata']['name']}-0.{pod['subdomain']}"  # the Job controller names pod 0's host <job>-0
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "rendezvous")
    nodes, gpus = request.compute_shape.nodes, request.compute_shape.gpus
    train = pod["containers"][0]
    env = pod_environment(train, index)
    assert train["args"][0] == "torchrun"
    for argv in (["train.py"], train["args"][1:]):
        args = torchrun_arguments(env, argv)
        assert (args.nnodes, args.nproc_per_node, args.node_rank, args.master_addr, args.master_port) == (
            str(nodes), str(gpus), index, rank_0, port), argv
    tao = {name: env.get(name)
           for name in ("WORLD_SIZE", "NUM_GPU_PER_NODE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    assert tao == {"WORLD_SIZE": str(nodes), "NUM_GPU_PER_NODE": str(gpus), "NODE_RANK": str(index),
                   "MASTER_ADDR": rank_0, "MASTER_PORT": str(port)}
    assert not {"NNODES", "NPROC_PER_NODE"} & set(env)  # nothing reads them: torchrun reads PET_*


def test_tier_b_stage_job_shards_into_the_claims_cache(tmp_path: Path) -> None:
    rendered = render(req(inputs=[{"source": "s3://bkt-1/data/", "target": "/data"}]), tmp_path, "B",
                      pvc_claim="tao-data", shards=3)
    validate(rendered)
    stage = next(o for o in rendered.objects if o["metadata"]["labels"]["tao-data-io/step"] == "stage"
                 and o["kind"] == "Job")
    assert (stage["spec"]["completionMode"], stage["spec"]["completions"], stage["spec"]["parallelism"]) == \
        ("Indexed", 3, 3)
    container = stage["spec"]["template"]["spec"]["containers"][0]
    # No GPU held while staging; cpu and memory limited for a quota on limits, far above the stager's use.
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert container["command"][-2:] == ["--shard", "$(TAO_SHARD_INDEX)/3"]
    assert "--cache" in container["command"] and "/tao-data-io/volume/cache" in container["command"]
    train = training_pod(rendered)["containers"][0]
    mounts = by_name_list(train["volumeMounts"])
    assert mounts["/data"] == {"name": "data", "mountPath": "/data", "subPath": "cache/s3/bkt-1/data", "readOnly": True}
    assert mounts["/results"] == {"name": "data", "mountPath": "/results", "subPath": "results/job-1"}
    checklist = rendered.objects[0]["data"]["checklist"]
    assert "persistent" not in checklist and "results-writable\t/results" in checklist  # on a claim: the token
    assert rendered.objects[0]["metadata"]["labels"]["tao-data-io/step"] == "stage"


def test_credentials_are_references_and_no_value_reaches_the_output(tmp_path: Path) -> None:
    environ = dict(SECRET_ENV)
    request = req(forward_env=["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "NGC_KEY"])
    rendered = render(request, tmp_path, "C", environ=environ)
    text = rendered.to_yaml()
    assert not any(value in text for value in environ.values())
    env = training_pod(rendered)["containers"][0]["env"]
    refs = [e for e in env if "valueFrom" in e]
    assert [(e["name"], e["valueFrom"]["secretKeyRef"]) for e in refs] == [
        (name, {"name": "job-1-credentials", "key": name}) for name in request.forward_env]
    assert rendered.secret is not None and rendered.secret.per_job and rendered.secret.keys == request.forward_env
    given = render(request, tmp_path, "C", environ=environ, credential_secret="team-s3")
    assert given.secret is not None and given.secret.name == "team-s3" and not given.secret.per_job


def test_a_secret_value_in_the_spec_never_reaches_a_configmap(tmp_path: Path) -> None:
    request = req(mode="config", command="t {config_path}", args=None, config_format="yaml",
                  spec={"token": SECRET_ENV["AWS_SECRET_ACCESS_KEY"]})
    with pytest.raises(UsageError, match="ConfigMap job-1-files would hold the value of AWS_SECRET_ACCESS_KEY") as info:
        render(request, tmp_path, "C", environ=dict(SECRET_ENV))
    assert SECRET_ENV["AWS_SECRET_ACCESS_KEY"] not in str(info.value)


def test_a_config_whose_bytes_differ_from_its_digest_is_refused(tmp_path: Path) -> None:
    request = req(mode="config", command="t {config_path}", args=None, config_format="yaml", spec={"a": 1})
    plan, record = plan_for(request, tmp_path, "C")
    with pytest.raises(UsageError, match="does not hold the bytes its name promises"):
        render_job(plan, KubernetesSettings(namespace="default", stager_image=STAGER), request=request, record=record,
                   config=b"a: 2\n")


@pytest.mark.parametrize(("settings", "fragment"), [
    ({"ttl_seconds": 604801}, "ttl_seconds 604801 must be 0 to 604800"),
    ({"shm_size": "16GB"}, "shm_size '16GB' is not a binary quantity"),
    ({"pvc_claim": "Data_Claim"}, "pvc_claim 'Data_Claim' is not a DNS subdomain"),
    ({"credential_secret": "-bad"}, "credential_secret '-bad' is not a DNS subdomain"),
    ({"stager_image": None}, "stager_image is needed for tier C"),
    ({"shards": 2}, "shards 2 applies to tier B"),
    ({"node_selector": {"gpu": "a b"}}, "node_selector 'gpu' value 'a b'"),
    ({"namespace": None}, "the objects are rendered into a namespace, and none was given: give namespace"),
], ids=["ttl", "shm", "claim", "secret", "no-stager", "shards-not-b", "selector", "no-namespace"])
def test_settings_refusals_name_the_parameter_and_value(settings: dict[str, Any], fragment: str,
                                                        tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=re.escape(fragment)):
        render(req(), tmp_path, "C", **settings)


def test_settings_recorded_with_one_image_pull_secret_load_with_it_listed() -> None:
    """Job records and target blocks from before several pull Secrets (nvcr.io's, a private
    registry's for the stager) hold one ``image_pull_secret``: it loads as the list of one."""
    old = KubernetesSettings.model_validate({"image_pull_secret": "ngc-pull"})
    assert old.image_pull_secrets == ["ngc-pull"] and "image_pull_secret" not in old.model_dump()
    with pytest.raises(ValueError, match="image_pull_secret and image_pull_secrets are both given"):
        KubernetesSettings.model_validate({"image_pull_secret": "a", "image_pull_secrets": ["b"]})
    with pytest.raises(ValueError, match="names a Secret twice"):
        KubernetesSettings(image_pull_secrets=["a", "a"])


def test_s3_work_in_the_pod_needs_forwarded_s3_credentials(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="forward_env must name the S3 credentials"):
        render(req(forward_env=["HF_TOKEN"]), tmp_path, "C")
    legacy = render(req(forward_env=["ACCESS_KEY", "SECRET_KEY"]), tmp_path, "C")  # the legacy family works too
    assert legacy.secret is not None and legacy.secret.keys == ["ACCESS_KEY", "SECRET_KEY"]


def _restore_of(rendered: RenderedJob) -> str | None:
    stager = next((c for c in training_pod(rendered)["initContainers"] if c["name"] == "stager"), None)
    env = {} if stager is None else {e["name"]: e.get("value") for e in stager["env"]}
    return env.get("TAO_DATA_IO_RESTORE_FROM")


def test_a_pod_started_again_after_a_disruption_resumes_from_what_the_pod_before_it_uploaded(tmp_path: Path) -> None:
    """The Job controller makes the replacement from the same template: its stager restores the
    job's route (empty for the first pod: one listing), so training resumes from the last
    checkpoint uploaded, and its uploads never mix a restart's results into the earlier ones."""
    route = OutputRoute(route="s3", destination="s3://tao-results/results/job-1/", reason="S3_BUCKET_NAME")
    assert _restore_of(render(req(), tmp_path / "a", "C", route=route)) == "s3://tao-results/results/job-1/"
    no_retries = req(compute_shape={"gpus": 1, "disruption_retries": 0})
    assert _restore_of(render(no_retries, tmp_path / "b", "C", route=route)) is None
    multi = req(compute_shape={"gpus": 8, "nodes": 2})
    assert _restore_of(render(multi, tmp_path / "c", "C", route=route)) is None


def test_pods_with_cloud_identity_reach_s3_without_any_key_or_secret(tmp_path: Path) -> None:
    """IRSA, EKS Pod Identity, GKE Workload Identity: the pods run as the service account bound to
    a cloud role and keep its token (what those exchange for the role's credentials); no key is
    forwarded, no Secret is made, no container is given a key. Every other job's pods keep none."""
    rendered = render(req(forward_env=[]), tmp_path, "C", service_account="tao-s3-reader", cloud_identity=True)
    validate(rendered)
    assert rendered.secret is None and not [o for o in rendered.objects if o["kind"] == "Secret"]
    pod = training_pod(rendered)
    assert pod["serviceAccountName"] == "tao-s3-reader" and pod["automountServiceAccountToken"] is True
    names = {e["name"] for c in [*pod["initContainers"], *pod["containers"]] for e in c.get("env", [])}
    assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
    assert training_pod(render(req(), tmp_path / "keys", "C"))["automountServiceAccountToken"] is False
    with pytest.raises(ValueError, match="cloud_identity needs service_account"):
        render(req(forward_env=[]), tmp_path, "C", cloud_identity=True)


# ----------------------------------------------------------------------------- adversarial
def test_adversarial_a_target_with_dotdot_is_refused(tmp_path: Path) -> None:
    plan, _ = plan_for(req(), tmp_path, "C")
    bad = plan.model_copy(update={"mounts": [plan.mounts[0].model_copy(update={"target": "/data/../etc"})]})
    with pytest.raises(UsageError, match=r"mount target '/data/\.\./etc' is not usable: it is not normalised"):
        render(req(), tmp_path, "C", plan=bad)


def test_adversarial_a_subpath_reused_by_two_sources_is_refused(tmp_path: Path) -> None:
    request = req(inputs=[{"source": "s3://bkt-1/a/", "target": "/a"}, {"source": "s3://bkt-1/b/", "target": "/b"}])
    plan, _ = plan_for(request, tmp_path, "C")
    first, second = plan.mounts[:2]
    # Two different inputs claiming one sub_path (a hand-edited staging map).
    bad = plan.model_copy(update={"mounts": [first, second.model_copy(update={"source": first.source})]})
    with pytest.raises(UsageError, match="subPath 's3/bkt-1/a' would serve two sources"):
        render(request, tmp_path, "C", plan=bad)


@pytest.mark.parametrize(("mount", "refusal"), [
    ({"source": "/cache/s3/bkt-1/data", "target": "/mine"}, "lies in the claim's stage cache"),
    ({"source": "/cache", "target": "/mine"}, "lies in the claim's stage cache"),
    ({"source": "/jobs", "target": "/mine", "read_only": False}, "lies in the claim's staging maps"),
    ({"source": "/results", "target": "/mine"}, "holds every job's results"),
    ({"source": "/results/other-job", "target": "/mine", "read_only": False}, "mount it read-only"),
    ({"source": "/results/other-job/sub", "target": "/mine", "read_only": False}, "mount it read-only"),
], ids=["in-the-cache", "the-cache", "the-staging-maps", "every-jobs-results", "another-jobs-results-writable",
        "inside-them-writable"])
def test_a_request_cannot_reach_the_claims_cache_or_write_other_jobs_results(
        tmp_path: Path, mount: dict[str, Any], refusal: str) -> None:
    """subPaths were compared for equality only: a request's mount of the claim's ``cache/…`` or
    ``results/…`` with ``read_only: false`` gave the training container the shared stage cache
    or every job's results, writable. The stage cache is tao-data-io's; another job's results may
    be read (a pipeline's next step), never written."""
    request = req(storage={"pvc_claim": "lustre"}, mounts=[mount])
    with pytest.raises(UsageError, match=f"pre-positioned mount source '{mount['source']}' .*{refusal}"):
        render(request, tmp_path, "B", pvc_claim="lustre")


def test_another_jobs_results_on_the_claim_are_an_input(tmp_path: Path) -> None:
    request = req(storage={"pvc_claim": "lustre"}, mounts=[{"source": "/results/train-job", "target": "/previous"}])
    train = by_name(training_pod(render(request, tmp_path, "B", pvc_claim="lustre"))["containers"])["train"]
    assert {"name": "data", "mountPath": "/previous", "subPath": "results/train-job", "readOnly": True} in \
        train["volumeMounts"]


def test_adversarial_a_forward_env_name_also_in_environment_is_refused(tmp_path: Path) -> None:
    plan, _ = plan_for(req(), tmp_path, "C")
    bad = plan.model_copy(update={"env": {**plan.env, "AWS_ACCESS_KEY_ID": "placeholder"}})
    with pytest.raises(UsageError, match=r"forward_env names \['AWS_ACCESS_KEY_ID'\] are also in environment"):
        render(req(), tmp_path, "C", plan=bad)


def test_adversarial_a_secret_smuggled_into_environment_is_refused_by_the_renderer(tmp_path: Path) -> None:
    plan, _ = plan_for(req(), tmp_path, "C")
    bad = plan.model_copy(update={"env": {**plan.env, "LEARNING_RATE": SECRET_ENV["AWS_SECRET_ACCESS_KEY"]}})
    with pytest.raises(UsageError, match="environment 'LEARNING_RATE' holds the value of a credential") as info:
        render(req(), tmp_path, "C", plan=bad, environ=dict(SECRET_ENV))
    assert SECRET_ENV["AWS_SECRET_ACCESS_KEY"] not in str(info.value)


@pytest.mark.parametrize("name", ["PET_NODE_RANK", "MASTER_ADDR", "WORLD_SIZE"])
def test_adversarial_a_multi_node_jobs_environment_cannot_set_its_rendezvous(tmp_path: Path, name: str) -> None:
    with pytest.raises(UsageError, match=rf"environment sets \['{name}'\], which a multi-node job's rendezvous sets"):
        render(req(compute_shape={"nodes": 2}, environment={name: "0"}), tmp_path, "C")
    render(req(environment={name: "0"}), tmp_path, "C")  # one node: no rendezvous, the name is the job's


def test_adversarial_a_plan_with_an_invalid_job_id_is_refused(tmp_path: Path) -> None:
    """Every name is derived from the job id, so a plan edited to carry an id the rule refuses is
    refused with the rule, before anything is rendered."""
    plan, _ = plan_for(req(), tmp_path, "C")
    with pytest.raises(UsageError, match=r"job id 'x{300}' is not a valid job id: use 1-52 lowercase letters"):
        render(req(), tmp_path, "C", plan=plan.model_copy(update={"job_id": "x" * 300, "nodes": 2}))


def test_adversarial_a_namespace_with_capitals_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="namespace 'TAO-Jobs' is not a DNS label"):
        render(req(), tmp_path, "C", namespace="TAO-Jobs")


def test_adversarial_shell_metacharacters_in_args_mode_stay_argv(tmp_path: Path) -> None:
    args = ["--lr", "1e-3", "a;b|c", "$(rm -rf /)", "`id`", "$(AWS_SECRET_ACCESS_KEY)", "x && y"]
    rendered = render(req(command=["python", "train.py"], args=args), tmp_path, "C")
    train = training_pod(rendered)["containers"][0]
    # The wrapper's arguments, never its script: no shell parses them (test_the_training_wrapper_…).
    assert train["command"] == ["/bin/sh", "-c", TRAIN_WRAPPER, "tao-train"]
    unescaped = [part.replace("$$", "$") for part in train["args"]]
    assert unescaped == ["python", "train.py", *args]
    # The kubelet expands $(VAR) in a command and its args: every $ is doubled, so nothing is expanded.
    assert "$$(AWS_SECRET_ACCESS_KEY)" in train["args"] and literal("$(x)") == "$$(x)"


def test_adversarial_a_shell_looking_spec_value_lands_in_the_config_only(tmp_path: Path) -> None:
    request = req(mode="config", command="dino train -e {config_path}", args=None, config_format="yaml",
                  spec={"note": "$(rm -rf /)"})
    rendered = render(request, tmp_path, "C")
    pod = training_pod(rendered)
    commands = [part for c in [*pod["initContainers"], *pod["containers"]] for part in c["command"] + c.get("args", [])]
    assert not any("rm -rf" in part for part in commands)
    config = [v for k, v in rendered.objects[0]["data"].items() if k.startswith("spec-")]
    assert config == ["note: $(rm -rf /)\n"]
    assert pod["containers"][0]["args"][:3] == ["dino", "train", "-e"]


# ----------------------------------------------------------------------------- the scripts, for real
def test_verify_wrapper_writes_the_verdict_failures_first_within_4kib(tmp_path: Path) -> None:
    (tmp_path / "probe.sh").write_text(PROBE_SCRIPT)
    (tmp_path / "verify.sh").write_text(VERIFY_SCRIPT)
    good = tmp_path / "good"
    good.mkdir()
    (good / "x").write_text("x")
    checks = [Check(kind="dir-nonempty", path=str(good), subject="good")]
    checks += [Check(kind="dir-nonempty", path=f"{tmp_path}/in/dataset-{i:03d}", subject=f"s{i}") for i in range(3)]
    checks.append(Check(kind="readable", path=f"{good}/x", subject="y"))
    for i in range(120):
        (good / f"f{i:03d}").write_text("f")
    checks += [Check(kind="file", path=f"{good}/f{i:03d}", subject=f"f{i}") for i in range(120)]
    (tmp_path / "checklist").write_text("".join(f"{c.kind}\t{c.path}\t{c.argument}\n" for c in checks))
    verdict_dir = tmp_path / "verdict"
    verdict_dir.mkdir()
    done = subprocess.run(["/bin/sh", str(tmp_path / "verify.sh"), str(tmp_path / "probe.sh"),
                           str(tmp_path / "checklist"), str(tmp_path / "termination-log")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TAO_DATA_IO_VERDICT": str(verdict_dir)})
    assert done.returncode == 1 and not (verdict_dir / "passed").exists()  # the sidecar will upload nothing
    message = (tmp_path / "termination-log").read_text()
    verdict = parse_probe_output(done.stdout, checks, done.returncode)
    assert message == verdict.termination_message()
    assert len(message.encode()) <= 4096 and message.startswith("TAO-VERIFY\tfail\tdir-nonempty")
    again = parse_probe_output(message, checks, done.returncode)
    assert not again.ok and len(again.failures) == 3


def test_verify_wrapper_passes_a_good_frame(tmp_path: Path) -> None:
    (tmp_path / "probe.sh").write_text(PROBE_SCRIPT)
    (tmp_path / "verify.sh").write_text(VERIFY_SCRIPT)
    (tmp_path / "upload-check").write_text("ok\tput and deleted s3://b/results/j/.tao-data-io-upload-check\n")
    (tmp_path / "checklist").write_text(f"results-writable\t{tmp_path}/results\ttok\npersistent\t{tmp_path}/results\t"
                                        f"{tmp_path}/upload-check\n")
    (tmp_path / "verdict").mkdir()
    done = subprocess.run(["/bin/sh", str(tmp_path / "verify.sh"), str(tmp_path / "probe.sh"),
                           str(tmp_path / "checklist"), str(tmp_path / "log")], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TAO_DATA_IO_VERDICT": str(tmp_path / "verdict")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "verdict" / "passed").exists()  # for the results sidecar
    assert (tmp_path / "log").read_text().splitlines()[1].startswith("TAO-VERIFY\tok\tpersistent")


def fake_tao_data_io(tmp_path: Path, then: str = "") -> tuple[Path, Path]:
    """A ``tao-data-io`` on a PATH of its own that logs each call's verb and arguments, then runs
    ``then``: (its directory, the log)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    fake = bin_dir / "tao-data-io"
    fake.write_text(f'#!/bin/sh\necho "$1 $*" >> {log}\n{then}')
    fake.chmod(0o755)
    return bin_dir, log


def _sidecar(tmp_path: Path, then: str = "", *, passed: bool = True) -> tuple[subprocess.Popen[bytes], Path]:
    """The results sidecar with a stand-in ``tao-data-io`` (see :func:`fake_tao_data_io`), the verify
    probe having passed or not; started once its first look at the verdict is due."""
    bin_dir, log = fake_tao_data_io(tmp_path, then)
    verdict = tmp_path / "verdict"
    verdict.mkdir()
    if passed:
        (verdict / "passed").touch()
    (tmp_path / "sidecar.sh").write_text(SIDECAR_SCRIPT)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TAO_JOB_ID": "job-1", "TAO_RESULTS_DIR": "/results",
           "TAO_DATA_IO_RESYNC_SECONDS": "3600", "TAO_DATA_IO_VERIFY_FILE": ".tao-data-io-verify",
           "TAO_DATA_IO_VERDICT": str(verdict)}
    # Its own process group: what it started (a resync in flight) is ended with it by _end, never
    # left running into later tests (a leftover with TAO_JOB_ID=job-1 passes for a job's process).
    return subprocess.Popen(["/bin/sh", str(tmp_path / "sidecar.sh")], env=env, start_new_session=True), log


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Kill the sidecar and everything it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _calls(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def _until(what: str, probe: Any) -> None:
    for _ in range(600):  # bounded: 30 s
        if probe():
            return
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def test_sidecar_resyncs_then_uploads_once_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM (what Kubernetes sends once training has exited) ends the resync loop with exactly
    one final upload."""
    proc, log = _sidecar(tmp_path)
    try:
        _until("the first resync", lambda: "resync" in _calls(log))
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        _end(proc)
    assert code == 0 and _calls(log) == ["resync", "upload-results"]
    assert "--exclude .tao-data-io-verify" in log.read_text().splitlines()[-1]


def test_a_resync_in_flight_never_delays_the_final_upload(tmp_path: Path) -> None:
    """A shell runs a trap only once its foreground command ends: a resync of an hour would have
    held the final upload (and the grace period) for that hour. It is ended, and the upload starts."""
    proc, log = _sidecar(tmp_path, '[ "$1" = resync ] && exec sleep 3600\nexit 0\n')
    try:
        _until("a resync in flight", lambda: "resync" in _calls(log))
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        _end(proc)
    assert code == 0 and _calls(log) == ["resync", "upload-results"] and time.monotonic() - started < 20


def test_a_second_stop_signal_never_starts_a_second_final_upload(tmp_path: Path) -> None:
    """A shell runs a pending trap again after the command in it: a delete with a shorter grace
    after the first SIGTERM would have run the final upload twice."""
    proc, log = _sidecar(tmp_path, '[ "$1" = upload-results ] && sleep 2\nexit 0\n')
    try:
        _until("the first resync", lambda: "resync" in _calls(log))
        proc.send_signal(signal.SIGTERM)
        _until("the final upload", lambda: "upload-results" in _calls(log))
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        _end(proc)
    assert code == 0 and _calls(log) == ["resync", "upload-results"]


def _wrapped_until_signalled(command: list[str], ready: Path, signum: int) -> int:
    """Run ``command`` under TRAIN_WRAPPER as a container's PID 1 would, send the wrapper
    ``signum`` once the command said it started (``ready``), and return the wrapper's exit code."""
    proc = subprocess.Popen(["/bin/sh", "-c", TRAIN_WRAPPER, "tao-train", *command])
    try:
        _until("the command started", ready.exists)
        proc.send_signal(signum)
        return proc.wait(timeout=30)
    finally:
        proc.kill()


def test_the_training_wrapper_stops_the_command_on_sigint_too(tmp_path: Path) -> None:
    """A shell starts a background command with SIGINT ignored (and no trap can give it back): an
    image whose stop signal is SIGINT still stops its command, which is handed SIGTERM."""
    ready, got = tmp_path / "ready", tmp_path / "got-term"
    command = ["python3", "-c", "import pathlib,signal,sys,time\n"
               f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(got)!r}).touch(), sys.exit(5)))\n"
               f"pathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)"]
    assert _wrapped_until_signalled(command, ready, signal.SIGINT) == STOPPED_EXIT and got.exists()


def test_after_a_failed_verify_the_sidecar_uploads_nothing(tmp_path: Path) -> None:
    """The probe failed, so the command never ran: no resync and no final upload (the results
    are what an earlier attempt left, already uploaded)."""
    proc, log = _sidecar(tmp_path, passed=False)
    try:
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        _end(proc)
    assert code == 0 and _calls(log) == []


@pytest.mark.parametrize("exit_code", [0, 3, 137])
def test_a_command_kubernetes_stopped_exits_143_whatever_it_returned(tmp_path: Path, exit_code: int) -> None:
    """TRAIN_WRAPPER as the container's PID 1 runs it: the kubelet's SIGTERM reaches the command
    (here one that traps it and exits with a chosen code, 0 included), and the container exits
    143, the code the pod failure policy ignores: a command stopped by a Kueue preemption is not a
    failed one (it would fail the Job) nor a finished one (it would complete it)."""
    ready, got = tmp_path / "ready", tmp_path / "got-term"
    command = ["python3", "-c", "import signal,sys,time,pathlib\n"
               "signal.signal(signal.SIGTERM,"
               f" lambda *a: (pathlib.Path({str(got)!r}).touch(), sys.exit({exit_code})))\n"
               f"pathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)"]
    code = _wrapped_until_signalled(command, ready, signal.SIGTERM)
    assert got.exists() and code == STOPPED_EXIT == 143


@pytest.mark.parametrize(("own", "container"), [(0, 0), (3, 3), (137, 137), (143, 1)])
def test_a_command_that_ends_by_itself_keeps_its_exit_code_unless_it_is_the_stopped_code(own: int,
                                                                                         container: int) -> None:
    """Without a stop, the container's code is the command's — the failure policy and the
    analysis read it — except 143, which would read as stopped and be ignored (the pod replaced
    forever): it becomes 1, said on stderr."""
    done = subprocess.run(["/bin/sh", "-c", TRAIN_WRAPPER, "tao-train", "sh", "-c", f"exit {own}"], check=False,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == container
    assert ("exited 143 though Kubernetes did not stop it" in done.stderr) == (own == 143)


def test_the_training_wrapper_passes_the_commands_words_as_they_are(tmp_path: Path) -> None:
    words = ["a;b|c", "$(id)", "`id`", "x && y", "*", ""]
    done = subprocess.run(["/bin/sh", "-c", TRAIN_WRAPPER, "tao-train", "python3", "-c",
                           "import json,sys; print(json.dumps(sys.argv[1:]))", *words],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and json.loads(done.stdout) == words


@pytest.mark.parametrize(("rank", "restore_exit", "calls", "code"), [
    ("0", 0, ["record", "restore-results", "stage"], 0),
    ("1", 0, ["record", "stage"], 0),  # only rank 0 writes results, so only it restores them
    ("0", 1, ["record", "restore-results"], 1),  # a failed restore stops the pod: no resume from less
])
def test_a_later_attempts_stager_restores_the_results_before_it_stages(
        tmp_path: Path, rank: str, restore_exit: int, calls: list[str], code: int) -> None:
    bin_dir, log = fake_tao_data_io(tmp_path, f'[ "$1" = restore-results ] && exit {restore_exit}\nexit 0\n')
    (tmp_path / "stager.sh").write_text(STAGER_SCRIPT)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TAO_DATA_IO_FILES": str(tmp_path), "NODE_RANK": rank,
           "TAO_JOB_ID": "job-1", "TAO_DATA_IO_RESTORE_FROM": "s3://b/results/job-1/", "TAO_RESULTS_DIR": "/results",
           "TAO_DATA_IO_STAGING_DIR": "/tao-stage", "TAO_DATA_IO_STATE": str(tmp_path)}
    done = subprocess.run(["/bin/sh", str(tmp_path / "stager.sh")], env=env, timeout=60)
    assert done.returncode == code
    assert [line.split()[0] for line in log.read_text().splitlines()] == calls
    if "restore-results" in calls:
        restore = next(line for line in log.read_text().splitlines() if line.startswith("restore-results"))
        # The record the pod imported must own the prefix: another record's results are never restored.
        assert "--from s3://b/results/job-1/ --results-dir /results --job-id job-1" in restore


def test_the_status_sidecar_waits_for_status_json_then_follows_it_and_ends_on_sigterm(tmp_path: Path) -> None:
    """The status sidecar as Kubernetes runs it: nothing until the job writes ``status.json``,
    then every line of it, the ones appended later too, in its log (stdout); SIGTERM — sent once
    training has exited — ends it with 0."""
    results = tmp_path / "results"
    results.mkdir()
    (tmp_path / "status.sh").write_text(STATUS_SCRIPT)
    env = {"PATH": os.environ["PATH"], "TAO_RESULTS_DIR": str(results), "TAO_DATA_IO_STATUS_FILE": "status.json",
           "TAO_DATA_IO_STATUS_SECONDS": "0.05"}
    out = tmp_path / "log"
    with out.open("wb") as log:
        proc = subprocess.Popen(["/bin/sh", str(tmp_path / "status.sh")], env=env, stdout=log)
    try:
        subprocess.run(["sleep", "0.3"], check=True)
        assert out.read_bytes() == b""  # no file yet: nothing printed, still waiting
        (results / "status.json").write_text('{"epoch": 1}\n')
        wait_for("the first line", lambda: b'"epoch": 1' in out.read_bytes())
        with (results / "status.json").open("a") as status:
            status.write('{"epoch": 2}\n')
        wait_for("the appended line", lambda: b'"epoch": 2' in out.read_bytes())
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == 0 and out.read_text().splitlines() == ['{"epoch": 1}', '{"epoch": 2}']
    followers = subprocess.run(["pgrep", "-f", f"tail -n \\+1 -F {results}"], capture_output=True, text=True)
    assert followers.stdout == "", "the sidecar left its tail running"


@pytest.mark.parametrize("tier", ["A", "B", "C"])
def test_every_training_pod_has_the_status_sidecar_with_the_results_read_only_and_no_credential(
        tier: str, tmp_path: Path) -> None:
    """On every tier, not only where results are uploaded: the progress artifacts need it."""
    inputs = [{"source": "/lustre/coco", "target": "/data"}] if tier == "A" else [{"source": "s3://bkt-1/data/"}]
    rendered = render(req(inputs=inputs), tmp_path, tier, environ=SECRET_ENV, pvc_claim="lustre")
    validate(rendered)
    pod = training_pod(rendered)
    assert [c["name"] for c in pod["initContainers"]][-2:] == ["status", "verify"]  # runs while training does
    status = pod["initContainers"][-2]
    assert status["restartPolicy"] == "Always" and status["image"] == pod["containers"][0]["image"]
    assert {m["mountPath"]: m.get("readOnly") for m in status["volumeMounts"]}["/results"] is True
    assert not any("valueFrom" in e for e in status["env"])  # no credential: it only reads a file
    assert "status.sh" in next(o for o in rendered.objects if o["kind"] == "ConfigMap")["data"]


def test_the_training_pod_is_never_best_effort_and_takes_the_requests_cpu_memory_and_disk(tmp_path: Path) -> None:
    """A pod with no requests is BestEffort (pkg/apis/core/v1/helper/qos: no container requests
    or limits any of cpu and memory) — evicted first under memory pressure, and refused outright
    by a ResourceQuota on requests.memory (plugin/pkg/admission/resourcequota: "must specify
    requests.memory"). Memory is always requested: what the request says, else its /dev/shm."""
    shaped = req(compute_shape={"gpus": 1, "shm_size": "8Gi", "cpu": "7500m", "memory": "96Gi",
                                "ephemeral_storage": "200Gi"})
    rendered = render(shaped, tmp_path / "a", "C")
    validate(rendered)
    disk = "225280Mi"  # the request's 200Gi and the results volume's 20Gi (outputs.results_limit)
    assert training_pod(rendered)["containers"][0]["resources"] == {
        "requests": {"memory": "96Gi", "cpu": "7500m", "ephemeral-storage": disk},
        "limits": {"nvidia.com/gpu": "1", "cpu": "7500m", "memory": "96Gi", "ephemeral-storage": disk}}
    plain = training_pod(render(req(compute_shape={"gpus": 0}), tmp_path / "b", "C"))["containers"][0]
    assert plain["resources"] == {"requests": {"memory": "16Gi", "ephemeral-storage": "20480Mi"}}  # Burstable
    with pytest.raises(UsageError, match="compute_shape.memory '16Gi' is less than the target's shm_size '32Gi'"):
        render(req(compute_shape={"memory": "16Gi"}), tmp_path / "c", "C", shm_size="32Gi")


@pytest.mark.parametrize(("shape", "fragment"), [
    ({"cpu": "lots"}, "cpu 'lots' is not a CPU quantity"), ({"memory": "64GB"}, "memory '64GB' is not a binary"),
    ({"memory": "8Gi"}, "memory '8Gi' is less than shm_size '16Gi'"),
])
def test_a_resource_the_cluster_would_refuse_is_refused_in_the_request(shape: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        req(compute_shape=shape)


def test_results_kept_on_the_claim_are_never_called_ephemeral(tmp_path: Path) -> None:
    """The air-gapped example uploads nothing, but its results are mounted from the claim: the
    render says where they stay, and calls results ephemeral only when nothing keeps them."""
    request = load_request(EXAMPLES / "air-gapped.yaml")
    ephemeral = OutputRoute(route="ephemeral", destination="(none)", reason="test")
    on_claim = render(request, tmp_path / "a", "A", route=ephemeral, pvc_claim="lustre")
    assert on_claim.warnings == ["results of job example-job are not uploaded: they stay on claim 'lustre' under "
                                 "results/example-job/"]
    tier_c = req(outputs={"results_dir": "/results"})
    assert "ephemeral" in render(tier_c, tmp_path / "b", "C", route=ephemeral).warnings[0]


@pytest.mark.parametrize("tier", ["B", "C"])
def test_no_pod_of_a_job_carries_a_service_account_token(tier: str, tmp_path: Path) -> None:
    """The API server mounts the service account's token into every pod unless told not to
    (ServiceAccount admission, plugin/pkg/admission/serviceaccount): a job's pods never call the
    API, so a compromised training command must not find a token at
    /var/run/secrets/kubernetes.io/serviceaccount."""
    rendered = render(req(), tmp_path, tier, pvc_claim="lustre")
    pods = [o["spec"]["template"]["spec"] for o in rendered.objects if o["kind"] == "Job"]
    assert pods and all(pod["automountServiceAccountToken"] is False for pod in pods)


# ----------------------------------------------------------------------------- CLI
def _restricted_violations(pod: dict[str, Any], names: set[str] | None = None) -> list[str]:
    """What the 'restricted' Pod Security Standard refuses in ``pod`` (only its containers
    ``names``, when given), as the API stand-in's admission judges it."""
    kept = {key: [c for c in pod.get(key, []) if names is None or c["name"] in names]
            for key in ("initContainers", "containers")}
    return pod_security_violations({"spec": {**pod, **kept}}, "restricted")


@pytest.mark.parametrize("tier", ["B", "C"])
def test_our_own_containers_run_under_the_restricted_pod_security_standard(tier: str, tmp_path: Path) -> None:
    """A namespace enforcing 'restricted' refuses every pod that breaks it — and admission applies
    to pods, not Jobs, so the Job's own dry run passes and its controller loops on FailedCreate.
    The stager, the sidecars and the stage Job never need more than 'restricted'; the training
    container and the probe run as the target says: the image's user (TAO's is root), or
    'restricted' with a non-root user, where the whole pod passes."""
    ours = {"stager", "results", "status", "stage"}
    rendered = render(req(storage={"pvc_claim": "lustre"}), tmp_path / "i", tier, pvc_claim="lustre")
    pods = [o["spec"]["template"]["spec"] for o in rendered.objects if o["kind"] == "Job"]
    assert all(_restricted_violations(pod, ours) == [] for pod in pods)
    assert [v.split(" (")[0] for v in _restricted_violations(pods[-1])] == [
        "allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true", "seccompProfile"]
    assert all('"verify", "train"' in violation for violation in _restricted_violations(pods[-1]))
    strict = render(req(storage={"pvc_claim": "lustre"}), tmp_path / "r", tier, pvc_claim="lustre",
                    training_security="restricted", training_user=1000)
    validate(strict)
    assert all(_restricted_violations(o["spec"]["template"]["spec"]) == []
               for o in strict.objects if o["kind"] == "Job")
    train = training_pod(strict)["containers"][0]
    assert train["securityContext"]["runAsUser"] == 1000


def test_the_stage_pod_makes_a_new_claim_writable_for_the_stager_where_the_volume_applies_fsgroup(
        tmp_path: Path) -> None:
    """The root of a new block volume is root:root 0755; the stager runs as UID 1000. The stage pod
    asks the kubelet to give the volume its group (fsGroup; OnRootMismatch: only a new volume's
    root is walked, not a filled cache on every start). In-tree NFS and CSI drivers whose
    fsGroupPolicy skips RWX claims ignore it: docs/kubernetes.md says what to pre-create there."""
    rendered = render(req(storage={"pvc_claim": "lustre"}), tmp_path, "B", pvc_claim="lustre")
    stage = [o for o in rendered.objects if o["kind"] == "Job"][0]["spec"]["template"]["spec"]
    assert stage["securityContext"] == {"fsGroup": 1000, "fsGroupChangePolicy": "OnRootMismatch"}


def test_a_stage_that_cannot_write_its_volume_ends_its_job_at_once(tmp_path: Path) -> None:
    """Exit 3 is the stage's write probe refusing a volume it cannot write, which fails the same way
    on every retry: the pod failure policy (batch/v1 PodFailurePolicy; its rules need
    restartPolicy Never, pkg/apis/batch/validation) ends the Job instead of spending backoffLimit
    on it; any other exit — 2 included, which also covers an endpoint not reachable yet — is
    retried."""
    rendered = render(req(storage={"pvc_claim": "lustre"}), tmp_path, "B", pvc_claim="lustre")
    stage = [o for o in rendered.objects if o["kind"] == "Job"][0]["spec"]
    assert stage["podFailurePolicy"] == {"rules": [{"action": "FailJob", "onExitCodes": {
        "containerName": "stage", "operator": "In", "values": [UNWRITABLE_EXIT]}}]}
    assert stage["template"]["spec"]["restartPolicy"] == "Never" and stage["backoffLimit"] > 0
    validate(rendered)


def test_tier_c_reserves_and_limits_its_staging_disk_with_the_training_containers_own(tmp_path: Path) -> None:
    """The kubelet evicts a pod whose disk use — its emptyDirs included — passes the sum of its
    containers' ephemeral-storage limits; the scheduler reserves the larger of the largest init
    container's request and the app containers' sum. The staging volume's size joins the
    training container's request, and its limit when the request sets one."""
    def sized(request: JobRequest, where: Path) -> RenderedJob:
        plan, _ = plan_for(request, where, "C")
        return render(request, where, "C", plan=plan.model_copy(update={"staging_bytes": 100 * 2**30}))

    plain = sized(req(), tmp_path / "p")
    train = training_pod(plain)["containers"][0]["resources"]
    staging = next(v for v in training_pod(plain)["volumes"] if v["name"] == "staging")["emptyDir"]["sizeLimit"]
    assert staging == "102656Mi"  # 100 GiB and the margin; with the results volume's 20Gi:
    assert train["requests"]["ephemeral-storage"] == "123136Mi"
    assert "ephemeral-storage" not in train.get("limits", {})
    shaped = sized(req(compute_shape={"gpus": 1, "ephemeral_storage": "10Gi"}), tmp_path / "s")
    resources = training_pod(shaped)["containers"][0]["resources"]
    assert resources["requests"]["ephemeral-storage"] == resources["limits"]["ephemeral-storage"] == "133376Mi"
    validate(shaped)
    unknown = training_pod(render(req(), tmp_path / "u", "C"))
    assert next(v for v in unknown["volumes"] if v["name"] == "staging")["emptyDir"] == {}


def test_the_results_volume_is_bounded_by_the_results_limit_and_reserved_with_the_pods_disk(tmp_path: Path) -> None:
    """Finding 16. Without a claim the results live in an emptyDir on the node's disk, which the
    kubelet counts (pkg/kubelet/eviction/eviction_manager.go): it evicts a pod whose emptyDir
    passes its sizeLimit (``emptyDirLimitEviction``), and every emptyDir not in memory is part of
    the pod's use, held against the sum of its containers' ephemeral-storage limits
    (``podEphemeralStorageLimitEviction``). The results volume is bounded by the request's
    outputs.results_limit, and that bound joins the staging volume's in the training container's
    request — the scheduler reserves it — and in its limit when the request sets one."""
    def sized(request: JobRequest, where: Path) -> dict[str, Any]:
        plan, _ = plan_for(request, where, "C")
        rendered = render(request, where, "C", plan=plan.model_copy(update={"staging_bytes": 100 * 2**30}))
        validate(rendered)
        return training_pod(rendered)

    plain = sized(req(outputs={"results_limit": "8Gi"}), tmp_path / "p")
    volumes = by_name(plain["volumes"])
    assert volumes["results"]["emptyDir"] == {"sizeLimit": "8Gi"}
    staging = quantity_bytes(volumes["staging"]["emptyDir"]["sizeLimit"])
    train = plain["containers"][0]["resources"]
    assert quantity_bytes(train["requests"]["ephemeral-storage"]) == staging + 8 * 2**30
    assert "ephemeral-storage" not in train.get("limits", {})
    shaped = sized(req(outputs={"results_limit": "8Gi"}, compute_shape={"gpus": 1, "ephemeral_storage": "10Gi"}),
                   tmp_path / "s")["containers"][0]["resources"]
    assert shaped["requests"]["ephemeral-storage"] == shaped["limits"]["ephemeral-storage"]
    assert quantity_bytes(shaped["limits"]["ephemeral-storage"]) == 10 * 2**30 + staging + 8 * 2**30
    on_claim = training_pod(render(req(storage={"pvc_claim": "lustre"}), tmp_path / "b", "B", pvc_claim="lustre"))
    assert "results" not in by_name(on_claim["volumes"])  # the claim holds them, not the node's disk
    assert "ephemeral-storage" not in on_claim["containers"][0]["resources"]["requests"]


def test_the_final_uploads_grace_follows_the_requests_results_limit_and_is_bounded(tmp_path: Path) -> None:
    """One owner for the results' size: the request's outputs.results_limit sizes the grace period
    (60 s plus the limit at the measured rate), never past two hours whatever it says; a target
    saved with the retired results_budget still loads."""
    small = training_pod(render(req(outputs={"results_limit": "1Gi"}), tmp_path / "s", "C"))
    huge = training_pod(render(req(outputs={"results_limit": "64Ti"}), tmp_path / "h", "C"))
    assert 60 < small["terminationGracePeriodSeconds"] < 600 and huge["terminationGracePeriodSeconds"] == 7200
    assert KubernetesSettings.from_mapping({"namespace": "tao", "results_budget": "20Gi"}).namespace == "tao"


def test_the_stage_pod_is_scheduled_where_the_training_pods_may_run(tmp_path: Path) -> None:
    """A WaitForFirstConsumer claim is bound where its first pod lands (the volume binder,
    pkg/scheduler/framework/plugins/volumebinding): were the GPU-less stage pod free to land on
    any node, the volume could be pinned where no GPU pod fits (a volume node-affinity conflict).
    It gets the training pod's node selector and tolerations."""
    placement = {"node_selector": {"gpu": "a100"},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    rendered = render(req(storage={"pvc_claim": "lustre"}), tmp_path, "B", pvc_claim="lustre", **placement)
    stage, training = [o["spec"]["template"]["spec"] for o in rendered.objects if o["kind"] == "Job"]
    for key in ("nodeSelector", "tolerations"):
        assert stage[key] == training[key] and stage[key]


def test_render_job_suspends_tier_bs_training_until_its_stage_has_run(tmp_path: Path) -> None:
    """Applied at once, a training pod that starts before the stage Job has filled the cache gets
    every missing subPath created as an empty directory by the kubelet (pkg/kubelet/kubelet_pods.go,
    makeMounts: subPath directories are created when absent). Rendered for kubectl, tier B's
    training Job waits suspended (batch/v1 JobSpec.suspend); the stage Job runs at once."""
    request = req(storage={"pvc_claim": "lustre"})
    suspended = render(request, tmp_path / "b", "B", suspend_training=True, pvc_claim="lustre")
    validate(suspended)
    stage, training = [o for o in suspended.objects if o["kind"] == "Job"]
    assert training["spec"]["suspend"] is True and "suspend" not in stage["spec"]
    direct = render(request, tmp_path / "d", "B", pvc_claim="lustre")
    assert "suspend" not in direct.objects[-1]["spec"]  # the backend creates it after the stage instead
    tier_c = render(req(), tmp_path / "c", "C", suspend_training=True)
    assert "suspend" not in tier_c.objects[-1]["spec"]  # no stage Job: nothing to wait for


def test_the_probe_reads_a_pre_positioned_input_from_above_never_by_its_subpath(tmp_path: Path) -> None:
    """A container that mounts a missing subPath has the kubelet create it (makeMounts): the verify
    probe mounts the top-level directory each pre-positioned source lies in, read-only, and
    checks the source below it — not the whole claim, which holds other jobs' results — and
    only the training container mounts the sources by subPath, after the probe passed. A source
    that is itself top-level is read from the claim's root."""
    request = req(inputs=[], mounts=[{"source": "/datasets/coco", "target": "/data"},
                                     {"source": "/datasets/ann/train.json", "target": "/ann.json"},
                                     {"source": "/models/resnet", "target": "/model"}])
    pod = training_pod(render(request, tmp_path / "a", "A", pvc_claim="lustre"))
    verify = by_name(pod["initContainers"])["verify"]
    train = pod["containers"][0]
    sources = {m["subPath"] for m in train["volumeMounts"] if m["name"] == "data" and m["mountPath"] != "/results"}
    assert sources == {"datasets/coco", "datasets/ann/train.json", "models/resnet"}
    seen = [m for m in verify["volumeMounts"] if m["name"] == "data" and m["mountPath"] != "/results"]
    assert seen == [
        {"name": "data", "mountPath": "/tao-data-io/volume/datasets", "subPath": "datasets", "readOnly": True},
        {"name": "data", "mountPath": "/tao-data-io/volume/models", "subPath": "models", "readOnly": True}]
    rendered = render(request, tmp_path / "c", "A", pvc_claim="lustre")
    checklist = next(o for o in rendered.objects if o["kind"] == "ConfigMap")["data"]["checklist"]
    lines = {line.split("\t")[1]: line.split("\t")[2] for line in checklist.splitlines()}
    assert lines["/tao-data-io/volume/datasets/coco"] == "/tao-data-io/volume"  # must resolve inside the claim
    top = training_pod(render(req(inputs=[], mounts=[{"source": "/datasets", "target": "/data"}]), tmp_path / "t", "A",
                              pvc_claim="lustre"))
    assert {"name": "data", "mountPath": "/tao-data-io/volume", "readOnly": True} in by_name(
        top["initContainers"])["verify"]["volumeMounts"]


def test_a_staged_input_is_probed_where_training_reads_it(tmp_path: Path) -> None:
    """Tier B's entries exist once the stage ran, and the training Job exists only then (or waits
    suspended): the probe mounts each by its subPath, exactly as training does."""
    pod = training_pod(render(req(storage={"pvc_claim": "lustre"}), tmp_path, "B", pvc_claim="lustre"))
    verify, train = by_name(pod["initContainers"])["verify"], pod["containers"][0]
    cached = [m for m in train["volumeMounts"] if m.get("subPath", "").startswith("cache/")]
    assert cached and all(m in verify["volumeMounts"] for m in cached)


@pytest.mark.parametrize("tier", ["B", "C"])
def test_a_glob_input_is_staged_on_the_cluster_and_its_pattern_reaches_the_config(tier: str, tmp_path: Path) -> None:
    """The pod's stager (tier C) or the stage Job (tier B) stages what the pattern matches into
    the folder of its own; training mounts that folder, the probe wants it non-empty, and the
    config holds the pattern over it."""
    request = req(mode="config", config_format="yaml", command="efficientdet_tf2 train -e {config_path}", args=None,
                  inputs=[], spec={"dataset": {"train_tfrecords": ["s3://bkt-1/tfrecords/train-*"]}},
                  storage={"pvc_claim": "lustre"} if tier == "B" else {})
    rendered = render(request, tmp_path, tier, pvc_claim="lustre" if tier == "B" else None)
    validate(rendered)
    files = next(o for o in rendered.objects if o["kind"] == "ConfigMap")["data"]
    (config,) = [text for key, text in files.items() if key.endswith(".yaml") and "train_tfrecords" in text]
    (pattern,) = yaml.safe_load(config)["dataset"]["train_tfrecords"]
    folder = pattern.rsplit("/", 1)[0]
    assert pattern.endswith("/train-*") and "/glob/" in folder
    train = training_pod(rendered)["containers"][0]
    assert any(m["mountPath"] == folder for m in train["volumeMounts"])
    assert f"dir-nonempty\t{folder}\t" in files["checklist"]


def test_render_job_of_a_record_without_a_tier_names_the_fix_not_a_validation_trace(tmp_path: Path) -> None:
    env = {"TAO_DATA_IO_JOBS_DIR": str(tmp_path / "records"), "S3_BUCKET_NAME": "tao-results", **SECRET_ENV}
    assert run_cli("record", "open", "--job-id", "dino-tier-c", "--backend", "kubernetes", "--image", "i",
                   "--network-arch", "dino", "--action", "train", "--results-dir", "/results", env=env).returncode == 0
    assert run_cli("stage", "--request", str(EXAMPLES / "tier-c.yaml"), "--staging-dir", str(tmp_path / "p"),
                   "--plan-only", env=env).returncode == 0
    done = run_cli("render-job", "--request", str(EXAMPLES / "tier-c.yaml"), "--staging-map",
                   str(tmp_path / "p" / "staging-map.json"), "--job-id", "dino-tier-c", "--stager-image", STAGER,
                   env=env)
    assert done.returncode == 2 and "has no storage tier in its record yet" in done.stderr
    assert "--storage-tier" in done.stderr and "ValidationError" not in done.stderr and "pydantic" not in done.stderr


def test_render_job_cli_prints_valid_yaml_and_translates_parameters_to_flags(tmp_path: Path) -> None:
    env = {"TAO_DATA_IO_JOBS_DIR": str(tmp_path / "records"), "S3_BUCKET_NAME": "tao-results", **SECRET_ENV}
    opened = run_cli("record", "open", "--job-id", "dino-tier-c", "--backend", "kubernetes", "--image", "i",
                     "--network-arch", "dino", "--action", "train", "--results-dir", "/results", "--storage-tier", "C",
                     env=env)
    assert opened.returncode == 0, opened.stderr
    planned = run_cli("stage", "--request", str(EXAMPLES / "tier-c.yaml"), "--staging-dir", str(tmp_path / "p"),
                      "--plan-only", env=env)
    assert planned.returncode == 0, planned.stderr
    args = ["render-job", "--request", str(EXAMPLES / "tier-c.yaml"), "--staging-map",
            str(tmp_path / "p" / "staging-map.json"), "--job-id", "dino-tier-c", "--stager-image", STAGER]
    done = run_cli(*args, env=env)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "Job"]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.32", strict=True)
    assert not any(v in done.stdout for v in SECRET_ENV.values())
    assert not re.search(r"[&*]id\d+", done.stdout)  # no YAML anchors or aliases: each object reads whole
    bad = run_cli(*args, "--namespace", "Tao", env=env)
    assert bad.returncode == 2 and "--namespace 'Tao' is not a DNS label" in bad.stderr
    shown = run_cli("plan", "--backend", "kubernetes", "--request", str(EXAMPLES / "tier-c.yaml"), env=env)
    assert shown.returncode == 0 and shown.stdout.startswith("tier C: storage.tier 'C' was asked")
    assert "Examples:" in run_cli("render-job", "--help", env=env).stdout


def test_the_command_line_takes_several_image_pull_secrets() -> None:
    from tao_data_io.cli import build_parser
    from tao_data_io.commands.target import target_settings

    args = build_parser().parse_args(["render-job", "--request", "r.yaml", "--staging-map", "m.json", "--job-id", "j",
                                      "--image-pull-secrets", "ngc-pull", "--image-pull-secrets", "stager-pull"])
    assert target_settings(args, backend="kubernetes")["image_pull_secrets"] == ["ngc-pull", "stager-pull"]


@pytest.mark.parametrize("number", [0, 1, 2])
def test_every_render_job_example_renders_as_its_help_shows_it(tmp_path: Path, number: int) -> None:
    """Each example, after the steps its words name (``record open`` and ``stage --plan-only``
    into its staging map's directory), prints manifests the official schemas accept."""
    import shlex

    from tao_data_io.commands.examples import catalogue

    _, command = catalogue()["render-job"][number]
    argv = shlex.split(re.search(r"tao-data-io ([^|>]*)", command)[1])
    given = dict(zip(argv[1::2], argv[2::2]))
    (tmp_path / "examples").symlink_to(EXAMPLES)
    env = {"TAO_DATA_IO_RECORDS": str(tmp_path / "records"), "S3_BUCKET_NAME": "tao-results", **SECRET_ENV}
    request = load_request(EXAMPLES / Path(given["--request"]).name)
    planned = run_cli("stage", "--request", given["--request"], "--staging-dir",
                      str(Path(given["--staging-map"]).parent), "--plan-only", env=env, cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    opened = run_cli("record", "open", "--job-id", given["--job-id"], "--backend", "kubernetes", "--image",
                     request.image, "--network-arch", "dino", "--action", "train", "--results-dir", "/results",
                     "--storage-tier", request.storage.tier or "B", env=env, cwd=tmp_path)
    assert opened.returncode == 0, opened.stderr
    rendered = run_cli(*argv, env=env, cwd=tmp_path)
    assert rendered.returncode == 0, (command, rendered.stderr)
    for doc in (d for d in yaml.safe_load_all(rendered.stdout) if d):
        kubernetes_validate.validate(doc, "1.32", strict=True)
