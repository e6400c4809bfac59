"""A Kubernetes API server stand-in over real HTTP, for the online backend's tests.

kmock's ``KubernetesEmulator`` (objects in memory behind aiohttp on 127.0.0.1) gives create, get,
list, patch, delete, 404 and 409. :class:`ApiServer` adds what a real API server does and kmock
does not: ``uid``/``resourceVersion``/``creationTimestamp``, label and field selectors,
server-side dry-run (validates a create against what exists, stores nothing), ``/version/``, RBAC
on every request from the shipped Role (:mod:`.kube_rbac`, which answers SelfSubjectAccessReview
too), pod logs as ``text/plain``, and the garbage collector (deleting an object deletes
everything whose ``ownerReferences`` name it). It refuses (422 Invalid, in a dry run too) the names and labels a real API server refuses: see
:func:`invalid`. It can also be told to fail the N-th request from now: a 500 before the request
is applied, or a dropped connection after it was (the reply is lost).

:class:`ControlPlane` plays the Job controller, the scheduler and the kubelet: a created Job gets
its pods (one per completion index), and each time the backend reads a Job its pods move one
step along the Job's script (pulling → staging → verifying → verified → running → …). The verify
container's termination message is built from the checklist in the job's own ConfigMap, so what
the backend parses is what the pod was told to check. No step depends on time.

:class:`KubeStandIn` runs it all on a background event loop, so the synchronous kubernetes client
can call it from the test thread; its methods reach into the server through that loop.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import itertools
import posixpath
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import aiohttp.web
import attrs
import kmock

from tao_data_io.errors import UNWRITABLE_EXIT
from tao_data_io.launch.probe import CheckResult, Verdict
from tao_data_io.staging.writable import unwritable_message

from .kube_kueue import Kueue
from .kube_rbac import Attributes as RbacAttributes
from .kube_rbac import Authorizer
from .kube_rbac import attributes as rbac_attributes
from .kube_volumes import Volume, identity_of, supports_fs_group
from .pod_security import pod_security_violations

T = TypeVar("T")
JOBS = kmock.resource("batch", "v1", "jobs")
PODS = kmock.resource("", "v1", "pods")
RESOURCES = {kind: kmock.resource(*parts) for kind, parts in {
    "Secret": ("", "v1", "secrets"), "ConfigMap": ("", "v1", "configmaps"), "Service": ("", "v1", "services"),
    "Job": ("batch", "v1", "jobs"), "Pod": ("", "v1", "pods"), "Event": ("", "v1", "events"),
    "Node": ("", "v1", "nodes"), "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims"),
    "PersistentVolume": ("", "v1", "persistentvolumes"), "StorageClass": ("storage.k8s.io", "v1", "storageclasses"),
    "CSIDriver": ("storage.k8s.io", "v1", "csidrivers"), "LimitRange": ("", "v1", "limitranges")}.items()}
#: Resource plural → kind, for the kinds the backend creates (what :func:`invalid` checks).
KINDS = {"secrets": "Secret", "configmaps": "ConfigMap", "services": "Service", "jobs": "Job"}
GPU_UNSCHEDULABLE = ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: "
                     "2 No preemption victims found for incoming pod.")


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def version_info(minor: int) -> dict[str, str]:
    """What ``GET /version/`` answers; client 37 refuses a reply without every field."""
    return {"major": "1", "minor": str(minor), "gitVersion": f"v1.{minor}.3", "gitCommit": "0" * 40,
            "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23.4", "compiler": "gc",
            "platform": "linux/amd64"}


def matches(obj: dict[str, Any], labels: str | None, fields: str | None) -> bool:
    """Label selector terms (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``) and field selector terms
    (``a.b=v``, ``a.b!=v``), comma-separated, all of which must hold."""
    have = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in (labels or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            ok = have.get(key) != value
        elif "=" in term:
            key, value = term.split("=", 1)
            ok = have.get(key) == value.lstrip("=")
        else:
            ok = (term[1:] not in have) if term.startswith("!") else term in have
        if not ok:
            return False
    for term in filter(None, (t.strip() for t in (fields or "").split(","))):
        negate = "!=" in term
        path, value = term.split("!=" if negate else "=", 1)
        current: Any = obj
        for part in path.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        if (str(current) == value.lstrip("=")) == negate:
            return False
    return True


# ----------------------------------------------------------------------------- what the API server validates
# The name rules of k8s.io/apimachinery/pkg/util/validation, written out here (the code under test
# has its own): IsDNS1123Label, IsDNS1035Label, IsDNS1123Subdomain, IsValidLabelValue and the name
# part of IsQualifiedName.
_DNS1123_LABEL = (re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"), 63, "a lowercase RFC 1123 label must consist of "
                  "lower case alphanumeric characters or '-', and must start and end with an alphanumeric character")
_DNS1035_LABEL = (re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?"), 63, "a DNS-1035 label must consist of lower case "
                  "alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric "
                  "character")
_DNS1123_SUBDOMAIN = (re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"), 253,
                      "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                      "and must start and end with an alphanumeric character")
_LABEL_VALUE = (re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"), 63, "a valid label must be an empty "
                "string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character")
_QUALIFIED_NAME = (re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"), 63, "name part must consist of "
                   "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")
#: pkg/apis/core/validation: ValidateService names with ValidateServiceName (NameIsDNS1035Label),
#: ValidateConfigMap with ValidateConfigMapName and ValidateSecret with ValidateSecretName
#: (NameIsDNSSubdomain); pkg/apis/batch/validation.ValidateJob with ValidateReplicationControllerName
#: (NameIsDNSSubdomain).
NAME_RULES = {"Service": _DNS1035_LABEL, "ConfigMap": _DNS1123_SUBDOMAIN, "Secret": _DNS1123_SUBDOMAIN,
              "Job": _DNS1123_SUBDOMAIN}


def _broken(value: str, rule: tuple[re.Pattern[str], int, str]) -> str | None:
    pattern, longest, said = rule
    if len(value) > longest:
        return f"must be no more than {longest} characters"
    return None if pattern.fullmatch(value) else said


def _qualified_name(key: str) -> str | None:
    """IsQualifiedName: an optional DNS-1123 subdomain prefix and ``/``, then a name part."""
    prefix, slash, name = key.rpartition("/")
    if slash and (problem := _broken(prefix, _DNS1123_SUBDOMAIN)):
        return f"prefix part {problem}"
    return _broken(name, _QUALIFIED_NAME)


def _labels(labels: dict[str, str], where: str) -> list[str]:
    """apimachinery/pkg/apis/meta/v1/validation.ValidateLabels: qualified keys, valid values."""
    problems = []
    for key, value in labels.items():
        if problem := _qualified_name(key):
            problems.append(f"{where}: Invalid value: {key!r}: {problem}")
        if problem := _broken(str(value), _LABEL_VALUE):
            problems.append(f"{where}: Invalid value: {value!r}: {problem}")
    return problems


def invalid(obj: dict[str, Any]) -> list[str]:
    """Why a real API server refuses to create ``obj`` (empty: it does not) — for what this
    project creates: each kind's name rule (:data:`NAME_RULES`); labels (``ValidateLabels``) and
    annotation keys (apimachinery/pkg/api/validation.ValidateAnnotations); and for a Job what
    pkg/apis/batch/validation.ValidateJob checks after pkg/registry/batch/job/strategy.go's
    generateSelector has labelled the pod template with the Job's name (``job-name`` and
    ``batch.kubernetes.io/job-name``, so the name must be a label value, at most 63 characters):
    the template's labels, its pod's ``subdomain`` and ``hostname`` as DNS-1123 labels
    (pkg/apis/core/validation.ValidatePodSpec), and for an Indexed Job ``<name>-<completions - 1>``,
    the last pod's hostname, as a DNS-1123 label."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name", ""))
    problems = []
    if problem := _broken(name, NAME_RULES[obj["kind"]]):
        problems.append(f"metadata.name: Invalid value: {name!r}: {problem}")
    problems += _labels(metadata.get("labels") or {}, "metadata.labels")
    problems += [f"metadata.annotations: Invalid value: {key!r}: {problem}"
                 for key in metadata.get("annotations") or {} if (problem := _qualified_name(key))]
    if obj["kind"] == "Job":
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        labels = {**(template.get("metadata") or {}).get("labels", {}), "job-name": name,
                  "batch.kubernetes.io/job-name": name}
        problems += _labels(labels, "spec.template.metadata.labels")
        pod = template.get("spec") or {}
        for field_name in ("subdomain", "hostname"):
            if field_name in pod and (problem := _broken(pod[field_name], _DNS1123_LABEL)):
                problems.append(f"spec.template.spec.{field_name}: Invalid value: {pod[field_name]!r}: {problem}")
        if spec.get("completionMode") == "Indexed" and int(spec.get("completions") or 0) > 0:
            last = f"{name}-{int(spec['completions']) - 1}"
            if _broken(last, _DNS1123_LABEL):
                problems.append(f"metadata.name: Invalid value: {name!r}: will not able to create pod with invalid "
                                f"DNS label: {last}")
    return problems


