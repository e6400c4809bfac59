"""Reaching the API server: the namespace from the parameter, the variable or the kubeconfig
context; one clear line without a kubeconfig; the service account inside a pod; an unreachable
server is retryable and named without its address."""

from __future__ import annotations

from pathlib import Path

import pytest

from tao_data_io.errors import BackendError, UsageError
from tao_data_io.backends.kubernetes.api import connect

from . import kube_cluster
from .kube_cluster import NAMESPACE, make_backend, write_kubeconfig
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


def test_the_namespace_comes_from_the_parameter_the_variable_or_the_context(kube: KubeStandIn,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert connect().namespace == NAMESPACE
    monkeypatch.setenv("TAO_K8S_NAMESPACE", "from-env")
    assert connect().namespace == "from-env" and connect(namespace="given").namespace == "given"
    with pytest.raises(UsageError, match=r"context 'nope' is not in the kubeconfig \(it has \['stand-in'\]\); set "
                                         "TAO_K8S_CONTEXT to one of them"):
        connect(context="nope")
    with pytest.raises(UsageError, match="namespace 'Bad_NS' is not a DNS label"):
        connect(namespace="Bad_NS")


def test_no_kubeconfig_and_no_service_account_is_one_clear_line(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("TAO_K8S_CONTEXT", raising=False)
    with pytest.raises(UsageError, match="no cluster is configured but there is no kubeconfig at .*absent: set "
                                         "KUBECONFIG"):
        make_backend().facts()


def test_the_service_account_is_used_inside_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tao_data_io.backends.kubernetes import api

    (tmp_path / "token").write_text("service-account-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")  # read when a call is made, not here
    (tmp_path / "namespace").write_text("tao-jobs\n")
    for name, file in (("SERVICE_TOKEN_FILENAME", "token"), ("SERVICE_CERT_FILENAME", "ca.crt"),
                       ("SERVICE_ACCOUNT_NAMESPACE", "namespace")):
        monkeypatch.setattr(api, name, str(tmp_path / file) if name != "SERVICE_ACCOUNT_NAMESPACE"
                            else tmp_path / file)
    env = {"KUBECONFIG": str(tmp_path / "absent"), "KUBERNETES_SERVICE_HOST": "10.0.0.1",
           "KUBERNETES_SERVICE_PORT": "443"}
    connection = connect(environ=env)
    assert (connection.namespace, connection.origin) == ("tao-jobs", "the pod's service account")


def test_an_unreachable_api_server_is_retryable_and_names_no_address(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with KubeStandIn() as gone:
        url = gone.url
    write_kubeconfig(tmp_path / "kubeconfig", url)
    before = (tmp_path / "kubeconfig").read_bytes()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    with pytest.raises(BackendError) as info:
        make_backend().facts()
    assert info.value.retryable and "refused the connection" in str(info.value)
    port = url.rsplit(":", 1)[1]
    assert port not in str(info.value) and "127.0.0.1" not in str(info.value) and "t0ken" not in str(info.value)
    assert (tmp_path / "kubeconfig").read_bytes() == before  # never written back
