"""A Kubernetes API server stand-in over real HTTP, for the online backend's tests.

kmock's ``KubernetesEmulator`` (objects in memory behind aiohttp on 127.0.0.1) gives create, get,
list, patch, delete, 404 and 409. :class:`ApiServer` adds what a real API server does and kmock
does not: ``uid``/``resourceVersion``/``creationTimestamp``, label and field selectors,
server-side dry-run (validates a create against what exists, stores nothing), ``/version/``, RBAC
on every request from the shipped Role (:mod:`.rbac`, which answers SelfSubjectAccessReview
too), pod logs as ``text/plain``, graceful deletion, and the garbage collector (deleting an object
deletes everything whose ``ownerReferences`` name it). It refuses what validation refuses
(:mod:`.validation`) and runs admission (:mod:`.admission`, :mod:`.pod_security`, Kueue's
webhook: :mod:`.kueue`). It can also be told to fail the N-th request from now: a 500 before the
request is applied, or a dropped connection after it was (the reply is lost).

Behind it, :class:`.control_plane.ControlPlane` plays the Job controller, the scheduler and the
kubelet. :class:`KubeStandIn` runs it all on a background event loop, so the synchronous
kubernetes client can call it from the test thread; its methods reach into the server through
that loop.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import aiohttp.web
import attrs
import kmock

from .admission import limit_range_defaults, missing_constraints, quota_exceeded
from .control_plane import ControlPlane
from .kueue import Kueue
from .objects import JOBS, KINDS, PODS, RESOURCES, now
from .pod_security import pod_security_violations
from .rbac import Attributes as RbacAttributes
from .rbac import Authorizer
from .rbac import attributes as rbac_attributes
from .validation import invalid

T = TypeVar("T")


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
    #: ClusterRole shipped in deployments/ (:mod:`.rbac`); a test revokes a grant there.
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
    #: Kueue, once a test installs it (:mod:`.kueue`): its webhook mutates each Job created
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
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                  "code": 422, "reason": "Invalid",
                                                  "message": f"{kind} {name!r} is invalid: {'; '.join(problems)}"},
                                                 status=422)
        if request.action == kmock.action.CREATE and resource.plural == "pods":
            invalid_after, forbidden = limit_range_defaults(
                request.data, list(self.alive("LimitRange", request.namespace or "").values()))
            name = (request.data.get("metadata") or {}).get("name")
            if forbidden:  # the LimitRanger's own refusal
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                  "code": 403, "reason": "Forbidden",
                                                  "message": f'pods "{name}" is forbidden: [{", ".join(forbidden)}]'},
                                                 status=403)
            if invalid_after:  # validation of the pod as admission defaulted it
                return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                  "code": 422, "reason": "Invalid",
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
            if missing := missing_constraints(request.data.get("spec") or {}, self.quota):
                name = (request.data.get("metadata") or {}).get("name")
                message = f'pods "{name}" is forbidden: failed quota: compute: must specify {missing}'
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
            owners = [o for o in (request.data.get("metadata") or {}).get("ownerReferences") or []
                      if o.get("controller")]
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

    async def _dry_run(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Validate against what exists (a name that is taken is a 409, as on a real server) and
        answer as a create would, storing nothing."""
        metadata = request.data["metadata"]
        key = (request.resource, request.namespace or metadata.get("namespace"), metadata.get("name"))
        if key in self.objects and not self.objects[key].deleted:
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 409,
                                              "reason": "AlreadyExists",
                                              "message": f"{request.resource.plural} {metadata['name']!r} "
                                                         "already exists"},
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
        ``resource``: a kind the core stand-in does not know (Kueue's, :mod:`.kueue`)."""
        metadata = obj["metadata"]
        metadata.setdefault("uid", hashlib.sha256(f"seed-{metadata['name']}".encode()).hexdigest()[:32])
        metadata.setdefault("creationTimestamp", now())
        metadata.setdefault("resourceVersion", str(next(self._versions)))
        self.objects[resource or RESOURCES[obj["kind"]], metadata.get("namespace"), metadata["name"]] = obj

    def alive(self, kind: str, namespace: str | None = None) -> dict[str, dict[str, Any]]:
        """Name → object of every existing object of ``kind`` (in ``namespace``)."""
        return {name: copy.deepcopy(obj.raw) for (resource, ns, name), obj in self.objects.items()
                if resource == RESOURCES[kind] and not obj.deleted and (namespace is None or ns == namespace)}


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