@dataclass
class Fault:
    """Fail the ``at``-th request from now (0: the next one), counting only those that are
    ``request`` (``METHOD /path?query``) when it is given: ``500`` answers an error without
    applying it; ``drop`` applies it and then closes the connection without an answer."""

    at: int
    kind: str
    request: str | None = None
    seen: int = 0
    hit: str | None = None


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    minor: int = 30
    #: RBAC: every request, and every SelfSubjectAccessReview, is judged by the Role and
    #: ClusterRole shipped in deployments/ (:mod:`.kube_rbac`); a test revokes a grant there.
    rbac: Authorizer = attrs.field(factory=Authorizer.shipped)
    fault: Fault | None = None
    #: What an injected 500 says.
    fault_message: str = "injected: etcd timeout"
    #: The Pod Security level the namespaces enforce (``pod-security.kubernetes.io/enforce``):
    #: a pod that breaks it is refused at create, in a dry run too (403), as admission does.
    pod_security: str | None = None
    #: The resources a namespace ResourceQuota constrains (``requests.cpu``, ``limits.memory``):
    #: a pod any of whose containers does not set a cpu or memory one is refused at create, in a
    #: dry run too (403, "must specify"), as quota admission does (enforcePodContainerConstraints).
    quota: set[str] = attrs.field(factory=set)
    #: A ResourceQuota ``compute``'s hard limits and what the namespace uses of them now
    #: (``requests.nvidia.com/gpu``, ``limits.cpu``…): a pod that would take a resource past its
    #: limit is refused at create, in a dry run too (403, "exceeded quota"), as quota admission does.
    quota_hard: dict[str, str] = attrs.field(factory=dict)
    quota_used: dict[str, str] = attrs.field(factory=dict)
    #: Kyverno's "prevent bare pods" policy: a pod no controller owns is refused at create, in a
    #: dry run too (403, the webhook's denial as the API server words it: apiserver
    #: pkg/admission/plugin/webhook/errors ToStatusErr gives a denial without a code 403).
    bare_pods_refused: bool = False
    #: A validating webhook that refuses every pod, with this message (403, as above).
    admission_webhook: str | None = None
    #: Resource plural → why admission refuses a create of it (422, in a dry run too).
    admission: dict[str, str] = attrs.field(factory=dict)
    control: ControlPlane = attrs.field(factory=lambda: ControlPlane())
    #: Kueue, once a test installs it (:mod:`.kube_kueue`): its webhook mutates each Job created
    #: and its controllers look at a Job each time the backend reads it.
    kueue: Kueue | None = None
    #: (namespace, pod, container) → its log.
    logs: dict[tuple[str, str, str], str] = attrs.field(factory=dict)
    #: When each line of a log was written, as the kubelet stamps it (a line is stamped when the
    #: stand-in first serves it; a log that grew gets later stamps for its new lines).
    _log_times: dict[tuple[str, str, str], list[datetime]] = attrs.field(factory=dict)
    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(1000))

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        fault = self._take_fault(request)
        if fault == "500":
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 500,
                                              "reason": "InternalError", "message": self.fault_message},
                                             status=500)
        response = await self._serve(request)
        if fault == "drop":
            transport = request._raw_request.transport if request._raw_request is not None else None
            if transport is not None:
                transport.close()  # applied, but the client never hears so
        return response

    def _take_fault(self, request: kmock.Request) -> str | None:
        fault = self.fault
        said = f"{request.method.value} {request.url.path_qs}"
        if fault is None or fault.request not in (None, said):
            return None
        fault.seen += 1
        if fault.seen - 1 != fault.at:
            return None
        fault.hit = said
        self.fault = None
        return fault.kind

    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.method == kmock.method.GET and request.url.path.rstrip("/") == "/version":
            return aiohttp.web.json_response(version_info(self.minor))
        asked = rbac_attributes(request.method.value, request.url.path, request.url.query_string)
        if not self.rbac.allowed(asked):
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 403,
                                              "reason": "Forbidden", "message": self.rbac.refusal(asked)}, status=403)
        resource = request.resource
        if resource is None:
            return await super()._handle(request)
        if resource.plural == "selfsubjectaccessreviews" and request.action == kmock.action.CREATE:
            review = request.data["spec"]["resourceAttributes"]
            allowed = self.rbac.allowed(RbacAttributes(
                verb=review["verb"], group=review.get("group", ""), resource=review["resource"],
                subresource=review.get("subresource", ""), namespace=review.get("namespace", ""),
                name=review.get("name", "")))
            return aiohttp.web.json_response({**request.data, "status": {
                "allowed": allowed, **({} if allowed else {"reason": "RBAC: no rule allows it"})}}, status=201)
        if request.subresource == "log":
            return self._log(request)
        if request.action == kmock.action.CREATE and resource.plural in KINDS:
            problems = invalid({**request.data, "kind": KINDS[resource.plural]})
            if problems:
                kind, name = KINDS[resource.plural], (request.data.get("metadata") or {}).get("name")
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 422,
                                                  "reason": "Invalid",
                                                  "message": f"{kind} {name!r} is invalid: {'; '.join(problems)}"},
                                                 status=422)
        if request.action == kmock.action.CREATE and resource.plural == "pods":
            invalid_after, forbidden = self._limit_range_defaults(request.namespace or "", request.data)
            name = (request.data.get("metadata") or {}).get("name")
            if forbidden:  # the LimitRanger's own refusal
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 403,
                                                  "reason": "Forbidden",
                                                  "message": f'pods "{name}" is forbidden: [{", ".join(forbidden)}]'},
                                                 status=403)
            if invalid_after:  # validation of the pod as admission defaulted it
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 422,
                                                  "reason": "Invalid",
                                                  "message": f'Pod "{name}" is invalid: {"; ".join(invalid_after)}'},
                                                 status=422)
        if request.action == kmock.action.CREATE and resource.plural == "pods" and self.pod_security:
            violations = pod_security_violations(request.data, self.pod_security)
            if violations:
                name = (request.data.get("metadata") or {}).get("name")
                message = (f'pods "{name}" is forbidden: violates PodSecurity "{self.pod_security}:latest": '
                           + ", ".join(violations))
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                  "code": 403, "reason": "Forbidden", "message": message}, status=403)
        if request.action == kmock.action.CREATE and resource.plural == "pods" and self.quota:
            # Quota admission's podEvaluator.Constraints (pkg/quota/v1/evaluator/core/pods.go):
            # only the quota's cpu and memory names are required (its validationSet), by every
            # container, init containers included (enforcePodContainerConstraints); a bare name
            # and requests.* are looked up in requests, limits.* in limits (podComputeUsageHelper),
            # the requests as the API server's defaulting left them: a limit is a missing request.
            spec = request.data.get("spec") or {}
            required = self.quota & {f"{kind}{what}" for kind in ("", "requests.", "limits.")
                                     for what in ("cpu", "memory")}
            missing: dict[str, list[str]] = {}
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                limits = (c.get("resources") or {}).get("limits") or {}
                has = {"limits": limits, "requests": {**limits, **((c.get("resources") or {}).get("requests") or {})}}
                for need in sorted(required):
                    kind, _, what = need.rpartition(".")
                    if what not in has[kind or "requests"]:
                        missing.setdefault(need, []).append(c["name"])
            if missing:
                name = (request.data.get("metadata") or {}).get("name")
                said = "; ".join(f"{need} for: {','.join(sorted(names))}" for need, names in sorted(missing.items()))
                message = f'pods "{name}" is forbidden: failed quota: compute: must specify {said}'
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                  "code": 403, "reason": "Forbidden", "message": message}, status=403)
        if request.action == kmock.action.CREATE and resource.plural == "pods" and self.quota_hard:
            if exceeded := quota_exceeded(request.data.get("spec") or {}, self.quota_hard, self.quota_used):
                name = (request.data.get("metadata") or {}).get("name")
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                  "code": 403, "reason": "Forbidden",
                                                  "message": f'pods "{name}" is forbidden: {exceeded}'}, status=403)
        if request.action == kmock.action.CREATE and resource == PODS:
            name = (request.data.get("metadata") or {}).get("name")
            owners = [o for o in (request.data.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")]
            denial = (self.admission_webhook if self.admission_webhook else
                      "prevent-bare-pods: bare-pods: Pods must be managed by a controller (a Deployment, a Job…)"
                      if self.bare_pods_refused and not owners else None)
            if denial is not None:
                return aiohttp.web.json_response({
                    "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 403, "reason": "Forbidden",
                    "message": f'admission webhook "validate.kyverno.svc-fail" denied the request: resource '
                               f"Pod/{request.namespace}/{name} was blocked due to the following policies {denial}"},
                    status=403)
        if request.action == kmock.action.CREATE and resource.plural in self.admission:
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 422,
                                              "reason": "Invalid", "message": self.admission[resource.plural]},
                                             status=422)
        if request.action == kmock.action.CREATE and resource == JOBS and self.kueue is not None:
            self.kueue.default(self, request.namespace or "", request.data)  # a mutating webhook: dry runs too
        if request.action == kmock.action.CREATE:
            metadata = request.data.setdefault("metadata", {})
            metadata.setdefault("namespace", request.namespace)
            if request.params.get("dryRun") == "All":
                return await self._dry_run(request)
            metadata.update(uid=hashlib.sha256(f"{metadata.get('name')}{next(self._versions)}".encode()).hexdigest()[:32],
                            creationTimestamp=now(), resourceVersion=str(next(self._versions)))
        elif request.action == kmock.action.UPDATE and isinstance(request.data, dict):
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        elif request.action == kmock.action.FETCH and resource == JOBS and not request.subresource:
            await self.locked(lambda: self.control.advance(self, request.namespace or "", request.name or ""))
        elif request.action == kmock.action.DELETE and resource == PODS and request.name:
            terminating = self._graceful_delete(request)
            if terminating is not None:
                return aiohttp.web.json_response(terminating)
        response = await super()._handle(request)
        if request.action == kmock.action.CREATE and resource == JOBS and response.status < 300:
            await self.locked(lambda: self.control.created(self, request.data))
        elif request.action == kmock.action.DELETE and response.status < 300:
            await self.locked(lambda: self.collect_garbage())
        return response

    def _limit_range_defaults(self, namespace: str, pod: dict[str, Any]) -> tuple[list[str], list[str]]:
        """The LimitRanger admission plugin (plugin/pkg/admission/limitranger): each ``Container``
        item's ``default`` becomes a container's limit and its ``defaultRequest`` (which defaults to
        ``default``, core/v1 SetDefaults_LimitRangeItem) its request, for every resource the
        container leaves unset — mutated before validation, which then refuses a request above its
        limit (pkg/apis/core/validation ValidateResourceRequirements). A dry run answers the
        mutated pod. Returns (what validation then refuses, what the LimitRanger's min and max
        refuse)."""
        spec = pod.get("spec") or {}
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            # First the API server's own defaulting (pkg/apis/core/v1/defaults.go): a resource
            # with a limit and no request is requested at its limit.
            resources = container.get("resources") or {}
            for name, value in (resources.get("limits") or {}).items():
                container.setdefault("resources", {}).setdefault("requests", {}).setdefault(name, value)
        items = [_defaulted_item(item) for limit_range in self.alive("LimitRange", namespace).values()
                 for item in (limit_range.get("spec") or {}).get("limits", []) if item.get("type") == "Container"]
        if not items:
            return [], []
        problems, forbidden = [], []
        for where, containers in (("initContainers", spec.get("initContainers", [])),
                                  ("containers", spec.get("containers", []))):
            for index, container in enumerate(containers):
                resources = container.setdefault("resources", {})
                for item in items:
                    for name, value in item["default"].items():
                        resources.setdefault("limits", {}).setdefault(name, value)
                    for name, value in item["defaultRequest"].items():
                        resources.setdefault("requests", {}).setdefault(name, value)
                for name, asked in (resources.get("requests") or {}).items():
                    limit = (resources.get("limits") or {}).get(name)
                    if limit is not None and _quantity(asked) > _quantity(limit):
                        problems.append(f"spec.{where}[{index}].resources.requests: Invalid value: \"{asked}\": "
                                        f"must be less than or equal to {name} limit of {limit}")
                for item in items:  # then the LimitRanger validates (PodValidateLimitFunc)
                    for name, least in item.get("min", {}).items():
                        asked = (resources.get("requests") or {}).get(name)
                        if asked is None or _quantity(asked) < _quantity(least):
                            forbidden.append(f"minimum {name} usage per Container is {least}, but request is {asked}")
                    for name, most in item.get("max", {}).items():
                        limit = (resources.get("limits") or {}).get(name)
                        if limit is None or _quantity(limit) > _quantity(most):
                            forbidden.append(f"maximum {name} usage per Container is {most}, but limit is {limit}")
        return problems, forbidden

    async def _dry_run(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Validate against what exists (a name that is taken is a 409, as on a real server) and
        answer as a create would, storing nothing."""
        metadata = request.data["metadata"]
        key = (request.resource, request.namespace or metadata.get("namespace"), metadata.get("name"))
        if key in self.objects and not self.objects[key].deleted:
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 409,
                                              "reason": "AlreadyExists",
                                              "message": f"{request.resource.plural} {metadata['name']!r} already exists"},
                                             status=409)
        body = copy.deepcopy(request.data)
        body["metadata"].update(uid="00000000-dry-run", creationTimestamp=now())
        return aiohttp.web.json_response(body, status=201)

    def _log(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        container = request.params.get("container", "")
        key = (request.namespace or "", request.name or "", container)
        if key not in self.logs:
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 400,
                                              "reason": "BadRequest", "message": f'container "{container}" in pod '
                                              f'"{request.name}" is waiting to start: PodInitializing'}, status=400)
        lines = self.logs[key].splitlines(keepends=True)
        times = self._log_times.setdefault(key, [])
        while len(times) < len(lines):  # distinct, increasing stamps, as lines written one after another
            times.append(max(datetime.now(timezone.utc), times[-1] + timedelta(microseconds=1)) if times
                         else datetime.now(timezone.utc))
        stamped = list(zip(times, lines))
        # PodLogOptions (k8s.io/api/core/v1): sinceSeconds keeps lines written that recently,
        # tailLines the last lines, timestamps prefixes each with its RFC 3339 time and a space,
        # limitBytes cuts the answer at that many bytes (mid-line if it falls there). The kubelet
        # (pkg/kubelet/kuberuntime/logs, ReadLogs) seeks the tail first and then skips lines older
        # than since; since the newer lines are a suffix of the log, filtering first is the same.
        since = request.params.get("sinceSeconds")
        if since:
            start = datetime.now(timezone.utc) - timedelta(seconds=int(since))
            stamped = [(when, line) for when, line in stamped if when >= start]
        tail = request.params.get("tailLines")
        if tail:
            stamped = stamped[-int(tail):]
        if request.params.get("timestamps") == "true":
            text = "".join(f"{when.strftime('%Y-%m-%dT%H:%M:%S.%f')}Z {line}" for when, line in stamped)
        else:
            text = "".join(line for _, line in stamped)
        limit = request.params.get("limitBytes")
        body = text.encode()[:int(limit)] if limit else text.encode()
        return aiohttp.web.Response(body=body, content_type="text/plain")

    async def _serve_list(self, request: kmock.Request) -> Any:
        result = await super()._serve_list(request)
        result["items"] = [item for item in result["items"]
                           if matches(item, request.params.get("labelSelector"), request.params.get("fieldSelector"))]
        return result

    async def locked(self, change: Callable[[], None]) -> None:
        async with self._lock:
            change()

    def collect_garbage(self) -> None:
        """Delete every object whose ownerReferences name a uid that no longer exists, until
        nothing changes (pods of a Job, and the Job's Secret, ConfigMap and Service). The garbage
        collector's delete carries no grace period, so a running pod it deletes is given its own
        ``terminationGracePeriodSeconds`` (:meth:`_terminate`) and stays until the kubelet ends it."""
        while True:
            alive = {obj.raw["metadata"].get("uid") for obj in self.objects.values() if not obj.deleted}
            orphans = [obj for obj in self.objects.values() if not obj.deleted
                       and "deletionTimestamp" not in obj.raw["metadata"] and any(
                           ref.get("uid") not in alive for ref in obj.raw["metadata"].get("ownerReferences") or [])]
            if not orphans:
                return
            for obj in orphans:
                if obj.raw.get("kind") != "Pod" or self._terminate(obj, None) == 0:
                    obj.delete()

    def _graceful_delete(self, request: kmock.Request) -> dict[str, Any] | None:
        """A DELETE of a pod that gets a grace period: the pod is marked terminating and returned
        (as the API server answers a graceful delete); None when it is removed at once (or absent)."""
        key = (PODS, request.namespace, request.name)
        obj = self.objects[key] if key in self.objects and not self.objects[key].deleted else None
        if obj is None:
            return None
        asked = request.params.get("gracePeriodSeconds")
        if asked is None and isinstance(request.data, dict):
            asked = request.data.get("gracePeriodSeconds")
        if self._terminate(obj, None if asked is None else int(asked)) == 0:
            return None
        return copy.deepcopy(obj.raw)

    @staticmethod
    def _terminate(obj: Any, asked: int | None) -> int:
        """The grace period a delete gives a pod, as the API server reckons it: the one asked for,
        else the pod's ``terminationGracePeriodSeconds`` (default 30); 0 for a pod no node runs or
        whose phase is terminal (``pkg/registry/core/pod/strategy.go`` CheckGracefulDelete). A pod
        already terminating keeps the shorter of its grace and the new one: a later delete may
        shorten a grace period, never lengthen it (``apiserver/pkg/registry/rest/delete.go``
        BeforeDelete). A pod with a grace left is marked terminating (``deletionTimestamp``,
        ``deletionGracePeriodSeconds``) and stays until :meth:`end_terminating`."""
        raw = obj.raw
        grace = asked if asked is not None else int(raw["spec"].get("terminationGracePeriodSeconds", 30))
        if not raw["spec"].get("nodeName") or raw.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            grace = 0
        metadata = raw["metadata"]
        if "deletionGracePeriodSeconds" in metadata:
            grace = min(grace, int(metadata["deletionGracePeriodSeconds"]))
        if grace > 0:
            obj["metadata"] = {**metadata, "deletionTimestamp": metadata.get("deletionTimestamp") or now(),
                               "deletionGracePeriodSeconds": grace}
        return grace

    def end_terminating(self) -> dict[str, int]:
        """The kubelet ends every terminating pod (its containers were signalled, then killed at
        the end of the grace period): pod name → the grace period it was given."""
        ended = {}
        for (resource, _, name), obj in self.objects.items():
            if resource == PODS and not obj.deleted and "deletionTimestamp" in obj.raw["metadata"]:
                ended[name] = int(obj.raw["metadata"]["deletionGracePeriodSeconds"])
                obj.delete()
        return ended

    def store(self, obj: dict[str, Any], resource: kmock.resource | None = None) -> None:
        """Put an object the way the cluster has it (nodes, claims, a foreign ConfigMap…);
        ``resource``: a kind the core stand-in does not know (Kueue's, :mod:`.kube_kueue`)."""
        metadata = obj["metadata"]
        metadata.setdefault("uid", hashlib.sha256(f"seed-{metadata['name']}".encode()).hexdigest()[:32])
        metadata.setdefault("creationTimestamp", now())
        metadata.setdefault("resourceVersion", str(next(self._versions)))
        self.objects[resource or RESOURCES[obj["kind"]], metadata.get("namespace"), metadata["name"]] = obj

    def alive(self, kind: str, namespace: str | None = None) -> dict[str, dict[str, Any]]:
        """Name → object of every existing object of ``kind`` (in ``namespace``)."""
        return {name: copy.deepcopy(obj.raw) for (resource, ns, name), obj in self.objects.items()
                if resource == RESOURCES[kind] and not obj.deleted and (namespace is None or ns == namespace)}


def _defaulted_item(item: dict[str, Any]) -> dict[str, Any]:
    """A LimitRange item as the API server stores it (core/v1 SetDefaults_LimitRangeItem): a
    resource with a max and no default defaults to the max; one with a default (or else a min)
    and no defaultRequest requests it — resource by resource."""
    default = {**(item.get("max") or {}), **(item.get("default") or {})}
    request = {**(item.get("min") or {}), **default, **(item.get("defaultRequest") or {})}
    return {**item, "default": default, "defaultRequest": request}


_QUANTITY_SUFFIXES = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20,
                      "Gi": 2**30, "Ti": 2**40}


def _quantity(text: str) -> float:
    """A resource quantity's value (k8s.io/apimachinery/pkg/api/resource: decimal and binary SI)."""
    number = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text))
    assert number is not None and number[2] in _QUANTITY_SUFFIXES, text
    return float(number[1]) * _QUANTITY_SUFFIXES[number[2]]


