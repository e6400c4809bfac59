"""The stand-in's authorization: every request is allowed or refused as a real API server's RBAC
authorizer would, from the Role and ClusterRole this project ships.

A real API server turns each request into attributes (k8s.io/apiserver
``pkg/endpoints/request/requestinfo.go``, ``RequestInfoFactory.NewRequestInfo``: the verb from the
method — a GET of a collection is ``list``, ``watch`` with ``?watch=true``, of a name ``get`` —,
the API group, the resource and subresource, the namespace) and the RBAC authorizer
(``plugin/pkg/auth/authorizer/rbac/rbac.go``, ``RuleAllows`` with ``VerbMatches``,
``APIGroupMatches`` and ``ResourceMatches`` of ``pkg/apis/rbac/v1/evaluation_helpers.go``) allows
it when a rule of a Role bound in the request's namespace, or of a ClusterRole bound cluster-wide,
names that verb, group and resource (``resource/subresource`` for a subresource; ``*`` matches
any). Every authenticated identity also has the bootstrap policy's ``system:basic-user`` (create
``selfsubjectaccessreviews``) and ``system:discovery``/``system:public-info-viewer`` (``/version``)
(``plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go``).

The stand-in's caller is the ServiceAccount the shipped bindings name; a test takes a grant away
with :meth:`Authorizer.revoke`, as an admin who edited the Role would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SHIPPED = Path(__file__).resolve().parents[2] / "deployments" / "kubernetes-rbac.yaml"
#: The bootstrap policy's grants to every authenticated identity (bootstrappolicy/policy.go).
_EVERYONE = ({"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews"],
              "verbs": ["create"]},)
_PUBLIC_PATHS = ("/version", "/healthz", "/livez", "/readyz")
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class Attributes:
    """What the authorizer judges: a resource request, or a non-resource ``path``."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    def describe(self) -> str:
        if not self.resource:
            return f'{self.verb} path "{self.path}"'
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        return f'{self.verb} resource "{what}" in API group "{self.group}"' + (
            f' in the namespace "{self.namespace}"' if self.namespace else " at the cluster scope")


def attributes(method: str, path: str, query: str = "") -> Attributes:
    """Request info as NewRequestInfo derives it from ``/api/v1/...`` and ``/apis/GROUP/VERSION/...``."""
    parts = [part for part in path.split("/") if part]
    if not parts or parts[0] not in ("api", "apis") or len(parts) < (2 if parts[0] == "api" else 3):
        return Attributes(verb=method.lower(), path="/" + "/".join(parts))
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) > 2:  # /namespaces/NAME alone is the namespace itself
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return Attributes(verb=method.lower(), path="/" + "/".join(parts))
    named = len(rest) > 1
    verb = _VERBS.get(method)
    if verb is None:
        verb = "get" if named else ("watch" if "watch=true" in query or "watch=1" in query else "list")
    elif verb == "delete" and not named:
        verb = "deletecollection"
    return Attributes(verb=verb, group=group, resource=rest[0], subresource=rest[2] if len(rest) > 2 else "",
                      namespace=namespace, name=rest[1] if named else "")


def _allows(rule: dict[str, Any], asked: Attributes) -> bool:
    """RuleAllows: verb, API group and resource (``resource/subresource`` when there is one)."""
    resource = asked.resource + (f"/{asked.subresource}" if asked.subresource else "")
    return (any(verb in ("*", asked.verb) for verb in rule.get("verbs", []))
            and any(group in ("*", asked.group) for group in rule.get("apiGroups", []))
            and any(name in ("*", resource) or (asked.subresource and name == f"*/{asked.subresource}")
                    for name in rule.get("resources", [])))


@dataclass
class Authorizer:
    """The rules bound to the caller: by namespace (Roles) and everywhere (ClusterRoles)."""

    namespaced: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    cluster: list[dict[str, Any]] = field(default_factory=list)
    #: (verb, group, resource) an admin took away from every rule.
    revoked: set[tuple[str, str, str]] = field(default_factory=set)

    @classmethod
    def shipped(cls, path: Path = SHIPPED) -> Authorizer:
        """The Role and ClusterRole of ``path`` as its RoleBinding and ClusterRoleBinding bind them
        to the ServiceAccount they name (one identity: the file's own)."""
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        roles = {(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]): doc["rules"]
                 for doc in documents if doc["kind"] in ("Role", "ClusterRole")}
        found = cls()
        for binding in (doc for doc in documents if doc["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            ref = binding["roleRef"]
            namespace = binding["metadata"].get("namespace", "")
            rules = roles[ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"]]
            if binding["kind"] == "RoleBinding":  # a ClusterRole bound by a RoleBinding grants in its namespace only
                found.namespaced.setdefault(namespace, []).extend(rules)
            else:
                found.cluster.extend(rules)
        return found

    def revoke(self, verb: str, group: str, resource: str) -> None:
        self.revoked.add((verb, group, resource))

    def allowed(self, asked: Attributes) -> bool:
        if not asked.resource:
            return asked.path.rstrip("/") in _PUBLIC_PATHS
        resource = asked.resource + (f"/{asked.subresource}" if asked.subresource else "")
        if (asked.verb, asked.group, resource) in self.revoked:
            return False
        rules = [*_EVERYONE, *self.cluster, *self.namespaced.get(asked.namespace, [])] if asked.namespace else \
            [*_EVERYONE, *self.cluster]
        return any(_allows(rule, asked) for rule in rules)

    def refusal(self, asked: Attributes, user: str = "system:serviceaccount:tao:tao-data-io") -> str:
        """The 403 message of apiserver ``pkg/endpoints/handlers/responsewriters/errors.go``
        (``forbiddenMessage``) behind ``NewForbidden``'s "<resource> "<name>" is forbidden: "."""
        what = asked.resource + (f"/{asked.subresource}" if asked.subresource else "")
        prefix = f'{what} "{asked.name}" is forbidden' if asked.name else f"{what or 'path'} is forbidden"
        return f'{prefix}: User "{user}" cannot {asked.describe()}'
