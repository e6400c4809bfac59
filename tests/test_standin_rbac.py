"""The stand-in's RBAC (tests/kube/rbac.py) pinned to what upstream does: the request-info
resolver's verbs (k8s.io/apiserver pkg/endpoints/request/requestinfo.go), RuleAllows
(plugin/pkg/auth/authorizer/rbac/rbac.go), the bootstrap policy's grants to everyone, and the
binding of the shipped Role to its namespace only."""

from __future__ import annotations

import pytest

from .kube.rbac import Attributes, Authorizer, attributes


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", "/api/v1/namespaces/tao/pods", "", Attributes("list", "", "pods", namespace="tao")),
    ("GET", "/api/v1/namespaces/tao/pods", "watch=true", Attributes("watch", "", "pods", namespace="tao")),
    ("GET", "/api/v1/namespaces/tao/pods/p", "", Attributes("get", "", "pods", namespace="tao", name="p")),
    ("GET", "/api/v1/namespaces/tao/pods/p/log", "container=c",
     Attributes("get", "", "pods", "log", namespace="tao", name="p")),
    ("POST", "/apis/batch/v1/namespaces/tao/jobs", "dryRun=All", Attributes("create", "batch", "jobs",
                                                                            namespace="tao")),
    ("DELETE", "/apis/batch/v1/namespaces/tao/jobs", "", Attributes("deletecollection", "batch", "jobs",
                                                                   namespace="tao")),
    ("PATCH", "/api/v1/namespaces/tao/secrets/s", "", Attributes("patch", "", "secrets", namespace="tao", name="s")),
    ("GET", "/apis/storage.k8s.io/v1/storageclasses/fast", "", Attributes("get", "storage.k8s.io", "storageclasses",
                                                                          name="fast")),
    ("GET", "/api/v1/nodes", "", Attributes("list", "", "nodes")),
    ("GET", "/version/", "", Attributes("get", path="/version")),
])
def test_request_info_derives_verb_group_resource_and_namespace(method: str, path: str, query: str,
                                                                expected: Attributes) -> None:
    assert attributes(method, path, query) == expected


def test_the_shipped_role_grants_only_in_its_own_namespace() -> None:
    """A Role's rules hold in the namespace of the RoleBinding that binds it, nowhere else."""
    rbac = Authorizer.shipped()
    assert rbac.allowed(Attributes("list", "", "pods", namespace="tao"))
    assert not rbac.allowed(Attributes("list", "", "pods", namespace="other"))
    assert not rbac.allowed(Attributes("list", "", "pods"))  # cluster-wide is not granted


def test_a_subresource_needs_its_own_rule() -> None:
    """ResourceMatches compares ``resource/subresource``: ``pods`` does not grant ``pods/log``."""
    rbac = Authorizer.shipped()
    assert rbac.allowed(Attributes("get", "", "pods", "log", namespace="tao"))
    rbac.revoke("get", "", "pods/log")
    assert not rbac.allowed(Attributes("get", "", "pods", "log", namespace="tao"))


def test_secrets_are_never_listed_and_cluster_facts_are_read_only() -> None:
    rbac = Authorizer.shipped()
    assert not rbac.allowed(Attributes("list", "", "secrets", namespace="tao"))
    assert rbac.allowed(Attributes("list", "", "nodes"))
    assert not rbac.allowed(Attributes("patch", "", "nodes", name="n"))
    assert rbac.allowed(Attributes("get", "storage.k8s.io", "storageclasses", name="fast"))


def test_everyone_may_review_itself_and_read_the_version() -> None:
    """bootstrappolicy/policy.go: system:basic-user (selfsubjectaccessreviews create) and
    system:public-info-viewer (/version) are bound to every authenticated identity."""
    rbac = Authorizer()
    assert rbac.allowed(Attributes("create", "authorization.k8s.io", "selfsubjectaccessreviews"))
    assert rbac.allowed(Attributes("get", path="/version"))
    assert not rbac.allowed(Attributes("get", path="/metrics"))
    assert not rbac.allowed(Attributes("list", "", "pods", namespace="tao"))


def test_a_refusal_reads_as_the_api_servers() -> None:
    """responsewriters/errors.go forbiddenMessage, behind NewForbidden's prefix."""
    said = Authorizer().refusal(Attributes("list", "", "events", namespace="tao"))
    assert said == ('events is forbidden: User "system:serviceaccount:tao:tao-data-io" cannot list resource '
                    '"events" in API group "" in the namespace "tao"')