# ----------------------------------------------------------------------------- the control plane
def pod_usage(spec: dict[str, Any], kind: str, what: str) -> float:
    """What a pod counts against a quota's ``kind.what`` (k8s.io/component-helpers resource
    PodRequests/PodLimits, as pods.go's podComputeUsageHelper calls them): its containers' sum,
    native sidecars added, and at least the largest of the other init containers. A limit with
    no request is requested at it (the API server's defaulting)."""
    def amount(container: dict[str, Any]) -> float:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        chosen = limits if kind == "limits" else {**limits, **(resources.get("requests") or {})}
        return _quantity(chosen[what]) if what in chosen else 0.0
    init = spec.get("initContainers", [])
    running = sum(amount(c) for c in [*spec.get("containers", []), *(c for c in init if c.get("restartPolicy") == "Always")])
    return max([running, *(amount(c) for c in init if c.get("restartPolicy") != "Always")])


def quota_exceeded(spec: dict[str, Any], hard: dict[str, str], used: dict[str, str]) -> str | None:
    """Quota admission's refusal of a pod that would take a tracked resource past its limit
    (apiserver pkg/admission/plugin/resourcequota/controller.go, CheckRequest): ``exceeded
    quota: NAME, requested: …, used: …, limited: …``, listing only the exceeded resources, sorted."""
    over = []
    for name in sorted(hard):
        kind, _, what = name.partition(".") if name.startswith(("requests.", "limits.")) else ("requests", "", name)
        asked = pod_usage(spec, kind, what)
        if asked and _quantity(used.get(name, "0")) + asked > _quantity(hard[name]):
            over.append((name, f"{asked:g}", used.get(name, "0"), hard[name]))
    if not over:
        return None
    listed = [",".join(f"{name}={value}" for name, *values in over for value in [values[i]]) for i in range(3)]
    return f"exceeded quota: compute, requested: {listed[0]}, used: {listed[1]}, limited: {listed[2]}"


