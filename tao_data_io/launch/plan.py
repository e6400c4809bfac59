"""The launch plan: everything a backend needs to start one job, built by a pure function.

Why one model for every backend: the local sandbox and the Kubernetes renderer must run the
same argv, with the same environment, seeing the same paths; and the verify probe builds its
checklist from the same mounts. The plan holds names and paths only — credential variables are
listed by name (``forward_env``) and a backend projects their values itself (into the sandbox's
environment, into a per-job Secret), never into the plan.

The command: in ``args`` mode the request's command and args are native argv, whatever they
contain (shell metacharacters stay literal). In ``config`` mode ``{config_path}`` is replaced by
the config's path in the frame; a command written as one string that uses shell syntax runs
verbatim under ``/bin/sh -c`` (the producer chose a shell); anything else is split into argv.
Shell text is never built from values: the only thing substituted is our own config path.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Final, Literal

from pydantic import Field

from ..redaction import Redactor
from ..errors import UsageError
from ..records import JobRecord, OutputRoute
from ..frame import PROBE_DIR as PROBE_DIR  # where backends mount the probe's files
from ..request import JobRequest, spelled_source
from ..schema import Strict
from ..staging.stage_map import StagingMap
from ..tier import Tier, TierDecision

SCHEMA_VERSION: Final = "1"
#: Characters that mean "this string is shell text", not a command line to split.
_SHELL_SYNTAX = re.compile(r"[|&;<>()$`\\\n*?\[\]#~{}]|(^|\s)(if|for|while|case|export)\s")
CONFIG_PLACEHOLDER = "{config_path}"

MountOrigin = Literal["staged", "pre-positioned", "config"]
Expect = Literal["dir", "file", "any"]


class PlanMount(Strict):
    """One path the frame sees. ``source`` is relative to the staging root for ``staged`` and
    ``config`` mounts, and the declared absolute path for ``pre-positioned`` ones (a host path for
    the local frame; a path inside the job's PVC on Kubernetes)."""

    origin: MountOrigin
    source: str
    target: str
    read_only: bool = True
    #: What the verify probe expects at ``target``: a non-empty directory, a readable file, or
    #: anything readable (a pre-positioned path may be either).
    expect: Expect = "any"
    #: The input this mount comes from (request source URI or path), for messages.
    input: str


class LaunchPlan(Strict):
    schema_version: Literal["1"] = SCHEMA_VERSION
    job_id: str
    image: str
    argv: list[str]
    #: True when ``argv`` is ``["/bin/sh", "-c", <the request's own shell text>]``.
    shell: bool = False
    #: Plain variables (the request's ``environment`` plus the job's own), never a credential.
    env: dict[str, str] = Field(default_factory=dict)
    #: Names of credential variables the backend projects into the frame.
    forward_env: list[str] = Field(default_factory=list)
    mounts: list[PlanMount]
    #: The job's staging directory, which the ``staged`` mounts are relative to (on the submitting
    #: host, or the job's PVC in tier B; the pod's emptyDir in tier C).
    staging_dir: str
    #: Where tao-data-io keeps state on the submitting host for this submit — the root of every
    #: job's staging, the job records' directory — which a backend that binds host paths keeps
    #: out of the request's mounts, however its target is configured.
    state_roots: list[str] = Field(default_factory=list)
    results_dir: str
    config_path: str | None = None
    route: OutputRoute
    tier: Tier
    gpus: int
    nodes: int
    shm_size: str
    #: The request's ``compute_shape.cpu``, ``memory`` and ``ephemeral_storage`` (None: not set).
    cpu: str | None = None
    memory: str | None = None
    ephemeral_storage: str | None = None
    #: How often the job is started again after its pod was disrupted (Kubernetes; the request's
    #: ``compute_shape.disruption_retries``, defaulted for its node count).
    disruption_retries: int = Field(default=0, ge=0)
    #: The request's ``compute_shape.deadline_seconds``: the most the whole run may take (None: no limit).
    deadline_seconds: int | None = None
    #: At most how many bytes staging writes in the frame (the staging map's bound; None: unknown):
    #: tier C's pod sizes its staging volume to it.
    staging_bytes: int | None = None
    network: bool = False
    #: Which launch of the job this is (:class:`~tao_data_io.records.Attempt`): 2 and later are a
    #: job that ran, ended and was submitted again.
    attempt: int = Field(default=1, ge=1)
    #: Where earlier attempts uploaded their results (the route's prefix), restored into the
    #: results directory before the command starts so training resumes from its last checkpoint;
    #: None for a first attempt, or when the results persist where they are (a mount).
    restore_from: str | None = None

    def to_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json")

    def describe(self) -> str:
        command = " ".join(shlex.quote(part) for part in self.argv)
        return (f"job {self.job_id}: {command} in {self.image} — tier {self.tier}, {len(self.mounts)} mounts, "
                f"{self.gpus} GPU(s) × {self.nodes} node(s), results {self.results_dir} → {self.route.route}")


def command_argv(request: JobRequest, config_path: str | None) -> tuple[list[str], bool]:
    """(argv, shell) for the request's command (see the module docstring)."""
    command = request.command
    if request.mode == "args":
        base = list(command) if isinstance(command, list) else _split(command, "command")
        return base + list(request.args or []), False
    assert config_path is not None
    if isinstance(command, list):
        return [part.replace(CONFIG_PLACEHOLDER, config_path) for part in command], False
    if _SHELL_SYNTAX.search(command.replace(CONFIG_PLACEHOLDER, "")):
        return ["/bin/sh", "-c", command.replace(CONFIG_PLACEHOLDER, config_path)], True
    return [part.replace(CONFIG_PLACEHOLDER, config_path) for part in _split(command, "command")], False


def _split(text: str, field: str) -> list[str]:
    try:
        parts = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{field} {text!r} cannot be split into arguments ({exc}); write it as a list of "
                         "strings") from None
    if not parts:
        raise UsageError(f"{field} is empty; give the program to run")
    return parts


