"""The names the API server takes, against the stand-in: it refuses what upstream's validation
refuses, and job ids that begin with a digit, or look like each other's derived names, run
side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.backends.kubernetes.api import Api, ApiError, connect
from tao_data_io.backends.kubernetes.apply import kinds

from . import kube_cluster
from .kube_cluster import NAMESPACE, claim, every_object_of_ours, job_request, make_backend, ours, submit, validate
from .kube_helpers import DNS_1035, ITS_CREDENTIALS_BASE, ITS_FILES_BASE, LONG_ID
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


def named(kind: str, name: str, **extra: Any) -> dict[str, Any]:
    """A minimal object of ``kind`` (a Job: one container, restartPolicy Never)."""
    obj: dict[str, Any] = {"apiVersion": "batch/v1" if kind == "Job" else "v1", "kind": kind,
                           "metadata": {"name": name, "namespace": NAMESPACE}}
    if kind == "Job":
        obj["spec"] = {"template": {"metadata": {}, "spec": {"restartPolicy": "Never",
                                                           "containers": [{"name": "c", "image": "i"}]}}}
    elif kind == "Service":
        obj["spec"] = {"clusterIP": "None", "ports": [{"port": 29500}]}
    for path, value in extra.items():  # "spec.completions": 3
        *parents, last = path.split(".")
        target = obj
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return obj


SUBDOMAIN_253 = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253 characters, each part a label
NAME_CASES = [
    # pkg/apis/core/validation.ValidateService: ValidateServiceName = NameIsDNS1035Label
    (named("Service", "2x8-torchrun"), "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
     "start with an alphabetic character"),
    (named("Service", "s" * 64), "must be no more than 63 characters"),
    (named("Service", "s" * 63), None),
    # ValidateConfigMap / ValidateSecret: ValidateConfigMapName / ValidateSecretName = NameIsDNSSubdomain
    (named("ConfigMap", "Job_1-files"), "a lowercase RFC 1123 subdomain must consist of"),
    (named("ConfigMap", SUBDOMAIN_253 + "c"), "must be no more than 253 characters"),
    (named("ConfigMap", SUBDOMAIN_253), None),
    (named("Secret", "-job-1-credentials"), "a lowercase RFC 1123 subdomain must consist of"),
    (named("Secret", "2x8-torchrun-credentials"), None),
    # pkg/apis/batch/validation.ValidateJob: a DNS-1123 subdomain, and (strategy.go generateSelector
    # labels the pod template job-name=<name>) a label value of at most 63 characters
    (named("Job", "j" * 64), "spec.template.metadata.labels: Invalid value: '" + "j" * 64 + "': must be no more than "
     "63 characters"),
    (named("Job", "2x8-torchrun"), None),
    # ValidateJob: an Indexed Job's last pod hostname <name>-<completions-1> is a DNS-1123 label
    (named("Job", "j" * 62, **{"spec.completionMode": "Indexed", "spec.completions": 10}),
     "will not able to create pod with invalid DNS label: " + "j" * 62 + "-9"),
    (named("Job", "j" * 61, **{"spec.completionMode": "Indexed", "spec.completions": 11}),
     "will not able to create pod with invalid DNS label: " + "j" * 61 + "-10"),
    (named("Job", "j" * 61, **{"spec.completionMode": "Indexed", "spec.completions": 10}), None),
    # ValidatePodSpec: the subdomain is a DNS-1123 label
    (named("Job", "job-1", **{"spec.template.spec.subdomain": "Job-1"}), "spec.template.spec.subdomain: Invalid value"),
    # apimachinery/pkg/apis/meta/v1/validation.ValidateLabels: IsValidLabelValue, at most 63
    (named("ConfigMap", "job-1-files", **{"metadata.labels": {"tao-data-io/job-id": "x" * 64}}),
     "metadata.labels: Invalid value: '" + "x" * 64 + "': must be no more than 63 characters"),
    (named("ConfigMap", "job-1-files", **{"metadata.labels": {"tao-data-io/job-id": "-x"}}), "a valid label must be"),
]


@pytest.mark.parametrize(("obj", "refusal"), NAME_CASES,
                         ids=[f"{o['kind']}-{i}-{'refused' if r else 'taken'}" for i, (o, r) in enumerate(NAME_CASES)])
def test_the_stand_in_refuses_the_names_the_api_server_refuses(kube: KubeStandIn, obj: dict[str, Any],
                                                              refusal: str | None) -> None:
    """The stand-in validates names as the API server does, citing its rules:
    k8s.io/apimachinery/pkg/util/validation (IsDNS1035Label, IsDNS1123Label, IsDNS1123Subdomain,
    IsValidLabelValue) as pkg/apis/core/validation (ValidateService → ValidateServiceName,
    ValidateConfigMap, ValidateSecret, ValidatePodSpec) and pkg/apis/batch/validation.ValidateJob
    apply them — a dry run and a create alike; and a name at the edge of a rule is taken."""
    api = Api(connect())
    kind = kinds(api)[obj["kind"]]
    for dry_run in ({"dry_run": "All"}, {}):
        if refusal is None:
            api.call("creating", kind.create, NAMESPACE, obj, **dry_run)
            continue
        with pytest.raises(ApiError) as info:
            api.call("creating", kind.create, NAMESPACE, obj, **dry_run)
        assert (info.value.status, info.value.reason) == (422, "Invalid") and refusal in str(info.value), info.value
    assert (obj["metadata"]["name"] in kube.server.alive(obj["kind"], NAMESPACE)) == (refusal is None)


def test_a_multi_node_job_whose_id_begins_with_a_digit_finds_rank_0(kube: KubeStandIn, tmp_path: Path) -> None:
    """A job id may begin with a digit, a Service name may not (DNS-1035): the rendezvous Service,
    the pods' subdomain and MASTER_ADDR take a name that begins with a letter, and the Job — which
    names the pods' hostnames and backend_ref — keeps the id."""
    done = submit(tmp_path, job_request(job_id="2x8-torchrun", compute_shape={"gpus": 8, "nodes": 2}), make_backend())
    assert done.verdict.ok and done.backend_ref == "tao/2x8-torchrun"
    (service,) = ours(kube, "Service").values()
    name = service["metadata"]["name"]
    assert DNS_1035.fullmatch(name)
    pod = ours(kube, "Job")["2x8-torchrun"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert pod["subdomain"] == name and env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == f"2x8-torchrun-0.{name}"
    validate(every_object_of_ours(kube))


def test_jobs_whose_ids_look_like_each_others_names_run_side_by_side(kube: KubeStandIn, tmp_path: Path) -> None:
    """Names derived from job ids never meet: L, a 52-character id, and M and M2, ids equal to
    what a hash-truncating scheme made of L's names, all run in one namespace, each with its own
    Secret, ConfigMap and Job; L's ConfigMap still holds L's record and checklist."""
    ids = [LONG_ID, ITS_FILES_BASE, ITS_CREDENTIALS_BASE]
    for job_id in ids:
        done = submit(tmp_path, job_request(job_id=job_id), make_backend())
        assert done.verdict.ok and done.backend_ref == f"tao/{job_id}"
    for kind in ("Secret", "ConfigMap", "Job"):
        owners = sorted(o["metadata"]["annotations"]["tao-data-io/job-id"] for o in ours(kube, kind).values())
        assert owners == sorted(ids), kind
    for configmap in ours(kube, "ConfigMap").values():
        job_id = configmap["metadata"]["annotations"]["tao-data-io/job-id"]
        assert json.loads(configmap["data"]["job-record.json"])["job_id"] == job_id
    validate(every_object_of_ours(kube))


def test_a_job_id_ending_in_stage_never_meets_another_jobs_stage_job(kube: KubeStandIn, tmp_path: Path) -> None:
    """Job names of two roles: job ``foo``'s tier B stage Job and job ``foo-stage``'s training Job
    are two Jobs."""
    kube.server.store(claim())
    first = submit(tmp_path, job_request(job_id="foo", storage={"pvc_claim": "tao-data"}), make_backend())
    second = submit(tmp_path, job_request(job_id="foo-stage"), make_backend())
    assert first.verdict.ok and second.verdict.ok and (first.tier, second.tier) == ("B", "C")
    jobs = {name: (o["metadata"]["annotations"]["tao-data-io/job-id"], o["metadata"]["labels"]["tao-data-io/step"])
            for name, o in ours(kube, "Job").items()}
    assert sorted(jobs.values()) == [("foo", "stage"), ("foo", "train"), ("foo-stage", "train")]
    assert (jobs["foo"], jobs["foo-stage"]) == (("foo", "train"), ("foo-stage", "train"))  # backend_ref's names