def _waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def _running() -> dict[str, Any]:
    return {"running": {"startedAt": now()}}


def _terminated(code: int, reason: str, message: str | None = None) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "startedAt": now(), "finishedAt": now(),
                           **({"message": message} if message else {})}}


def kubelet_message(written: str, pod_spec: dict[str, Any]) -> str:
    """What the API server shows of a termination message a container wrote. The kubelet reads
    at most the file's *last* 4096 bytes (``MaxContainerTerminationMessageLength``,
    ``getTerminationMessage`` in pkg/kubelet/kuberuntime/kuberuntime_container.go), then
    ``normalizeStatus`` (pkg/kubelet/status/status_manager.go) keeps the *first*
    ``MaxPodTerminationMessageLogLength`` (12 KiB) / (containers + initContainers) bytes of every
    container's message — a byte cut, which Go's JSON encoding shows as U+FFFD mid-character."""
    containers = len(pod_spec.get("containers", [])) + len(pod_spec.get("initContainers", []))
    return written.encode()[-4096:][:12288 // max(containers, 1)].decode(errors="replace")


#: The annotation the stand-in's Job controller puts on a pod it made to replace a failed one.
REPLACES = "standin.tao-data-io/replaces"


def pod_failure_action(policy: dict[str, Any] | None, pod: dict[str, Any]) -> tuple[str, str]:
    """What the Job controller does with a failed pod, and why (upstream
    ``pkg/controller/job/pod_failure_policy.go``, the API's ``PodFailurePolicy`` documentation):
    the rules in order, the first match wins, and without one the failure is counted. An
    ``onExitCodes`` requirement looks at every terminated container, init containers included —
    those of ``containerName`` only, when it is set — and never at an exit code of 0; an
    ``onPodConditions`` pattern matches a condition of its type and status."""
    status = pod.get("status", {})
    where = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    for position, rule in enumerate((policy or {}).get("rules", [])):
        codes = rule.get("onExitCodes")
        for container in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]:
            terminated = container.get("state", {}).get("terminated")
            if codes is None or not terminated or terminated["exitCode"] == 0:
                continue
            if codes.get("containerName") not in (None, container["name"]):
                continue
            if (terminated["exitCode"] in codes["values"]) == (codes["operator"] == "In"):
                return rule["action"], (f"Container {container['name']} for pod {where} failed with exit code "
                                        f"{terminated['exitCode']} matching {rule['action']} rule at index {position}")
        for pattern in rule.get("onPodConditions") or []:
            if any(c.get("type") == pattern["type"] and c.get("status") == pattern.get("status", "True")
                   for c in status.get("conditions", [])):
                return rule["action"], (f"Pod {where} has condition {pattern['type']} matching {rule['action']} "
                                        f"rule at index {position}")
    return "Count", "no rule matched"