def build_plan(request: JobRequest, staging_map: StagingMap, decision: TierDecision, record: JobRecord,
               route: OutputRoute, *, environ: Mapping[str, str] | None = None,
               state_roots: Sequence[str] = ()) -> LaunchPlan:
    """The plan for ``record``'s job (``state_roots``: see :attr:`LaunchPlan.state_roots`). Pure
    but for one check: a plain ``environment`` value that equals a credential in ``environ`` is
    refused (a secret smuggled under an innocent name)."""
    refuse_smuggled_secrets(request.environment, environ)
    config = staging_map.config()
    config_path = config.container_path if config is not None else None
    if request.mode == "config" and config is None:
        raise UsageError("the request is in config mode but the staging map has no materialized config; "
                         "stage the request again")
    argv, shell = command_argv(request, config_path)
    _refuse_undeclared(request, staging_map)
    mounts = [_mount_for(source) for source in staging_map.sources]
    for mount in request.mounts:
        mounts.append(PlanMount(origin="pre-positioned", source=mount.source, target=mount.target,
                                read_only=mount.read_only, expect="any", input=mount.source))
    _check_targets(mounts, request.outputs.results_dir)
    env = {**request.environment, "TAO_JOB_ID": record.job_id, "TAO_RESULTS_DIR": request.outputs.results_dir}
    attempt = sum(1 for earlier in record.attempts if earlier.ended_at is not None) + 1
    restore_from = route.destination if attempt > 1 and route.route == "s3" else None
    return LaunchPlan(job_id=record.job_id, image=request.image, argv=argv, shell=shell, env=env,
                      attempt=attempt, restore_from=restore_from,
                      forward_env=list(request.forward_env), mounts=mounts, staging_dir=staging_map.staging_dir,
                      state_roots=list(state_roots),
                      results_dir=request.outputs.results_dir, config_path=config_path, route=route,
                      tier=decision.tier, gpus=request.compute_shape.gpus, nodes=request.compute_shape.nodes,
                      shm_size=request.compute_shape.shm_size, cpu=request.compute_shape.cpu,
                      memory=request.compute_shape.memory, ephemeral_storage=request.compute_shape.ephemeral_storage,
                      disruption_retries=request.compute_shape.retries_after_disruption,
                      deadline_seconds=request.compute_shape.deadline_seconds,
                      staging_bytes=staging_map.planned_bytes, network=request.network)


def _refuse_undeclared(request: JobRequest, staging_map: StagingMap) -> None:
    """Every source of the staging map is one the request declares (an input, or a URI of its
    spec), besides its config: the map is a file between steps — and between machines — so an
    entry added to it by hand would otherwise become a mount of the job (the renderer contract:
    no undeclared sources)."""
    declared = {spelled_source(item.source) for item in request.inputs}
    declared |= {spelled_source(named.source) for named in request.remote_sources()}
    for index, source in enumerate(staging_map.sources):
        if source.kind != "config" and spelled_source(source.source) not in declared:
            raise UsageError(f"staging map entry sources[{index}] ({source.source!r} at {source.container_path!r}) is "
                             "not an input or a URI of the request: stage the request again instead of editing "
                             "its staging map")


def _mount_for(source: object) -> PlanMount:
    from ..staging.stage_map import StagedSource

    assert isinstance(source, StagedSource)
    if source.kind == "pre-positioned":
        return PlanMount(origin="pre-positioned", source=source.source, target=source.container_path,
                         expect="any", input=source.source)
    assert source.sub_path is not None
    expect: Expect = "file" if source.kind in ("file", "config") else "dir"
    if source.kind == "model" and source.files == 1 and not source.container_path.endswith("/"):
        expect = "any"  # an hf:// subpath may name one file of the repository
    return PlanMount(origin="config" if source.kind == "config" else "staged", source=source.sub_path,
                     target=source.container_path, expect=expect, input=source.source)


def _check_targets(mounts: list[PlanMount], results_dir: str) -> None:
    """Several targets may alias one source, but one target cannot take two sources, and the
    results directory must not be (or be inside) a read-only input."""
    seen: dict[str, PlanMount] = {}
    for mount in mounts:
        other = seen.get(mount.target)
        if other is not None and (other.origin, other.source) != (mount.origin, mount.source):
            raise UsageError(f"two inputs appear at {mount.target}: {other.input!r} and {mount.input!r}; give one of "
                             "them another target")
        seen[mount.target] = mount
        if mount.read_only and (results_dir == mount.target or results_dir.startswith(mount.target + "/")):
            raise UsageError(f"outputs.results_dir {results_dir!r} lies in the read-only input {mount.target!r} "
                             f"({mount.input}); write results somewhere else")


def refuse_smuggled_secrets(environment: Mapping[str, str], environ: Mapping[str, str] | None) -> None:
    """Refuse a plain variable whose value is (or holds) a credential of ``environ`` (default
    ``os.environ``): a secret smuggled under an innocent name. The message never echoes it."""
    redact = Redactor(environ)
    for name, value in environment.items():
        if redact(value) != value:
            raise UsageError(f"environment {name!r} holds the value of a credential variable of this environment; "
                             "credentials are forwarded by name only: list the variable in forward_env instead")
