"""The Kubernetes backend: a TAO job as a Kubernetes Job, launched against a real API server.

What each step does (the modules beside this one do the work):

* ``facts`` — the claims, StorageClasses, server version and GPUs per node (:mod:`.facts`);
* ``preflight`` — the gates, all before anything exists (:mod:`.gates`);
* ``submit`` — the per-job Secret (values from the submitting environment, sent only to the API
  server), the ConfigMap, the Service, tier B's stage Job (waited on), the training Job; then
  the Job owns the others, so its TTL deletes them too (:mod:`.apply`). A retry converges;
* ``verify`` — the verify initContainer's termination message, parsed into the verdict; a failed
  verdict deletes the Job, freeing its GPUs (:mod:`.waiting`);
* ``status``, ``failure_analysis`` — the status table of docs/kubernetes.md and TAO's error classes, from
  the Job, its pods and their events (:mod:`.pods`);
* ``logs`` — every pod's log by label, prefixed by rank for a multi-node job; a failed init
  container's log (the verify probe's, the stager's) when that is where the pod stopped;
* ``cancel`` — a foreground delete of everything the job's labels name.

``backend_ref`` is ``<namespace>/<Job name>``; every call after submit works from it alone, so
any process with access to the namespace can follow a job. Results leave through the pod's
upload sidecar or stay on the claim: ``results_path`` is None.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import datetime, timezone
from typing import Any

from ...credentials import forwarded_values
from ...errors import UsageError, is_retryable
from ...launch.backend import (DEFAULT_VERIFY_TIMEOUT_S, FOLLOW_BYTES, FailureAnalysis, JobDocuments, JobStatus,
                               LogChunk, Submission, Waits)
from ...launch.plan import LaunchPlan
from ...launch.probe import Verdict, read_checklist
from ...launch.training import STATUS_TAIL_BYTES
from .names import check_ref, object_names
from ...vocabulary import TERMINAL_STATES
from ...tier import ClusterFacts
from . import pods as pod_reading
from . import DECLARATION
from .api import Api, ApiError, connect
from .apply import adopt, attempt_of, create, creation_order, kinds, secret_object, step_of, training_job
from .facts import SIDECAR_VERSION, cluster_facts, server_version
from .follow import FIRST_LINES, LOOK_LINES, new_lines, read_cursor, since_seconds
from .gates import (admit_pods, check_access, check_claim, check_gpus, check_secrets, check_version, dry_run,
                    needed_access, node_list)
from .kueue import check_queue, held, hold_text
from .render import (CACHE_LABEL, COLLECTIVE_TIMEOUT_S, JOB_ID_LABEL, MANAGED_BY, VOLUME_ROOT, RenderedJob,
                     claim_paths, probe_key, probes_collectives, read_config, render_job, stager_in_pod)
from .settings import KubernetesSettings
from .waiting import (PROBE_GRACE_S, PodWatch, StageFailed, WaitBudget, list_pods, wait_for_probe, wait_for_stage,
                      wait_for_verdict)

log = logging.getLogger(__name__)
#: A first pull of a TAO image (tens of GB) takes minutes; a wrong name shows as ImagePullBackOff
#: in the progress messages long before this.
DEFAULT_IMAGE_PULL_TIMEOUT_S = 1800.0
#: The longest pause between two looks at a Job's pods while waiting (the first is shorter).
POD_POLL_SECONDS = 2.0
#: The status sidecar's lines read per look: TAO writes a line per epoch (and a few more), each
#: well under 512 bytes, so this many fit the byte cap — which the kubelet applies from the
#: start of the window, so the window must not be wider than the cap.
STATUS_LINES = STATUS_TAIL_BYTES // 512
#: What cancel deletes, in this order: the Jobs first (their pods hold the GPUs).
_CANCEL_ORDER = ("Job", "Service", "ConfigMap", "Secret")
#: A pod's terminationGracePeriodSeconds when its spec leaves it out (core/v1 defaults).
POD_DEFAULT_GRACE_SECONDS = 30


class KubernetesBackend:
    name = KubernetesSettings.name
    capabilities = DECLARATION.capabilities

    def __init__(self, settings: KubernetesSettings, *, kubeconfig: str | None = None,
                 verify_timeout: float = DEFAULT_VERIFY_TIMEOUT_S,
                 image_pull_timeout: float = DEFAULT_IMAGE_PULL_TIMEOUT_S, pod_poll_seconds: float = POD_POLL_SECONDS,
                 say: Callable[[str], None] | None = None) -> None:
        """``settings`` are what the job record keeps; the keyword arguments belong to this process
        only: a kubeconfig path (of this machine, never recorded), the budgets of the waits submit
        makes itself (a tier B stage Job, the collective probe; :meth:`verify` is given its own),
        the pause between looks at pods, and where progress messages go."""
        for what, value in (("verify_timeout", verify_timeout), ("image_pull_timeout", image_pull_timeout),
                            ("pod_poll_seconds", pod_poll_seconds)):
            if not value > 0:
                raise UsageError(f"{what} {value!r} must be a positive number of seconds")
        self.settings = settings
        self.kubeconfig = kubeconfig
        self.verify_timeout, self.image_pull_timeout = verify_timeout, image_pull_timeout
        self.pod_poll_seconds = pod_poll_seconds
        self.say = say or log.info
        self._connected: Api | None = None

    def config(self) -> dict[str, Any]:
        """The settings a later verb rebuilds this backend from, as given (an empty namespace is
        found again the same way); the kubeconfig, and any path to it, stay on this machine."""
        return self.settings.model_dump(mode="json")

    def _budget(self, verify_timeout: float) -> WaitBudget:
        return WaitBudget(verify_timeout, self.image_pull_timeout, self.settings.schedule_timeout)

    # ------------------------------------------------------------------ before
    def facts(self) -> ClusterFacts:
        return cluster_facts(self._api())

    def preflight(self, plan: LaunchPlan, *, documents: JobDocuments | None = None) -> None:
        """The gates of :mod:`.gates`, in order; the per-job Secret is dry-run with placeholder
        values (no credential is read before submit)."""
        api = self._api()
        rendered, settings = self._render(plan, documents, None)
        objects = creation_order(rendered, secret_object(rendered, None))
        nodes = node_list(api)
        warnings = check_gpus(nodes, plan, settings)
        warnings += check_version(api, plan, training_job(objects), settings, nodes)
        if settings.queue_name is not None:
            warnings += check_queue(api, settings.queue_name, training_job(objects)["spec"]["template"])
        given_secret = rendered.secret is not None and not rendered.secret.per_job
        reads_secrets = bool(settings.image_pull_secrets) or given_secret
        check_access(api, needed_access(objects, reads_secrets, queued=settings.queue_name is not None))
        check_claim(api, plan, settings)
        check_secrets(api, settings, rendered.secret)
        dry_run(api, objects, plan.job_id)
        for warning in [*warnings, *admit_pods(api, objects)]:
            self.say(f"warning: {warning}")

    def waits(self, plan: LaunchPlan) -> Waits:
        """``submit``: tier B's stage Job moves the inputs for as long as they take (no bound of
        time: it ends when its transfer does); else a multi-node job's collective probe (one
        budget's patience, then the probe's own alarm); else nothing. ``verify``: one budget's
        patience (admission, a node, the pulls, the probe: :class:`.waiting.WaitBudget`) — no bound
        of time when the pods' stager runs first, since its transfers are not timed either."""
        submit: float | None = 0.0
        if plan.tier == "B":
            submit = None
        elif probes_collectives(plan, self.settings):
            submit = self._budget(self.verify_timeout).most + COLLECTIVE_TIMEOUT_S + PROBE_GRACE_S
        # verify's own budget is the protocol's default timeout, which the verify step passes
        verify = None if stager_in_pod(plan) else self._budget(DEFAULT_VERIFY_TIMEOUT_S).most
        return Waits(submit=submit, verify=verify)

    # ------------------------------------------------------------------ submit
    def submit(self, plan: LaunchPlan, *, environ: Mapping[str, str] | None = None,
               documents: JobDocuments | None = None) -> Submission:
        api = self._api()
        rendered, _ = self._render(plan, documents, environ)
        per_job = rendered.secret is not None and rendered.secret.per_job
        values = forwarded_values(plan.forward_env, environ) if per_job else None  # a missing one: nothing made
        api.masking(values or {})
        objects = creation_order(rendered, secret_object(rendered, values))
        job = training_job(objects)
        name = job["metadata"]["name"]
        self._replace_earlier_attempt(api, name, plan)
        made: list[dict[str, Any]] = []
        started = False
        try:
            for obj in objects:
                if step_of(obj) == "stage" and obj["kind"] == "Job":
                    self._stage(api, obj, job, plan.job_id)
                    continue
                if step_of(obj) == "probe":
                    if obj["kind"] == "Job":
                        self._probe([o for o in objects if step_of(o) == "probe"], job, plan.job_id)
                    continue
                found, created = create(api, obj, plan.job_id)
                if obj is job:
                    job, started = found, created
                else:
                    made.append(found)
        except Exception as exc:
            # Refused for good before the training Job exists (a failed stage Job, bad input): no
            # Job owns what this job has here yet, so nothing would ever remove it — above all the
            # per-job Secret of credential values. A retryable fault keeps it for the retry.
            if not is_retryable(exc):
                with suppress(Exception):  # the submit's own error is the one to report; cancel cleans later
                    if self._get_job(api, api.namespace, name) is None:
                        self._delete_labelled(api, api.namespace, name, f"what submit made for {name}")
            raise
        for dependent in made:
            adopt(api, dependent, job)
        restored = (None if plan.restore_from is None else
                    f"{plan.restore_from} into {plan.results_dir}, by rank 0's stager before the command starts")
        return Submission(backend_ref=f"{api.namespace}/{name}", started=started, restored=restored)

    def _replace_earlier_attempt(self, api: Api, name: str, plan: LaunchPlan) -> None:
        """Delete an ended earlier attempt's objects (a Job cannot start again, and a finished
        one is kept for its TTL) before this attempt makes its own under the same names; a
        running one is refused. A delete the cluster has not finished makes the create that
        follows retryable (:func:`.apply.create`)."""
        if plan.attempt == 1:
            return  # nothing before it: no request spent
        earlier = self._get_job(api, api.namespace, name)
        if earlier is None:
            return
        attempt = attempt_of(earlier)
        if attempt >= plan.attempt:
            return
        if self.status(f"{api.namespace}/{name}").state not in TERMINAL_STATES:
            raise UsageError(f"attempt {attempt} of job {plan.job_id} still runs as {api.namespace}/{name}; cancel it "
                             f"before launching attempt {plan.attempt}")
        self._delete_labelled(api, api.namespace, name, f"attempt {attempt} of {api.namespace}/{name}")

    def _probe(self, probe: list[dict[str, Any]], job: dict[str, Any], job_id: str) -> None:
        """A multi-node GPU job: the collective probe runs to its end before the training Job
        exists (no GPU of the job is held meanwhile), then its objects are deleted; a hang or a
        failure refuses the submit with the NCCL settings to try. A pass is remembered in a
        ConfigMap of its own per image, node placement and NCCL settings, so later jobs there skip
        it (a retried submit whose training Job exists skips it too)."""
        api = self._api()
        namespace = api.namespace
        if self._get_job(api, namespace, job["metadata"]["name"]) is not None:
            return
        service, probe_job = (next(o for o in probe if o["kind"] == kind) for kind in ("Service", "Job"))
        remembered = f"tao-data-io-probe-{probe_key(probe_job)}"
        if api.get(f"reading ConfigMap {namespace}/{remembered}", api.core.read_namespaced_config_map, remembered,
                   namespace) is not None:
            self.say(f"the collective probe passed before for this image and placement ({remembered}): skipped")
            return
        name = probe_job["metadata"]["name"]
        try:
            create(api, service, job_id)
            create(api, probe_job, job_id)
            watch = PodWatch(api, namespace, name, job["metadata"]["name"], "probe",
                             self._budget(self.verify_timeout), self.say, self.pod_poll_seconds)
            verdicts = wait_for_probe(watch, self._probe_log, COLLECTIVE_TIMEOUT_S)
        finally:
            self._delete_job(api, namespace, name)
            api.delete(f"deleting Service {namespace}/{service['metadata']['name']}",
                       api.core.delete_namespaced_service, service["metadata"]["name"], namespace)
        failed = [verdict for verdict in verdicts if not verdict.ok]
        if failed:
            raise UsageError(f"the collective probe of {namespace}/{name} failed, so the training Job was not made: "
                             f"{failed[0].describe()}")
        self.say(f"the collective probe passed: {verdicts[0].detail}")
        pod = probe_job["spec"]["template"]["spec"]
        labels = {**MANAGED_BY, CACHE_LABEL: "collective-probe"}
        cached = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": remembered, "namespace": namespace, "labels": labels},
                  "data": {"passed": verdicts[0].detail, "image": pod["containers"][0]["image"]}}
        try:  # no job's label: a cancel keeps it; two jobs passing at once make it once
            api.call(f"creating ConfigMap {namespace}/{remembered}", api.core.create_namespaced_config_map, namespace,
                     cached)
        except ApiError as exc:
            if exc.status != 409:
                raise

    def _probe_log(self, pod: Mapping[str, Any]) -> str:
        api = self._api()
        return str(api.call(f"reading the log of pod {api.namespace}/{pod['metadata']['name']}",
                            api.core.read_namespaced_pod_log, pod["metadata"]["name"], api.namespace, container="probe",
                            text=True))

    def _stage(self, api: Api, stage: dict[str, Any], job: dict[str, Any], job_id: str) -> None:
        """Tier B: run the stage Job to completion before the training Job exists (no GPU is held
        meanwhile) — unless a training Job of this job already exists (a retried submit). A stage
        Job that failed is deleted, so the next submit stages again."""
        namespace = api.namespace
        if self._get_job(api, namespace, job["metadata"]["name"]) is not None:
            return
        create(api, stage, job_id)
        name = stage["metadata"]["name"]
        watch = PodWatch(api, namespace, name, job["metadata"]["name"], "stage",
                         self._budget(self.verify_timeout), self.say, self.pod_poll_seconds)
        try:
            wait_for_stage(watch)
        except StageFailed as exc:
            self._delete_job(api, namespace, name)
            claim = next(v["persistentVolumeClaim"]["claimName"] for v in stage["spec"]["template"]["spec"]["volumes"]
                         if "persistentVolumeClaim" in v)
            raise StageFailed(f"{exc} (the stage pod mounts claim {claim!r} at {VOLUME_ROOT}); the stage Job was "
                              "deleted, so the next submit stages again") from None

    # ------------------------------------------------------------------ follow
    def verify(self, ref: str, plan: LaunchPlan, *, timeout: float = DEFAULT_VERIFY_TIMEOUT_S) -> Verdict:
        """Wait for every rank's verdict (see :mod:`.waiting` for the two budgets: ``timeout`` is
        the verify one). Any failed verdict deletes the Job: the command never started, and the
        GPUs are freed."""
        namespace, name = self._ref(ref)
        api = self._api()
        files = object_names(plan.job_id).files
        configmap = api.get(f"reading ConfigMap {namespace}/{files}", api.core.read_namespaced_config_map, files,
                            namespace)
        if configmap is None:
            verdict = Verdict(ok=False, error=f"ConfigMap {namespace}/{files}, which holds the checklist, is gone")
        else:
            checks = read_checklist((configmap.get("data") or {}).get("checklist", ""), plan, claim_paths(plan))
            watch = PodWatch(api, namespace, name, name, "train", self._budget(timeout), self.say,
                             self.pod_poll_seconds, queued=self.settings.queue_name is not None)
            verdict = wait_for_verdict(watch, plan.nodes, checks)
        if not verdict.ok and self._delete_job(api, namespace, name):
            self.say(f"{namespace}/{name}: verify failed; the Job was deleted, which frees its GPUs")
        return verdict

    def status(self, ref: str) -> JobStatus:
        namespace, name = self._ref(ref)
        api = self._api()
        job = self._get_job(api, namespace, name)
        if job is None:
            return JobStatus(state="UNKNOWN", message=f"Job {ref} does not exist (its TTL deletes it after it ends, "
                                                      "and cancel deletes it); the job record says how it ended")
        if held(job) and not job["metadata"].get("deletionTimestamp") and not any(
                pod_reading.condition(job, kind) for kind in ("Complete", "Failed", "FailureTarget")):
            # Kueue holds it — not admitted yet, or taken back (preempted, evicted): the pods it
            # had are the Job controller's to delete, and the job is queued again, not ended.
            return JobStatus(state="PENDING", message=hold_text(api, job, queued=self.settings.queue_name is not None))
        found = list_pods(api, namespace, name, "train")
        return pod_reading.job_status(job, found, self._events(api, namespace, job, found))

    def failure_analysis(self, ref: str) -> FailureAnalysis | None:
        namespace, name = self._ref(ref)
        api = self._api()
        job = self._get_job(api, namespace, name)
        if job is None:
            return None
        return pod_reading.failure_analysis(job, list_pods(api, namespace, name, "train"))

    def logs(self, ref: str, tail: int | None = None) -> str:
        """Each pod's log (``tail`` lines each), rank by rank; ``[rank N]`` before every line of a
        multi-node job. A pod that stopped in an init container before training started (the
        probe, the stager) gives that container's log; one whose containers have not started
        gives none. Native sidecars are init containers too, and one that ended non-zero (a failed
        final upload, one killed at the end of its grace) never hides training's log."""
        namespace, name = self._ref(ref)
        api = self._api()
        found = list_pods(api, namespace, name, "train")
        indexed = any(pod_reading.COMPLETION_INDEX in (p["metadata"].get("annotations") or {}) for p in found)
        parts = []
        for pod in found:
            every = pod_reading.containers(pod)
            trained = any(c.name == pod_reading.TRAIN and c.state in ("running", "terminated") for c in every)
            stopped = None if trained else next((c for c in every if c.init and not c.sidecar
                                                 and c.state == "terminated" and c.exit_code), None)
            container = stopped.name if stopped else pod_reading.TRAIN
            try:
                text = api.call(f"reading the log of {container} in pod {namespace}/{pod['metadata']['name']}",
                                api.core.read_namespaced_pod_log, pod["metadata"]["name"], namespace,
                                container=container, text=True, **({"tail_lines": tail} if tail else {}))
            except ApiError as exc:
                if exc.status in (400, 404):  # not started yet, or already gone
                    continue
                raise
            prefix = f"[rank {pod_reading.rank(pod)}] " if indexed else ""
            parts += [prefix + line + "\n" for line in text.splitlines()]
        return "".join(parts)

    def follow_logs(self, ref: str, cursor: str | None) -> LogChunk:
        """What each training pod printed since ``cursor`` (the newest time shown per pod; see
        :mod:`.follow`), ``[rank N]`` before every line of a multi-node job. A pod whose
        container has not started yet, or is gone, gives nothing this time."""
        namespace, name = self._ref(ref)
        api = self._api()
        shown = read_cursor(cursor)
        found = list_pods(api, namespace, name, "train")
        indexed = any(pod_reading.COMPLETION_INDEX in (p["metadata"].get("annotations") or {}) for p in found)
        now = datetime.now(timezone.utc)
        parts: list[str] = []
        for pod in found:
            pod_name = pod["metadata"]["name"]
            last = shown.get(pod_name)
            since = since_seconds(last, now)
            window = ({"since_seconds": since, "tail_lines": LOOK_LINES} if since is not None
                      else {"tail_lines": FIRST_LINES})
            try:
                text = api.call(f"following the log of pod {namespace}/{pod_name}", api.core.read_namespaced_pod_log,
                                pod_name, namespace, container=pod_reading.TRAIN, text=True, timestamps=True,
                                limit_bytes=FOLLOW_BYTES, **window)
            except ApiError as exc:
                if exc.status in (400, 404):  # not started yet, or already gone
                    continue
                raise
            lines, newest = new_lines(text, last, limit=FOLLOW_BYTES)
            if newest is not None:
                shown[pod_name] = newest
            prefix = f"[rank {pod_reading.rank(pod)}] " if indexed else ""
            parts += [prefix + line + "\n" for line in lines]
        return LogChunk(text="".join(parts), cursor=json.dumps(shown, sort_keys=True))

    def training_status(self, ref: str) -> bytes | None:
        """The end of what rank 0's status sidecar has printed: ``status.json`` lives in the pod
        (or on a claim) where this process cannot read it, and the sidecar follows it into its log
        (:data:`tao_data_io.launch.agents.STATUS_SCRIPT`). The newest :data:`STATUS_LINES` lines, at most
        :data:`~tao_data_io.launch.training.STATUS_TAIL_BYTES`; None while there is no pod, or its
        sidecar has not started (or is gone with the pod)."""
        namespace, name = self._ref(ref)
        api = self._api()
        found = [pod for pod in list_pods(api, namespace, name, "train") if pod_reading.rank(pod) == 0]
        if not found:
            return None
        pod_name = found[0]["metadata"]["name"]
        try:
            text = api.call(f"reading the training status of pod {namespace}/{pod_name}",
                            api.core.read_namespaced_pod_log, pod_name, namespace, container=pod_reading.STATUS,
                            text=True, tail_lines=STATUS_LINES, limit_bytes=STATUS_TAIL_BYTES)
        except ApiError as exc:
            if exc.status in (400, 404):
                return None
            raise
        return text.encode() or None

    def cancel(self, ref: str) -> bool:
        """Foreground delete of every object labelled with the job (the Jobs first; a pre-created
        credential Secret carries no such label and is kept), then of its pods with the cancel's
        grace (:meth:`_end_pods`); True if the training Job was still running. A Job that has
        finished is kept whole: its pods have ended, collect reads its logs, and its TTL removes it."""
        namespace, name = self._ref(ref)
        api = self._api()
        job = self._get_job(api, namespace, name)
        if job is not None and any(pod_reading.condition(job, c) for c in ("Complete", "Failed")):
            return False
        self._delete_labelled(api, namespace, name, ref)
        self._end_pods(api, namespace, name)
        return job is not None

    def _end_pods(self, api: Api, namespace: str, name: str) -> None:
        """Delete the job's pods with ``cancel_grace_seconds``. The garbage collector deletes a
        Job's pods with no grace period of its own, so each would get its
        ``terminationGracePeriodSeconds`` — sized for the whole results budget's final upload —
        and hold its GPUs that long; a grace given to the Job's delete never reaches them. The Job
        is deleted first: the Job controller makes no pod for a Job being deleted (upstream
        ``job_controller.go`` manages pods only while its ``deletionTimestamp`` is unset), so none
        replaces them. A pod already given a grace no longer than this one is left as it is (the
        API server only ever shortens a grace), and so is one whose own is shorter."""
        selector = ",".join(f"{k}={v}" for k, v in {**MANAGED_BY, JOB_ID_LABEL: name}.items())
        listed = api.call(f"listing the pods of {namespace}/{name}", api.core.list_namespaced_pod, namespace,
                          label_selector=selector)
        for pod in listed.get("items", []):
            pod_name = pod["metadata"]["name"]
            grace = min(self.settings.cancel_grace_seconds,
                        int(pod["spec"].get("terminationGracePeriodSeconds", POD_DEFAULT_GRACE_SECONDS)))
            given = pod["metadata"].get("deletionGracePeriodSeconds")
            if given is not None and int(given) <= grace:
                continue
            try:
                api.delete(f"deleting pod {namespace}/{pod_name} with a {grace}s grace",
                           api.core.delete_namespaced_pod, pod_name, namespace, grace_period_seconds=grace)
            except ApiError as exc:
                if exc.status != 403:
                    raise
                # The Job is deleted already, so the job is canceled: its pods just keep the grace
                # the garbage collector gives them (a Role from before delete on pods was granted).
                self.say(f"{exc}; the pods of {namespace}/{name} end within their own grace period instead")
                return

    @staticmethod
    def _delete_labelled(api: Api, namespace: str, name: str, what: str) -> None:
        """Foreground delete of every object labelled with the job ``name`` (the Jobs first). The
        per-job Secret is found by its name, never by listing: an identity that may list Secrets
        may read every credential in the namespace, so the Role grants no ``list`` on them."""
        labels = {**MANAGED_BY, JOB_ID_LABEL: name}
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        table = kinds(api)
        for kind in _CANCEL_ORDER:
            if kind == "Secret":
                secret = object_names(name).credentials
                found = api.get(f"reading Secret {namespace}/{secret} of {what}", table[kind].read, secret, namespace)
                items = [found] if found is not None and all(
                    (found["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items()) else []
            else:
                items = api.call(f"listing the {kind}s of {what}", table[kind].list, namespace,
                                 label_selector=selector).get("items", [])
            for item in items:
                item_name = item["metadata"]["name"]
                api.delete(f"deleting {kind} {namespace}/{item_name}", table[kind].delete, item_name, namespace,
                           propagation_policy="Foreground")

    def results_path(self, ref: str) -> str | None:
        return None

    # ------------------------------------------------------------------ helpers
    def _api(self) -> Api:
        if self._connected is None:
            self._connected = Api(connect(namespace=self.settings.namespace, context=self.settings.context,
                                          kubeconfig=self.kubeconfig))
        return self._connected

    def _render(self, plan: LaunchPlan, documents: JobDocuments | None,
                environ: Mapping[str, str] | None) -> tuple[RenderedJob, KubernetesSettings]:
        if documents is None:
            raise UsageError("the Kubernetes backend ships the job's request and record to its pods, so preflight "
                             "and submit need documents (the request and record the plan was built from); "
                             "tao_data_io.steps.submit passes them")
        # Checked again: the claim may be the request's, and the rules are the settings' own.
        settings = KubernetesSettings.from_mapping({**self.settings.model_dump(), "namespace": self._api().namespace,
                                                    "pvc_claim": self._claim(documents)})
        rendered = render_job(plan, settings, request=documents.request, record=documents.record,
                              config=read_config(plan), environ=environ,
                              status_sidecar=server_version(self._api()) >= SIDECAR_VERSION)
        return rendered, settings

    def _claim(self, documents: JobDocuments) -> str | None:
        ours, theirs = self.settings.pvc_claim, documents.request.storage.pvc_claim
        if ours and theirs and ours != theirs:
            raise UsageError(f"pvc_claim {ours!r} differs from the request's storage.pvc_claim {theirs!r}; name one "
                             "claim")
        return ours or theirs

    def _ref(self, ref: str) -> tuple[str, str]:
        namespace, _, name = check_ref(ref).partition("/")
        return namespace, name

    @staticmethod
    def _get_job(api: Api, namespace: str, name: str) -> dict[str, Any] | None:
        return api.get(f"reading Job {namespace}/{name}", api.batch.read_namespaced_job, name, namespace)

    @staticmethod
    def _delete_job(api: Api, namespace: str, name: str) -> bool:
        return api.delete(f"deleting Job {namespace}/{name}", api.batch.delete_namespaced_job, name, namespace,
                          propagation_policy="Foreground")

    @staticmethod
    def _events(api: Api, namespace: str, job: Mapping[str, Any],
                found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Warning events about the Job (when it has no pod: the Job controller's FailedCreate) or
        about pods still waiting for a node or an image — read only then, to keep a status cheap."""
        names = ([job["metadata"]["name"]] if not found else
                 [p["metadata"]["name"] for p in found if pod_reading.where(p).phase in ("schedule", "pull", "fatal")])
        events: list[dict[str, Any]] = []
        for name in names:
            listed = api.call(f"listing the events of {namespace}/{name}", api.core.list_namespaced_event, namespace,
                              field_selector=f"involvedObject.name={name}")
            events += listed.get("items", [])
        return events