#: Each step: (the container it is about — a name, "first" or "main" —, that container's state,
#: the pod's phase). Containers before it have finished (a native sidecar runs), later ones wait.
STEPS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    "pulling": ("first", lambda c: _waiting("ContainerCreating"), "Pending"),
    "staging": ("stager", lambda c: _running(), "Pending"),
    "verifying": ("verify", lambda c: _running(), "Pending"),
    "image-pull-backoff": ("verify", lambda c: _waiting("ImagePullBackOff", f'Back-off pulling image "{c["image"]}"'),
                           "Pending"),
    "verified": ("main", lambda c: _waiting("ContainerCreating"), "Pending"),
    "running": ("main", lambda c: _running(), "Running"),
    "succeeded": ("main", lambda c: _terminated(0, "Completed"), "Succeeded"),
    "failed": ("main", lambda c: _terminated(2, "Error"), "Failed"),
    "oomkilled": ("main", lambda c: _terminated(137, "OOMKilled"), "Failed"),
    # Evicted (the Eviction API, a drain): the kubelet kills the containers — exit 137 after the
    # grace period — and the pod gets the DisruptionTarget condition (GA in 1.31).
    "disrupted": ("main", lambda c: _terminated(137, "Error"), "Failed"),
    "disrupted-while-staging": ("stager", lambda c: _terminated(137, "Error"), "Failed"),
    # The Eviction API (pkg/registry/core/pod/storage/eviction.go, addConditionAndDeletePod): the
    # DisruptionTarget condition first, then a graceful delete; the kubelet ends the pod over the
    # next looks (ControlPlane._end_gracefully), and only then does the Job controller see it fail.
    "evicting": ("main", lambda c: _running(), "Running"),
    # The kubelet's own evictions for local storage (LOCAL_STORAGE_EVICTIONS): killed at once.
    "results-evicted": ("main", lambda c: _terminated(137, "Error"), "Failed"),
    "storage-evicted": ("main", lambda c: _terminated(137, "Error"), "Failed"),
    # The collective probe's rank stuck in its rendezvous: its own alarm ends it (HANG_EXIT).
    "probe-hang": ("main", lambda c: _terminated(124, "Error"), "Failed"),
    "verify-failed": ("verify", lambda c: _terminated(1, "Error"), "Failed"),
    # Training ended, then the results sidecar's final upload failed (it exits non-zero once the
    # kubelet signals it, pkg/kubelet/kuberuntime: sidecars are stopped after the main containers).
    "upload-failed": ("main", lambda c: _terminated(0, "Completed"), "Failed"),
    "stager-failed": ("stager", lambda c: _terminated(1, "Error", "stage: s3://bkt-1/data/: AccessDenied"), "Failed"),
}
#: What the kubelet's eviction manager says when it evicts a pod for its local storage
#: (pkg/kubelet/eviction/eviction_manager.go: emptyDirLimitEviction, podEphemeralStorageLimitEviction;
#: the messages are helpers.go's emptyDirMessageFmt and podEphemeralStorageMessageFmt): the pod is
#: killed with no grace (its containers exit 137), Failed with reason Evicted — and evictPod is
#: given no condition on this path, so no DisruptionTarget, unlike a node-pressure eviction.
LOCAL_STORAGE_EVICTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "results-evicted": lambda spec: 'Usage of EmptyDir volume "results" exceeds the limit "{}". '.format(
        next(v for v in spec["volumes"] if v["name"] == "results")["emptyDir"].get("sizeLimit")),
    "storage-evicted": lambda spec: "Pod ephemeral local storage usage exceeds the total limit of containers "
                                    f"{spec['containers'][0]['resources']['limits']['ephemeral-storage']}. ",
}
TRAIN_SCRIPT = ["pulling", "staging", "verifying", "verified", "running"]
STAGE_SCRIPT = ["pulling", "running", "succeeded"]
#: The collective probe's pods: they pull the job's image, all-reduce, and end.
PROBE_SCRIPT = ["pulling", "running", "succeeded"]


