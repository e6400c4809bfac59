"""Credentials on Kubernetes, against the API stand-in: forwarded values reach the API server
only (never a record, a line said, or a dry run), a refusal that echoes one is masked, a missing
one creates nothing, and the Secrets a target names are checked before anything is made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tao_data_io.errors import BackendError, CredentialError

from . import kube_cluster
from .kube_cluster import (NAMESPACE, SECRETS, creates, every_object_of_ours, gate_case, job_request, make_backend,
                           submit)
from .kube.apiserver import Fault, KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


def test_credential_values_go_only_to_the_api_server(kube: KubeStandIn, tmp_path: Path) -> None:
    said: list[str] = []
    submit(tmp_path, job_request(), make_backend(said))
    carried = [r for r in kube.server if any(v in r.text for v in SECRETS.values())]
    assert [f"{r.method.value} {r.url.path}" for r in carried] == ["POST /api/v1/namespaces/tao/secrets"]
    record_text = (tmp_path / "records").rglob("*.json")
    assert not any(v in path.read_text() for path in record_text for v in SECRETS.values())
    assert not any(v in line for line in said for v in SECRETS.values())
    dry_run = next(r for r in kube.server if r.url.path.endswith("/secrets") and r.params.get("dryRun"))
    assert set(dry_run.data["stringData"].values()) == {"dry-run"}  # preflight reads no credential


def test_a_refusal_that_echoes_a_credential_value_is_masked(kube: KubeStandIn, tmp_path: Path) -> None:
    value = SECRETS["AWS_SECRET_ACCESS_KEY"]
    kube.server.fault = Fault(at=0, kind="500", request="POST /api/v1/namespaces/tao/secrets")
    kube.server.fault_message = f'Secret "job-1-credentials" is invalid: data[AWS_SECRET_ACCESS_KEY]: "{value}"'
    with pytest.raises(BackendError) as info:
        submit(tmp_path, job_request(), make_backend())
    assert value not in str(info.value) and "***AWS_SECRET_ACCESS_KEY***" in str(info.value)


def test_a_missing_forwarded_credential_creates_nothing(kube: KubeStandIn, tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match="AWS_SECRET_ACCESS_KEY"):
        submit(tmp_path, job_request(), make_backend(), environ={"AWS_ACCESS_KEY_ID": SECRETS["AWS_ACCESS_KEY_ID"],
                                                                 "S3_BUCKET_NAME": "tao-results"})
    assert creates(kube) == [] and every_object_of_ours(kube) == []


@pytest.mark.parametrize(("seeded", "settings", "fragment"), [
    (None, {"image_pull_secrets": ["ngc-pull"]}, ("image_pull_secrets 'ngc-pull' does not exist in namespace 'tao': "
                                                 "create it there (type kubernetes.io/dockerconfigjson")),
    ({"name": "ngc-pull", "type": "Opaque"}, {"image_pull_secrets": ["ngc-pull"]},
     "image_pull_secrets 'ngc-pull' is of type 'Opaque'"),
    (None, {"credential_secret": "team-s3"}, "credential_secret 'team-s3' does not exist in namespace 'tao'"),
    ({"name": "team-s3", "type": "Opaque", "data": {"AWS_ACCESS_KEY_ID": "eA=="}}, {"credential_secret": "team-s3"},
     "credential_secret 'team-s3' has no key AWS_SECRET_ACCESS_KEY, which forward_env names"),
], ids=["pull-missing", "pull-type", "credentials-missing", "credentials-key"])
def test_gate_secrets(kube: KubeStandIn, tmp_path: Path, seeded: dict[str, Any] | None, settings: dict[str, Any],
                      fragment: str) -> None:
    if seeded is not None:
        name, kind = seeded.pop("name"), seeded.pop("type")
        kube.server.store({"apiVersion": "v1", "kind": "Secret", "type": kind,
                           "metadata": {"name": name, "namespace": NAMESPACE}, **seeded})
    message = gate_case(kube, tmp_path, job_request(), make_backend(**settings), fragment)
    assert "eA==" not in message
