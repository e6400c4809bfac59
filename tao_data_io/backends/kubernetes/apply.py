"""Creating a job's objects so that a retry converges: get-or-create by deterministic name,
ownership by label, and ``ownerReferences`` so the Job's TTL takes everything with it.

Why create first and read only on a conflict: on a fresh submit every object is new, so each
costs one request. A 409 is then read back: an object whose labels and annotation both name this
job is one an earlier attempt made (its reply may have been lost) and counts as created. Anyone
else's object is an error naming it — another job's (one an older version named alike, say) by
both jobs' ids — and nothing is deleted: adopting it would hand another job's config or
credentials to this one, and this job's cancel would delete it. A Job that exists must also run
the same pod spec (a digest annotation): a different request under a taken job id is refused
rather than silently answered by the old Job.

The per-job Secret is the only object built here rather than by the renderer, because only it
holds values: they come from the submitting environment, go to the API server and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import BackendError, UsageError
from .api import Api, ApiError
from .render import ATTEMPT_ANNOTATION, JOB_ID_LABEL, MANAGED_BY, STEP_LABEL, RenderedJob

SPEC_DIGEST = "tao-data-io/spec-sha256"
#: What a Secret is given in a server-side dry run: the keys are real, the values are not needed.
DRY_RUN_VALUE = "dry-run"
_ORDER = {"Secret": 0, "ConfigMap": 1, "Service": 2}
#: The API group and resource of each kind the backend creates (what RBAC rules name).
RESOURCES = {"Secret": ("", "secrets"), "ConfigMap": ("", "configmaps"), "Service": ("", "services"),
             "Job": ("batch", "jobs")}


@dataclass(frozen=True)
class Kind:
    """The calls for one kind of object, and its RBAC group and resource."""

    group: str
    resource: str
    create: Callable[..., Any]
    read: Callable[..., Any]
    patch: Callable[..., Any]
    delete: Callable[..., Any]
    list: Callable[..., Any]


def kinds(api: Api) -> dict[str, Kind]:
    core, batch = api.core, api.batch
    calls: dict[str, tuple[Callable[..., Any], ...]] = {
        "Secret": (core.create_namespaced_secret, core.read_namespaced_secret, core.patch_namespaced_secret,
                   core.delete_namespaced_secret, core.list_namespaced_secret),
        "ConfigMap": (core.create_namespaced_config_map, core.read_namespaced_config_map,
                      core.patch_namespaced_config_map, core.delete_namespaced_config_map,
                      core.list_namespaced_config_map),
        "Service": (core.create_namespaced_service, core.read_namespaced_service, core.patch_namespaced_service,
                    core.delete_namespaced_service, core.list_namespaced_service),
        "Job": (batch.create_namespaced_job, batch.read_namespaced_job, batch.patch_namespaced_job,
                batch.delete_namespaced_job, batch.list_namespaced_job),
    }
    return {kind: Kind(*RESOURCES[kind], *methods) for kind, methods in calls.items()}


def describe(obj: Mapping[str, Any]) -> str:
    metadata = obj["metadata"]
    return f"{obj['kind']} {metadata.get('namespace')}/{metadata['name']}"


def step_of(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"].get("labels", {}).get(STEP_LABEL, ""))


def training_job(objects: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "Job" and step_of(o) == "train")


def secret_object(rendered: RenderedJob, values: Mapping[str, str] | None) -> dict[str, Any] | None:
    """The per-job Secret with ``values`` (None: placeholders, for a dry run), labelled like the
    job's other objects; None when the job forwards nothing or reads a pre-created Secret."""
    ref = rendered.secret
    if ref is None or not ref.per_job:
        return None
    template = training_job(rendered.objects)["metadata"]
    data = {key: (values[key] if values is not None else DRY_RUN_VALUE) for key in ref.keys}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": ref.name, "namespace": template["namespace"],
                         "labels": dict(template["labels"]),
                         "annotations": dict(template["annotations"])},
            "stringData": data}