@dataclass
class ControlPlane:
    #: Job name → the steps its pods take, one each time the Job is read; the last one stays (by
    #: default a stage Job's, ``tao-data-io/step: stage``, or a training Job's).
    scripts: dict[str, list[str]] = field(default_factory=dict)
    #: Container path → why the verify probe fails there.
    verify_failures: dict[str, str] = field(default_factory=dict)
    #: Jobs whose pods the Job controller cannot create (a quota), with the event's message.
    refused: dict[str, str] = field(default_factory=dict)
    unschedulable_message: str = GPU_UNSCHEDULABLE
    #: Whether the scheduler's reason is on the pod's condition too, or only in an event.
    condition_messages: bool = True
    #: Image → the (uid, gid) its containers run as unless the pod says otherwise (else root).
    image_users: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: PersistentVolume name → its filesystem (made when a pod first mounts it; a test may seed
    #: one): see :mod:`.kube_volumes`. A claim without a PersistentVolume is not modelled.
    volumes: dict[str, Volume] = field(default_factory=dict)
    #: Job name → the steps of the pods the Job controller makes to replace failed ones (default:
    #: the first pods' steps, so a failure that is the image's or the data's happens again).
    replacement_scripts: dict[str, list[str]] = field(default_factory=dict)
    _position: dict[str, int] = field(default_factory=dict)
    #: Failed pods the Job controller has handled (replaced, or counted into the Job's failure).
    _handled: set[str] = field(default_factory=set)
    #: Pods deleted because their Job was suspended: never counted, never replaced.
    _uncounted: set[str] = field(default_factory=set)
    #: Pods mounted (fsGroup applied), containers started (subPaths made, a stage's writes done).
    _mounted: set[str] = field(default_factory=set)
    _started: set[tuple[str, str]] = field(default_factory=set)
    #: Pod → why its stage container exited 3 (what ``tao-data-io stage`` printed last: its write probe).
    _refusals: dict[str, str] = field(default_factory=dict)
    _events: itertools.count = field(default_factory=itertools.count)

    def created(self, server: ApiServer, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        if name in self.refused:
            self._event(server, namespace, "Job", meta, "FailedCreate", self.refused[name])
            return
        if job["spec"].get("suspend"):  # no pods until resumed (Kueue's admission, or an operator's patch)
            server.objects[JOBS, namespace, name]["status"] = {"conditions": [
                {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"}]}
            return
        self._start_pods(server, job)

    def _start_pods(self, server: ApiServer, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        for index in range(int(spec.get("completions") or 1)):
            self._new_pod(server, job, index)
        server.objects[JOBS, meta["namespace"], meta["name"]]["status"] = {
            "active": int(spec.get("completions") or 1), "startTime": now()}

    def _new_pod(self, server: ApiServer, job: dict[str, Any], index: int, replacing: str | None = None) -> None:
        meta, spec = job["metadata"], job["spec"]
        name, namespace = meta["name"], meta["namespace"]
        indexed = spec.get("completionMode") == "Indexed"
        suffix = hashlib.sha256(f"{meta['uid']}{index}{replacing or ''}".encode()).hexdigest()[:5]
        pod_name = f"{name}-{index}-{suffix}" if indexed else f"{name}-{suffix}"
        while (PODS, namespace, pod_name) in server.objects:  # never a name used before (a suspended Job's pods)
            suffix = hashlib.sha256(suffix.encode()).hexdigest()[:5]
            pod_name = f"{name}-{index}-{suffix}" if indexed else f"{name}-{suffix}"
        template = copy.deepcopy(spec["template"])
        labels = {**template["metadata"].get("labels", {}), "batch.kubernetes.io/job-name": name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": meta["uid"], "controller-uid": meta["uid"]}
        annotations = {"batch.kubernetes.io/job-completion-index": str(index)} if indexed else {}
        if replacing:
            annotations[REPLACES] = replacing
        server.store({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": pod_name, "namespace": namespace, "labels": labels, "annotations": annotations,
            "creationTimestamp": now(),
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}]},
            "spec": template["spec"], "status": {"phase": "Pending"}})

    def advance(self, server: ApiServer, namespace: str, job: str) -> None:
        """One step for the pods of ``job``, and the Job's status after it. A terminating pod of a
        Job that exists takes a step of its grace (:meth:`_end_gracefully`); one whose Job is gone
        (canceled, its TTL passed) is the kubelet's to end: :meth:`ApiServer.end_terminating`."""
        key = (JOBS, namespace, job)
        if server.kueue is not None:
            server.kueue.reconcile(server, namespace, job)
        found = server.objects[key] if key in server.objects and not server.objects[key].deleted else None
        if found is None:
            return
        for (resource, ns, name), obj in list(server.objects.items()):
            # A pod a suspension stopped has no finalizer left: gone once it has stopped (and was seen so).
            if (resource == PODS and ns == namespace and name in self._uncounted and not obj.deleted
                    and obj.raw["status"].get("phase") in ("Failed", "Succeeded")):
                obj.delete()
        pods = [obj for (resource, ns, _), obj in server.objects.items() if resource == PODS and ns == namespace
                and not obj.deleted and obj.raw["metadata"]["labels"].get("batch.kubernetes.io/job-name") == job
                and "deletionTimestamp" not in obj.raw["metadata"]]
        if found.raw["spec"].get("suspend"):
            # Suspended (again: Kueue took it back): manageJob's deleteJobPods removes each active
            # pod's tracking finalizer, then deletes it with its grace — so it is never counted
            # towards backoffLimit — yet getFailJobMessage still judges every pod that failed by
            # the podFailurePolicy (pkg/controller/job/job_controller.go): a FailJob rule that
            # matches how a stopped pod ended fails the suspended Job.
            for pod in pods:
                self._uncounted.add(pod.raw["metadata"]["name"])
                if server._terminate(pod, None) == 0:
                    pod.delete()
            self._end_gracefully(server, namespace, job)
            self._job_status(server, namespace, job, suspended=True)
            return
        ending = self._end_gracefully(server, namespace, job)
        if not pods:
            if "Suspended" in str(found.raw.get("status")):
                self._start_pods(server, found.raw)  # resumed: the Job controller makes its pods now
            elif ending:
                self._job_status(server, namespace, job)  # it sees the pods that stopped
            return
        step = pods[0].raw["metadata"]["labels"].get("tao-data-io/step")  # the pod template's, as the backend set it
        first = self.scripts.get(job) or {"stage": STAGE_SCRIPT, "probe": PROBE_SCRIPT}.get(step, TRAIN_SCRIPT)
        for pod in pods:
            name = pod.raw["metadata"]["name"]
            replacement = REPLACES in pod.raw["metadata"].get("annotations", {})
            script = self.replacement_scripts.get(job, first) if replacement else first
            position = self._position[name] = min(self._position.get(name, -1) + 1, len(script) - 1)
            self._apply(server, namespace, pod, script[position])
        self._job_status(server, namespace, job)

    # ----------------------------------------------------------------- volumes, as the kubelet has them
    def _volume(self, server: ApiServer, namespace: str, pod_spec: dict[str, Any], name: str) -> Volume | None:
        """The modelled filesystem behind the pod's volume ``name`` (a claim bound to a PersistentVolume)."""
        source = next((v for v in pod_spec.get("volumes", []) if v["name"] == name), {})
        claim_name = (source.get("persistentVolumeClaim") or {}).get("claimName")
        claim = server.alive("PersistentVolumeClaim", namespace).get(claim_name or "") or {}
        pv = server.alive("PersistentVolume").get((claim.get("spec") or {}).get("volumeName") or "")
        if pv is None:
            return None
        volume_name = pv["metadata"]["name"]
        if volume_name not in self.volumes:
            self.volumes[volume_name] = Volume(ownership=supports_fs_group(pv, server.alive("CSIDriver")))
        return self.volumes[volume_name]

    def _mount(self, server: ApiServer, namespace: str, raw: dict[str, Any]) -> None:
        """The kubelet sets a pod's volumes up once, before its first container: fsGroup."""
        name, spec = raw["metadata"]["name"], raw["spec"]
        if name in self._mounted:
            return
        self._mounted.add(name)
        context = spec.get("securityContext") or {}
        for source in spec.get("volumes", []):
            volume = self._volume(server, namespace, spec, source["name"])
            if volume is not None and "fsGroup" in context:
                volume.apply_fs_group(context["fsGroup"], context.get("fsGroupChangePolicy"))

    def _start(self, server: ApiServer, namespace: str, raw: dict[str, Any], container: dict[str, Any]) -> None:
        """A container starts: the kubelet makes its missing subPaths; a stage container makes
        the directories its command names (``--workdir``, the ``--map``'s), as its user may."""
        name, spec = raw["metadata"]["name"], raw["spec"]
        if (name, container["name"]) in self._started:
            return
        self._started.add((name, container["name"]))
        for mount in container.get("volumeMounts", []):
            volume = self._volume(server, namespace, spec, mount["name"])
            if volume is not None and mount.get("subPath"):
                volume.make_subpath(mount["subPath"])
        if container["name"] != "stage":
            return
        command = container.get("command", [])
        wanted = [command[command.index("--workdir") + 1], posixpath.dirname(command[command.index("--map") + 1])]
        who = identity_of(spec, container, self.image_users)
        for path in wanted:
            mount, volume = self._mount_of(server, namespace, spec, container, path)
            if volume is None:
                continue
            inside = posixpath.relpath(path, mount["mountPath"])
            on_volume = posixpath.join(mount.get("subPath", ""), inside)
            refused = volume.make_dirs(on_volume, who)
            if refused is not None:
                blocker = volume.tree[refused]
                what = "the staging root" if path == wanted[0] else "the staging map's directory"
                in_pod = posixpath.join(mount["mountPath"], refused).rstrip("/")
                below = on_volume[len(refused):].lstrip("/").split("/")[0] if on_volume != refused else ""
                self._refusals[name] = "error: " + unwritable_message(
                    what=what, directory=path, blocker=in_pod, missing=f"{in_pod}/{below}" if below else None,
                    owner=(blocker.uid, blocker.gid), mode=stat.S_IMODE(blocker.mode), uid=who.uid,
                    groups=list(dict.fromkeys([who.gid, *sorted(who.groups)]))) + "\n"
                return

    def _mount_of(self, server: ApiServer, namespace: str, spec: dict[str, Any], container: dict[str, Any],
                  path: str) -> tuple[dict[str, Any], Volume | None]:
        """The container's mount ``path`` lies under (the deepest), and its modelled volume."""
        under = [m for m in container.get("volumeMounts", [])
                 if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
        if not under:
            return {}, None
        mount = max(under, key=lambda m: len(m["mountPath"]))
        return mount, self._volume(server, namespace, spec, mount["name"])

    def _apply(self, server: ApiServer, namespace: str, pod: Any, step: str) -> None:
        raw = pod.raw
        name, spec = raw["metadata"]["name"], raw["spec"]
        if step == "unschedulable":
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                         **({"message": self.unschedulable_message} if self.condition_messages else {})}
            pod["status"] = {"phase": "Pending", "conditions": [condition]}
            self._event(server, namespace, "Pod", raw["metadata"], "FailedScheduling", self.unschedulable_message)
            return
        if not spec.get("nodeName"):  # the scheduler binds the pod to a node before anything else
            index = raw["metadata"].get("annotations", {}).get("batch.kubernetes.io/job-completion-index", "0")
            pod["spec"] = spec = {**spec, "nodeName": f"node-{index}"}
        target, state_of, phase = STEPS[step]
        init, main = spec.get("initContainers", []), spec["containers"]
        order = [c["name"] for c in [*init, *main]]
        if target == "first":
            target = order[0]
        if target not in order:  # no stager (tier A), or "main": the next container that is there
            target = "verify" if target == "stager" and "verify" in order else main[0]["name"]
        current = order.index(target)
        verify_at = order.index("verify") if "verify" in order else None
        if verify_at is not None and current > verify_at and not self._verdict(server, namespace, spec).ok:
            # verify.sh exits 1 on a failed verdict: the pod fails there, and no later container starts
            current, phase, state_of = verify_at, "Failed", (lambda c: _terminated(1, "Error"))
        if step != "pulling":
            self._mount(server, namespace, raw)
            for container in [*init, *main][:current + 1]:
                self._start(server, namespace, raw, container)
        if name in self._refusals:  # the stage could not write its volume: it exited 3 at once
            state_of, phase = (lambda c: _terminated(UNWRITABLE_EXIT, "Error", self._refusals[name])), "Failed"
        # verify.sh cuts its verdict to its 4th argument (after /bin/sh and the script), else 4 KiB
        verify_argv = next((c["command"] for c in init if c["name"] == "verify"), [])
        limit = int(verify_argv[5]) if len(verify_argv) > 5 else 4096
        statuses = []
        for position, container in enumerate([*init, *main]):
            sidecar = container.get("restartPolicy") == "Always"
            if position < current:
                state = _running() if sidecar and phase in ("Pending", "Running") else _terminated(
                    0, "Completed",
                    self._verdict(server, namespace, spec).termination_message(limit) if container["name"] == "verify"
                    else None)
            elif position == current:
                state = state_of(container)
                if container["name"] == "verify" and "terminated" in state:
                    state["terminated"]["message"] = self._verdict(server, namespace, spec).termination_message(limit)
            else:
                state = _waiting("PodInitializing")
            statuses.append({"name": container["name"], "image": container["image"], "imageID": "", "ready": False,
                             "restartCount": 0, "started": "running" in state, "state": state})
            self._logs(server, namespace, name, container["name"], state)
            if "message" in state.get("terminated", {}):  # the log has what was written, the status the kubelet's cut
                state["terminated"]["message"] = kubelet_message(state["terminated"]["message"], spec)
        if name in self._refusals:
            server.logs[namespace, name, "stage"] = self._refusals[name]
        if step == "upload-failed":
            for status in statuses:
                if status["name"] == "results":
                    status["state"] = _terminated(1, "Error")
                    server.logs[namespace, name, "results"] = "upload: s3://bkt-1/results/: AccessDenied\n"
        conditions = [{"type": "PodScheduled", "status": "True"}]
        if step.startswith("disrupted") or step == "evicting":
            conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                               "message": "Eviction API: evicting"})
        pod["status"] = {"phase": phase, "conditions": conditions,
                         "initContainerStatuses": statuses[:len(init)], "containerStatuses": statuses[len(init):],
                         **({"reason": "Evicted", "message": LOCAL_STORAGE_EVICTIONS[step](spec)}
                            if step in LOCAL_STORAGE_EVICTIONS else {})}
        if step == "evicting":
            server._terminate(pod, None)

    def _end_gracefully(self, server: ApiServer, namespace: str, job: str) -> bool:
        """The kubelet, one step a look, for each pod of ``job`` deleted with a grace period (an
        eviction, the Job controller ending the pods of a Job that failed): first SIGTERM ends
        the running containers — training exits 143, TRAIN_WRAPPER passes the signal on — while
        native sidecars run on, since the kubelet stops them only after the regular containers
        (KEP-753, pkg/kubelet/kuberuntime/kuberuntime_termination_order.go): the phase stays what
        it was; at the next look the sidecars have ended (the results sidecar's final upload) and
        the pod is Failed. Whether any pod of ``job`` was terminating."""
        found = False
        for (resource, ns, _), obj in server.objects.items():
            if resource != PODS or ns != namespace or obj.deleted:
                continue
            raw = obj.raw
            if ("deletionTimestamp" not in raw["metadata"] or raw["status"].get("phase") in ("Succeeded", "Failed")
                    or raw["metadata"]["labels"].get("batch.kubernetes.io/job-name") != job):
                continue
            found = True
            status = raw["status"]
            init, main = status.get("initContainerStatuses", []), status.get("containerStatuses", [])
            sidecars = {c["name"] for c in raw["spec"].get("initContainers", []) if c.get("restartPolicy") == "Always"}
            signalled = [{**c, "state": _terminated(143, "Error")} if "running" in c["state"]
                         and c["name"] not in sidecars else c for c in [*init, *main]]
            phase = status.get("phase")
            if signalled == [*init, *main]:  # nothing but sidecars left running: they end, and so does the pod
                signalled = [{**c, "state": _terminated(0, "Completed")} if "running" in c["state"] else c
                             for c in signalled]
                phase = "Failed"
            obj["status"] = {**status, "phase": phase, "initContainerStatuses": signalled[:len(init)],
                             "containerStatuses": signalled[len(init):]}
        return found

    def _verdict(self, server: ApiServer, namespace: str, spec: dict[str, Any]) -> Verdict:
        """The verify container's verdict on the checklist in the job's ConfigMap: what a test said
        fails (``verify_failures``), and an input missing from a volume whose contents are modelled."""
        files = next(v["configMap"]["name"] for v in spec["volumes"] if v["name"] == "files")
        checklist = server.objects[RESOURCES["ConfigMap"], namespace, files].raw["data"]["checklist"]
        verify = next(c for c in spec.get("initContainers", []) if c["name"] == "verify")
        results = []
        for line in checklist.splitlines():
            kind, path, _ = line.split("\t")
            failure = self.verify_failures.get(path)
            mount, volume = self._mount_of(server, namespace, spec, verify, path)
            if failure is None and volume is not None and volume.contents and kind != "results-writable":
                on_volume = posixpath.join(mount.get("subPath", ""), posixpath.relpath(path, mount["mountPath"]))
                failure = None if volume.exists(on_volume) else "does not exist"
            results.append(CheckResult(kind=kind, path=path, ok=failure is None, detail=failure or "readable"))  # type: ignore[arg-type]
        return Verdict(ok=not any(not r.ok for r in results), checks=results)

    def _logs(self, server: ApiServer, namespace: str, pod: str, container: str, state: dict[str, Any]) -> None:
        key = (namespace, pod, container)
        if "waiting" in state:
            return
        if container == "verify":
            server.logs[key] = state.get("terminated", {}).get("message") or "TAO-VERIFY probe running\n"
        elif container == "probe":  # what PROBE_PROGRAM prints, as far as its rank got
            code = state.get("terminated", {}).get("exitCode")
            server.logs[key] = {0: "TAO-COLLECTIVE\tok\tnccl\t2\t0.84\n",
                                124: "TAO-COLLECTIVE\thang\trendezvous\tno progress in 180s\n"}.get(code, "")
        elif "terminated" in state and state["terminated"]["reason"] == "OOMKilled":
            server.logs[key] = "epoch 1\nKilled\n"
        elif "terminated" in state and state["terminated"]["exitCode"]:
            server.logs[key] = "epoch 1\nTraceback (most recent call last):\nRuntimeError: loss is nan\n"
        else:
            server.logs[key] = "".join(f"{container} line {i}\n" for i in range(1, 4))

    def _job_status(self, server: ApiServer, namespace: str, name: str, *, suspended: bool = False) -> None:
        """The Job controller's verdict on the Job's pods: each failed pod is handled once, by the
        Job's ``podFailurePolicy`` (:func:`pod_failure_action`); FailJob fails the Job, a counted
        failure beyond ``backoffLimit`` fails it, so does a passed ``activeDeadlineSeconds``, and
        any other failed pod is replaced (upstream ``pkg/controller/job/job_controller.go``: a pod
        of an Indexed Job keeps its index).

        A Job that fails has its active pods deleted, each with its own grace (``deleteActivePods``;
        the kubelet ends them: :meth:`_end_gracefully`). Before 1.31 it is Failed at once. From
        1.31 (kubernetes/kubernetes#125510: ``delayTerminalCondition``, on with JobManagedBy or
        JobPodReplacementPolicy) it gets the interim FailureTarget at once and Failed, with the
        same reason, only once none of its pods is terminating (``enactJobFinished``); a
        FailureTarget once set is the verdict (``newFailedConditionForFailureTarget``). A
        ``suspended`` Job makes no pod, and the pods its suspension deleted count for nothing but
        a FailJob rule."""
        job = server.objects[JOBS, namespace, name]
        spec = job.raw["spec"]
        objs = [obj for (resource, ns, _), obj in server.objects.items() if resource == PODS and ns == namespace
                and not obj.deleted and obj.raw["metadata"]["labels"].get("batch.kubernetes.io/job-name") == name]
        pods = [obj.raw for obj in objs]
        phases = [pod["status"].get("phase") for pod in pods]
        failed = sum(1 for pod in pods if pod["status"].get("phase") == "Failed"
                     and pod["metadata"]["name"] not in self._uncounted)
        succeeded = phases.count("Succeeded")
        status: dict[str, Any] = {"startTime": job.raw.get("status", {}).get("startTime", now())}
        counted = 0
        target = next((c for c in job.raw.get("status", {}).get("conditions", []) if c["type"] == "FailureTarget"),
                      None)
        verdict: tuple[str, str] | None = (target["reason"], target["message"]) if target else None
        for index, pod in enumerate(pods):
            if pod["status"].get("phase") != "Failed":
                continue
            action, why = pod_failure_action(spec.get("podFailurePolicy"), pod)
            if action == "FailJob":
                verdict = verdict or ("PodFailurePolicy", why)
            elif action == "Count" and pod["metadata"]["name"] not in self._uncounted:
                counted += 1
        if verdict is None and counted > int(spec.get("backoffLimit", 6)):
            verdict = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        deadline = spec.get("activeDeadlineSeconds")
        started = datetime.fromisoformat(str(status["startTime"]).replace("Z", "+00:00"))
        if (verdict is None and deadline is not None and not suspended  # pastActiveDeadline: never while suspended
                and (datetime.now(timezone.utc) - started).total_seconds() > deadline):
            verdict = ("DeadlineExceeded", "Job was active longer than specified deadline")
        if verdict is None and not suspended:
            for pod in pods:
                pod_name = pod["metadata"]["name"]
                if (pod["status"].get("phase") == "Failed" and pod_name not in self._handled
                        and pod_name not in self._uncounted):
                    self._handled.add(pod_name)
                    index = int(pod["metadata"].get("annotations", {}).get(
                        "batch.kubernetes.io/job-completion-index", 0))
                    self._new_pod(server, job.raw, index, replacing=pod_name)
        if verdict is not None:
            terminating = self._end_active(server, objs)
            reached = ["FailureTarget", *(["Failed"] if server.minor < 31 or not terminating else [])]
            status.update(failed=failed, conditions=[
                {"type": kind, "status": "True", "reason": verdict[0], "message": verdict[1]} for kind in reached])
        elif suspended:
            status.update(active=0, conditions=[{"type": "Suspended", "status": "True", "reason": "JobSuspended",
                                                 "message": "Job suspended"}])
        elif succeeded == int(spec.get("completions") or 1):
            # Set once, as the Job controller does (a later look at a finished Job changes nothing).
            completed = job.raw.get("status", {}).get("completionTime") or now()
            status.update(succeeded=succeeded, failed=failed, completionTime=completed, conditions=[
                {"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}])
        else:
            # A terminating pod is not active (controller.FilterActivePods).
            active = [pod for pod in pods if "deletionTimestamp" not in pod["metadata"]
                      and pod["status"].get("phase") not in ("Succeeded", "Failed")]
            status.update(active=len(active), ready=phases.count("Running"), **({"failed": failed} if failed else {}))
        job["status"] = status

    @staticmethod
    def _end_active(server: ApiServer, pods: list[Any]) -> int:
        """``deleteActivePods``: each pod of a failed Job that is still active is deleted with its
        own grace period (at once where no node runs it); how many of its pods still terminate."""
        for obj in pods:
            raw = obj.raw
            active = raw["status"].get("phase") not in ("Succeeded", "Failed") and "deletionTimestamp" not in raw["metadata"]
            if active and server._terminate(obj, None) == 0:
                obj.delete()
        return sum(1 for obj in pods if not obj.deleted and "deletionTimestamp" in obj.raw["metadata"]
                   and obj.raw["status"].get("phase") not in ("Succeeded", "Failed"))

    def _event(self, server: ApiServer, namespace: str, kind: str, about: dict[str, Any], reason: str,
               message: str) -> None:
        number = next(self._events)
        server.store({"apiVersion": "v1", "kind": "Event", "metadata": {
            "name": f"{about['name']}.{number:016x}", "namespace": namespace},
            "involvedObject": {"kind": kind, "name": about["name"], "namespace": namespace, "uid": about.get("uid")},
            "reason": reason, "message": message, "type": "Warning", "count": 1, "firstTimestamp": now(),
            "lastTimestamp": now(), "source": {"component": "job-controller" if kind == "Job" else "default-scheduler"}})


# ----------------------------------------------------------------------------- in a thread
class KubeStandIn:
    """:class:`ApiServer` on 127.0.0.1 in a background thread; ``url`` for a kubeconfig."""

    def __init__(self) -> None:
        self.server: ApiServer
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="kube-stand-in", daemon=True)

    def __enter__(self) -> KubeStandIn:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the Kubernetes API stand-in did not start within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        async def serve() -> None:
            self._stop = asyncio.Event()
            async with ApiServer() as handler, kmock.Server(handler, host="127.0.0.1") as server:
                for resource in RESOURCES.values():
                    handler.resources[resource] = {}  # a list of a kind nothing was stored of yet is empty, not 404
                self.server, self.url = handler, str(server.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()

        self._loop.run_until_complete(serve())
        self._loop.close()

    def run(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the server's loop under its lock: the test thread's way to change state."""
        async def locked() -> T:
            async with self.server._lock:
                return work()

        return asyncio.run_coroutine_threadsafe(locked(), self._loop).result(30)

    def requests(self) -> list[str]:
        """``METHOD path?query`` of every request so far."""
        return [f"{r.method.value} {r.url.path_qs}" for r in self.server]