def creation_order(rendered: RenderedJob, secret: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The Secret, the ConfigMap, the Service, the stage Job, the training Job — what a pod
    references exists before the pod — with each Job's pod spec digest as an annotation."""
    objects = ([secret] if secret is not None else []) + [json.loads(json.dumps(o)) for o in rendered.objects]
    for obj in objects:
        if obj["kind"] == "Job":
            obj["metadata"]["annotations"][SPEC_DIGEST] = _digest(obj["spec"])
    return sorted(objects, key=lambda o: _ORDER.get(o["kind"], 3 if step_of(o) == "stage" else 4))


def _digest(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def attempt_of(obj: Mapping[str, Any]) -> int:
    """The attempt of the job that made ``obj`` (1 for an object from before attempts were kept)."""
    text = str(((obj.get("metadata") or {}).get("annotations") or {}).get(ATTEMPT_ANNOTATION, "1"))
    return int(text) if text.isdigit() else 1


def _claims(obj: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the job its ``tao-data-io/job-id`` label names, the job id its annotation names)."""
    metadata = obj.get("metadata") or {}
    return (metadata.get("labels") or {}).get(JOB_ID_LABEL), (metadata.get("annotations") or {}).get(JOB_ID_LABEL)


def _taken(existing: Mapping[str, Any], obj: Mapping[str, Any], job_id: str) -> str | None:
    """Why ``existing``, found under ``obj``'s name, is not an earlier attempt's ``obj`` (None: it is)."""
    labels = (existing.get("metadata") or {}).get("labels") or {}
    label, annotation = _claims(existing)
    ours, _ = _claims(obj)
    managed = all(labels.get(k) == v for k, v in MANAGED_BY.items())
    if managed and (label, annotation) == (ours, job_id):
        return None
    others = [claim for claim, mine in ((annotation, job_id), (label, ours)) if claim not in (None, mine)]
    if not (managed and others):
        return f"is not job {job_id!r}'s (its labels: {labels})"
    return (f"belongs to job {others[0]!r}, not job {job_id!r} "
            f"(its label names {label!r}, its annotation {annotation!r})")


def create(api: Api, obj: dict[str, Any], job_id: str, *, dry_run: bool = False) -> tuple[dict[str, Any], bool]:
    """(the object as the API server has it, whether this call made it); see the module docstring.
    With ``dry_run`` the server validates the create and stores nothing."""
    kind = kinds(api)[obj["kind"]]
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    what = f"{'a dry run of ' if dry_run else ''}creating {describe(obj)}"
    try:
        options: dict[str, Any] = {"dry_run": "All"} if dry_run else {}  # the client method's own keywords
        made: dict[str, Any] = api.call(what, kind.create, namespace, obj, **options)
        return made, True
    except ApiError as exc:
        if exc.status != 409:
            if dry_run and not exc.retryable:  # the object is refused as it is: a retry cannot help
                raise UsageError(str(exc)) from None
            raise
    existing = api.get(f"reading {describe(obj)}", kind.read, name, namespace)
    if existing is None:
        raise BackendError(f"{describe(obj)} was said to exist but cannot be read; try again", retryable=True)
    if attempt_of(existing) < attempt_of(obj):  # an ended earlier attempt's, which the submit replaces
        if dry_run:
            return existing, False
        raise BackendError(f"{describe(obj)} of attempt {attempt_of(existing)} is still being deleted; try again",
                           retryable=True)
    taken = _taken(existing, obj, job_id)
    if taken is not None:
        raise UsageError(f"{describe(obj)} already exists and {taken}; nothing was changed or deleted: remove or "
                         "rename that object, or submit under another job id")
    digest = obj["metadata"].get("annotations", {}).get(SPEC_DIGEST)
    if digest is not None and existing["metadata"].get("annotations", {}).get(SPEC_DIGEST) != digest:
        raise UsageError(f"{describe(obj)} already runs job {job_id!r} with another pod spec (image, command, "
                         "environment or mounts differ from this request's); submit this request under a new job id")
    return existing, False


def adopt(api: Api, obj: Mapping[str, Any], job: Mapping[str, Any]) -> None:
    """Make ``obj`` (as the API server has it) a dependent of the training ``job``, so the Job's
    TTL — or a cancel — deletes it too. A no-op when it already is."""
    uid = job["metadata"]["uid"]
    references = list((obj.get("metadata") or {}).get("ownerReferences") or [])
    if any(ref.get("uid") == uid for ref in references):
        return
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"], "uid": uid}
    kind = kinds(api)[str(obj["kind"])]
    api.call(f"making {describe(obj)} belong to {describe(job)}", kind.patch, obj["metadata"]["name"],
             obj["metadata"]["namespace"], {"metadata": {"ownerReferences": [*references, owner]}})
