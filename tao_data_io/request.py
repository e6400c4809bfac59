"""The job request: everything the data mover needs to know about one TAO job, versioned.

Why pydantic: the request arrives from users (YAML/JSON files, a Prefect parameter, an agent)
and is the contract every later step reads, so it is validated once, at the edge, with errors
that name the field path, the bad value and the fix. It holds names and paths only: credentials
are listed by *name* in ``forward_env`` and never appear as values.

The shape follows the TAO renderer's contract (docs/requests.md): a
``mode`` of ``args`` (native argv) or ``config`` (a **nested** spec serialised to a file whose
path replaces ``{config_path}`` in the command).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, overload

from pydantic import (BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from .redaction import Redactor, credential_shape_fields, credential_value_fields, is_secret_name, masked
from .documents import load_document, read_document
from .errors import UsageError
from .forms import PLAIN_VARIABLE_NAMES, SpecMapping, guard_texts
from .frame import check_container_path, check_frame_target, place_sources
from .names import ENV_NAME_RULE, check_job_id, is_env_name, process_control_problem
from .quantities import checked_quantity, is_cpu_quantity, quantity_bytes
from .schema import Strict, describe_validation_error
from .spec import iter_strings, remote_uris
from .uris import is_remote_uri, parse_s3_url, parse_uri, staging_location

SCHEMA_VERSION: Final = "1"


class RequestPart(Strict):
    """A part of the request: its JSON schema is also the run form, every text guarded
    (:mod:`~tao_data_io.forms`), so every field has a description."""

    model_config = ConfigDict(json_schema_extra=guard_texts)


#: How often a one-node job is started again after a disruption, unless its request says otherwise.
DEFAULT_DISRUPTION_RETRIES = 2
#: The results a job may upload unless its request says otherwise (outputs.results_limit).
DEFAULT_RESULTS_LIMIT = "20Gi"
#: The most each size may be: beyond any node's memory (``/dev/shm`` is memory) or disk. A larger
#: one is a typo, and the local frame would mount a tmpfs that size (977P in ``df``).
SIZE_CAPS = {"shm_size": "1Ti", "memory": "64Ti", "ephemeral_storage": "64Ti", "results_limit": "64Ti"}


@overload
def _bounded_size(value: str, field: str) -> str: ...
@overload
def _bounded_size(value: None, field: str) -> None: ...
def _bounded_size(value: str | None, field: str) -> str | None:
    """``value`` if it is a binary quantity no larger than ``SIZE_CAPS[field]``: the one rule of
    every size a request gives, refusals naming the field."""
    if value is None:
        return None
    return checked_quantity(value, field, most=SIZE_CAPS[field], beyond=", more than any machine gives one job")


class ComputeShape(RequestPart):
    """How much of a machine the job takes, and on how many."""

    gpus: int = Field(default=1, ge=0, le=64, description="GPUs per node (0: CPU only).")
    nodes: int = Field(default=1, ge=1, le=512, description="Nodes; more than one runs under torchrun's rendezvous.")
    #: Size of ``/dev/shm`` in the frame: data loaders and NCCL hang silently when it is small.
    shm_size: str = Field(default="16Gi", description="Size of /dev/shm, a binary quantity such as 16Gi: data "
                                                     "loaders and NCCL hang silently when it is small.")
    #: What the job's container asks for and may use beyond its GPUs. Without any, a Kubernetes
    #: pod would be BestEffort — evicted first under memory pressure, given a LimitRange's
    #: defaults, refused by a ResourceQuota on requests — so memory is always requested, at
    #: least the shm size (a memory-backed /dev/shm counts against it).
    cpu: str | None = Field(default=None, description="CPU cores per node, requested and the limit (such as 8 "
                                                      "or 7500m); empty: no CPU request or limit.")
    memory: str | None = Field(default=None, description="Memory per node, a binary quantity, requested and the "
                                                         "limit (at least shm_size); empty: shm_size requested, no "
                                                         "limit.")
    ephemeral_storage: str | None = Field(default=None, description="Node-local disk per node (a binary quantity), "
                                                                    "requested and the limit on Kubernetes, and "
                                                                    "the size of the local frame's /tmp; empty: "
                                                                    "none set (the local frame's /tmp: 4Gi).")

    #: How often a single-pod job is started again after its pod was disrupted (preempted,
    #: evicted, its node drained): the training command's own failures are never retried.
    disruption_retries: int | None = Field(
        default=None, ge=0, le=10,
        description="How often a one-node job on Kubernetes is started again after its pod was preempted, evicted or "
                    "its node drained (never after the command fails); empty: 2 for one node, 0 for several — a "
                    "replacement rank cannot rejoin a running rendezvous, so a multi-node job takes none.")

    deadline_seconds: int | None = Field(
        default=None, ge=60, le=30 * 86400,
        description="The most the whole run may take from its start, its verify and any start after a disruption "
                    "included; past it the job is ended and recorded ERROR, saying so (Kubernetes: the Job's "
                    "activeDeadlineSeconds). Empty: no limit.")

    @property
    def retries_after_disruption(self) -> int:
        """:attr:`disruption_retries`, or its default for this many nodes."""
        if self.disruption_retries is not None:
            return self.disruption_retries
        return DEFAULT_DISRUPTION_RETRIES if self.nodes == 1 else 0

    @field_validator("shm_size", "memory", "ephemeral_storage")
    @classmethod
    def _binary(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _bounded_size(value, str(info.field_name))

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, value: str | None) -> str | None:
        if value is not None and not is_cpu_quantity(value):
            raise ValueError(f"cpu {value!r} is not a CPU quantity: write whole cores (8), a decimal (7.5) or "
                             "millicores (7500m)")
        return value

    @model_validator(mode="after")
    def _no_disruption_retries_across_nodes(self) -> ComputeShape:
        if self.nodes > 1 and self.disruption_retries:
            raise ValueError(f"disruption_retries {self.disruption_retries} with nodes {self.nodes}: a replacement pod "
                             "cannot rejoin the static rendezvous the other ranks are in, so a multi-node job ends "
                             "when one of its pods is disrupted — leave disruption_retries empty (or 0) and submit "
                             "again after a disruption")
        return self

    @model_validator(mode="after")
    def _memory_holds_shm(self) -> ComputeShape:
        if self.memory is not None and quantity_bytes(self.memory) < quantity_bytes(self.shm_size):
            raise ValueError(f"memory {self.memory!r} is less than shm_size {self.shm_size!r}, which a memory-backed "
                             "/dev/shm takes from it: raise memory or lower shm_size")
        return self


class InputSpec(RequestPart):
    """One input to stage. ``source`` is ``s3://``, ``hf://``, ``ngc://`` or a local absolute path
    (already readable from the compute frame: tier A). ``target`` is where the job sees it; when
    omitted it is derived from the source under the inputs root."""

    source: str = Field(description="s3://BUCKET/KEY or s3://BUCKET/PREFIX/, hf://ORG/REPO[@REVISION], "
                                    "ngc://ORG/[TEAM/]MODEL:VERSION, or an absolute path already readable from the "
                                    "compute frame (pre-positioned: tier A).")
    kind: Literal["auto", "folder", "file", "selective", "archive", "model"] = Field(
        default="auto", description="auto: asks the bucket whether an s3:// key is an object or a prefix; selective: "
                                    "only the files an annotation references; archive: extracted; model: hf:// or "
                                    "ngc://.")
    target: str | None = Field(default=None, description="Where the job sees the input; empty: under /tao-inputs, "
                                                         "derived from the source.")
    # annotation-selective
    annotation: str | None = Field(default=None, description="selective: the annotation file (a path or one "
                                                             "s3:// object) whose keys name the files to stage.")
    keys: list[str] = Field(default_factory=list, description="selective: the annotation's columns that hold "
                                                              "file names, relative to the source prefix.")
    annotation_format: Literal["parquet", "jsonl", "json", "csv"] | None = Field(
        default=None, description="selective: the annotation's format; empty: from its extension.")
    missing: Literal["error", "skip"] = Field(default="error", description="selective: what a referenced file "
                                                                           "that is not in the bucket does.")
    # archive
    strip_components: int = Field(default=0, ge=0, le=32, description="archive: leading path parts dropped from "
                                                                       "each member, as tar's option.")
    # folder
    excludes: list[str] = Field(default_factory=list, description="folder: aws-style patterns of keys not staged "
                                                                  "(such as *.tmp).")
    #: A folder whose prefix holds no object is an error (a typo in the prefix, usually) unless
    #: this says an empty folder is expected.
    allow_empty: bool = Field(default=False, description="folder: an empty prefix is expected (otherwise an error: "
                                                         "usually a typo).")

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if is_remote_uri(value):
            staging_location(parse_uri(value, field="source"))  # the one parser: what loads here also stages
        elif not value.startswith("/"):
            raise ValueError(f"source {value!r} is neither s3://, hf://, ngc:// nor an absolute local path")
        else:
            check_container_path(value, what="source")
        return value

    @field_validator("annotation")
    @classmethod
    def _annotation(cls, value: str | None) -> str | None:
        if value is not None and is_remote_uri(value):
            url = parse_s3_url(value, field="annotation")
            if url.is_prefix:
                raise ValueError(f"annotation {value!r} names a prefix; give one object, e.g. s3://BUCKET/ann/train.parquet")
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str | None) -> str | None:
        return None if value is None else check_frame_target(value, what="target")

    @model_validator(mode="after")
    def _kind_options(self) -> InputSpec:
        if self.kind == "selective":
            if not self.annotation or not self.keys:
                raise ValueError("kind 'selective' needs 'annotation' (path or s3:// URI) and 'keys' (column names)")
            if not self.source.startswith("s3://"):
                raise ValueError(f"kind 'selective' needs an s3:// source prefix, got {self.source!r}")
        elif self.annotation or self.keys:
            raise ValueError("'annotation' and 'keys' only apply to kind 'selective'")
        if self.strip_components and self.kind != "archive":
            raise ValueError("'strip_components' only applies to kind 'archive'")
        if self.kind == "model" and not self.source.startswith(("hf://", "ngc://")):
            raise ValueError(f"kind 'model' needs an hf:// or ngc:// source, got {self.source!r}")
        if self.kind in ("folder", "file", "archive") and self.source.startswith(("hf://", "ngc://")):
            raise ValueError(f"kind {self.kind!r} needs an s3:// source; {self.source!r} is a model: use kind 'model'")
        if not is_remote_uri(self.source) and self.target is None:
            # Without a target a local input appears at its own path: that path must be a usable target too.
            check_frame_target(self.source, what="source (where it appears, as no target is given)")
        if self.kind in ("selective", "archive", "model") and not is_remote_uri(self.source):
            raise ValueError(f"kind {self.kind!r} needs a remote source; a local source {self.source!r} is "
                             "pre-positioned and mounted as it is (kind 'auto')")
        return self


class OutputSpec(RequestPart):
    """Where the job writes its results, and what of them is not uploaded."""

    results_dir: str = Field(default="/results", description="Where the job writes its results (TAO's "
                                                             "results_dir).")
    upload_excludes: list[str] = Field(default_factory=list, description="Patterns of results not uploaded; .tao/* "
                                                                         "never is.")
    results_limit: str = Field(default=DEFAULT_RESULTS_LIMIT, description="The most the job's results prefix may "
                               "hold once an upload ends (what earlier uploads left there included: an upload never "
                               "deletes), a binary quantity counted by apparent size (a sparse file counts whole: S3 "
                               "has no sparse objects); an upload that would pass it sends nothing and says why. On "
                               "Kubernetes it also sizes the time the final upload gets after training exits.")

    @field_validator("results_limit")
    @classmethod
    def _results_limit(cls, value: str) -> str:
        return _bounded_size(value, "results_limit")

    @field_validator("results_dir")
    @classmethod
    def _results_dir(cls, value: str) -> str:
        return check_frame_target(value, what="results_dir")


class MountSpec(RequestPart):
    """A pre-positioned source (tier A): a host/PVC path mounted at ``target``."""

    source: str = Field(description="The absolute path on the host (local frame) or the volume (Kubernetes).")
    target: str = Field(description="Where the job sees it.")
    read_only: bool = Field(default=True, description="Mounted read-only unless false.")

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return check_container_path(value, what="source")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        return check_frame_target(value, what="target")


class StoragePrefs(RequestPart):
    """The storage tier, when the job's author wants a say in it."""

    tier: Literal["A", "B", "C"] | None = Field(default=None, description="A: pre-positioned, B: a durable volume "
                                                                          "filled by a stage Job, C: fetched in the "
                                                                          "pod; empty: decided from the request.")
    pvc_claim: str | None = Field(default=None, description="Tier B: the volume claim to fill and mount.")
    air_gapped: bool = Field(default=False, description="Nothing may be fetched: every input must be pre-positioned.")


def _env_text(value: Any) -> Any:
    """A variable's value as the process will see it: text. Numbers and booleans become their
    text; anything else (a list, a mapping, null) is refused naming the fix."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str):
        shown = "null" if value is None else f"a {type(value).__name__}"
        raise ValueError(f"is {shown}, but a variable's value is text: quote it (e.g. EPOCHS: \"3\")")
    return value


EnvValue = Annotated[str, BeforeValidator(_env_text, json_schema_input_type=str | int | float | bool)]


@dataclass(frozen=True)
class NamedSource:
    """A remote source where a request names it: a declared input's source, or a URI in the spec."""

    source: str
    #: ``inputs[N].source``, or the spec field path where the URI first appears.
    field: str
    #: The input that declares it; None for a URI only the spec names.
    declared: InputSpec | None = None

    @property
    def kind(self) -> str:
        return self.declared.kind if self.declared is not None else "auto"


class JobRequest(RequestPart):
    """One TAO job: its image and command, its inputs, where its results go (docs/requests.md)."""

    #: A default, so the run form fills it: the form fills a field from its schema's default and
    #: never from a const, and a request it sent without it was refused. Any other
    #: version is still refused.
    schema_version: Literal["1"] = Field(default=SCHEMA_VERSION, description="The request format's version: "
                                                                             "\"1\" (empty: \"1\").")
    job_id: str | None = Field(default=None, description="1-52 lowercase letters, digits and -; empty: derived "
                                                         "from the run (a retry keeps it).")
    image: str = Field(min_length=1, description="The TAO container image, such as "
                                                 "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt.")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if any(ch.isspace() or not ch.isprintable() for ch in value):
            raise ValueError(f"image {value!r} holds whitespace or a control character; write an image reference "
                             "such as nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt")
        return value
    command: str | list[str] = Field(description="The command, as a shell line or an argv list; config mode: with "
                                                 "{config_path} where the config file goes.")
    mode: Literal["args", "config"] = Field(description="args: native argv in command + args; config: a nested "
                                                        "spec written as config_format to {config_path}.")
    args: list[str] | None = Field(default=None, description="args mode: the arguments after the command.")
    spec: SpecMapping | None = Field(default=None, description="config mode: the nested spec (TAO's experiment "
                                                               "config); remote URIs in it are staged and rewritten "
                                                               "to local paths.")
    config_format: Literal["json", "yaml", "toml"] | None = Field(default=None, description="config mode: how the "
                                                                                            "spec is written.")
    compute_shape: ComputeShape = Field(default_factory=ComputeShape, description="GPUs, nodes and /dev/shm.")
    inputs: list[InputSpec] = Field(default_factory=list, description="What to stage, each where the job sees it.")
    outputs: OutputSpec = Field(default_factory=OutputSpec, description="The results directory and what is not "
                                                                        "uploaded.")
    mounts: list[MountSpec] = Field(default_factory=list, description="Pre-positioned paths mounted as they are.")
    #: Plain variables for the job. Numbers and booleans are written as YAML users write them
    #: (``EPOCHS: 3``) and passed as their text (``"3"``, ``"true"``).
    environment: dict[str, EnvValue] = Field(default_factory=dict, description="Plain variables for the job "
                                                                               "(never credentials).",
                                             json_schema_extra=PLAIN_VARIABLE_NAMES)
    forward_env: list[str] = Field(default_factory=list, description="Names of the worker's variables handed to "
                                                                     "the job: the only way a credential reaches it.")
    storage: StoragePrefs = Field(default_factory=StoragePrefs, description="The storage tier and its volume.")
    #: Whether the job may use the network. The local frame runs without one unless this is
    #: true; a Kubernetes pod always has the cluster network.
    network: bool = Field(default=False, description="Local frame: give the job the host's network (a pod always "
                                                     "has the cluster's).")

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, value: str | None) -> str | None:
        return None if value is None else check_job_id(value, what="job_id")

    @field_validator("spec")
    @classmethod
    def _spec(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_nested_spec(value)
            for where, text in iter_strings(value):
                if is_remote_uri(text):
                    staging_location(parse_uri(text, field=where), field=where)
        return value

    @field_validator("environment")
    @classmethod
    def _environment(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not is_env_name(name):
                raise ValueError(f"environment name {name!r} is not a valid variable name: {ENV_NAME_RULE}")
            if is_secret_name(name):
                raise ValueError(f"environment {name!r} looks like a credential: list its name in forward_env "
                                 "instead; values of credentials never go into a request")
        return value

    @field_validator("forward_env")
    @classmethod
    def _forward_env(cls, value: list[str]) -> list[str]:
        for name in value:
            if not is_env_name(name):
                raise ValueError(f"forward_env name {name!r} is not a valid variable name: {ENV_NAME_RULE}")
            if (problem := process_control_problem(name)) is not None:
                raise ValueError(f"forward_env name {name!r} {problem}")
        return value

    @model_validator(mode="after")
    def _mode(self) -> JobRequest:
        if self.mode == "args":
            if self.args is None:
                raise ValueError("mode 'args' needs 'args' (a list of strings)")
            if self.spec is not None or self.config_format is not None:
                raise ValueError("mode 'args' takes no 'spec' or 'config_format'; use mode 'config' for a spec")
        else:
            if self.spec is None or self.config_format is None:
                raise ValueError("mode 'config' needs a nested 'spec' and 'config_format' (json, yaml or toml)")
            if self.args is not None:
                raise ValueError("mode 'config' takes no 'args'; put the arguments in 'command'")
            command = self.command if isinstance(self.command, str) else " ".join(self.command)
            if "{config_path}" not in command:
                raise ValueError(f"mode 'config' needs '{{config_path}}' in command, got {command!r}")
        overlap = sorted(set(self.environment) & set(self.forward_env))
        if overlap:
            raise ValueError(f"{overlap} appear in both environment and forward_env; "
                             "a credential is forwarded by name only")
        self._check_declarations()
        place_sources(self.remote_sources())  # two sources that would land in one place are refused at load time
        return self

    def remote_sources(self) -> list[NamedSource]:
        """Every remote source the request stages, where it names it: the declared inputs in order,
        then each URI of the spec where it first appears (placed by :func:`~.frame.place_sources`)."""
        named = [NamedSource(item.source, f"inputs[{index}].source", item)
                 for index, item in enumerate(self.inputs) if is_remote_uri(item.source)]
        return named + [NamedSource(uri, field) for field, uri in remote_uris(self.spec or {})]

    def remote_references(self) -> list[tuple[str, str]]:
        """(URI, field) of everything remote the request references — each source it stages, once,
        then the selective inputs' annotations: what an air-gapped job cannot have."""
        found: dict[str, str] = {}
        for named in self.remote_sources():
            found.setdefault(named.source, named.field)
        found |= {item.annotation: f"inputs[{index}].annotation" for index, item in enumerate(self.inputs)
                  if item.annotation and is_remote_uri(item.annotation) and item.annotation not in found}
        return list(found.items())

    def _check_declarations(self) -> None:
        """One declaration per source; one input per target; no target inside another (the outer
        mount would hide or be hidden by the inner one); results not inside an input."""
        sources: dict[str, str] = {}
        for index, item in enumerate(self.inputs):
            spelled = spelled_source(item.source)
            if spelled in sources:
                raise ValueError(f"inputs[{index}].source {item.source!r} is declared twice (also {sources[spelled]}); "
                                 "declare each source once")
            sources[spelled] = f"inputs[{index}]"
        targets = [(f"inputs[{i}].target", item.target) for i, item in enumerate(self.inputs) if item.target]
        targets += [(f"mounts[{i}].target", mount.target) for i, mount in enumerate(self.mounts)]
        for position, (field, target) in enumerate(targets):
            for other_field, other in targets[:position]:
                if target == other:
                    raise ValueError(f"{field} {target!r} is also {other_field}: one path shows one input; pick "
                                     "another target")
                inner, outer = (target, other) if target.startswith(other + "/") else (other, target)
                if inner.startswith(outer + "/"):
                    raise ValueError(f"{field} {target!r} and {other_field} {other!r}: {inner!r} lies inside "
                                     f"{outer!r}, so one mount would hide the other; give them separate directories")
            results = self.outputs.results_dir
            if results == target or results.startswith(target + "/"):
                raise ValueError(f"outputs.results_dir {results!r} lies inside the input at {field} {target!r}; "
                                 "write results to a directory of their own")


def spelled_source(source: str) -> str:
    """A source as sources are compared: an s3:// prefix with or without its slash is one source."""
    return source.rstrip("/") if source.startswith("s3://") else source


def check_nested_spec(spec: dict[str, Any]) -> None:
    """Refuse flat dotted keys (``"train.lr": 1``): TAO specs are nested mappings."""
    dotted = sorted(key for key in spec if isinstance(key, str) and "." in key)
    if dotted:
        example = dotted[0]
        head, _, tail = example.partition(".")
        raise ValueError(
            f"spec must be nested, not flat dotted keys: {dotted[:5]}; write {{{head!r}: {{{tail!r}: ...}}}} "
            f"instead of {{{example!r}: ...}}"
        )


def load_request(path: str | Path, *, environ: Mapping[str, str] | None = None) -> JobRequest:
    """Load a request from a YAML or JSON file (see :func:`parse_request`); any problem is a
    :class:`UsageError` naming the file, the field and the fix."""
    path = Path(path)
    try:
        text = read_document(path, what=f"request {str(path)!r}", environ=environ)
        fmt = "json" if path.suffix == ".json" else "yaml"
        data = load_document(text, fmt, what=f"request {str(path)!r}", environ=environ, as_omegaconf=("spec",))
    except UsageError as exc:
        raise masked(exc, Redactor(environ)) from None  # a duplicate key may be a pasted credential
    return parse_request(data, source=f"request {str(path)!r}", environ=environ)


def read_request(request: str | Path | Mapping[str, Any], *,
                 environ: Mapping[str, str] | None = None) -> JobRequest:
    """A request as a caller gives it — a path to a YAML/JSON file, or the request itself as a
    mapping (a Prefect parameter, an agent's call) — validated by the same rules either way."""
    if isinstance(request, Mapping):
        return parse_request(request, source="request parameter", environ=environ)
    return load_request(request, environ=environ)


def parse_request(data: Any, *, source: str = "request", environ: Mapping[str, str] | None = None) -> JobRequest:
    """Validate a request given as a mapping (a parsed file, a Prefect parameter, an agent's
    call). Beyond the model's own rules, no literal value anywhere in it may equal a credential
    in ``environ`` (default ``os.environ``): the error names the field, never the value."""
    if not isinstance(data, Mapping):
        raise UsageError(f"{source} must hold a mapping with schema_version: \"1\"")
    try:
        request = JobRequest.model_validate(data)
    except ValidationError as exc:
        invalid = UsageError(describe_validation_error(exc, f"invalid job {source}"))
        named = data.get("forward_env")
        forwarded = named if isinstance(named, list) else []
        raise masked(invalid, Redactor(environ, secret_names=[n for n in forwarded if isinstance(n, str)])) from None
    dumped = request.model_dump(mode="json")
    leaked = credential_value_fields(dumped, environ, secret_names=request.forward_env)
    if leaked:
        raise UsageError(f"invalid job {source}: {', '.join(leaked)} holds the value of a credential variable of this "
                         "environment; a request names credentials in forward_env and never holds their values")
    shaped = credential_shape_fields(dumped)
    if shaped:
        raise UsageError(f"invalid job {source}: {', '.join(shaped)} holds what looks like a credential (an access "
                         "key, a token or a URL's user:password@); a request names credentials in forward_env and "
                         "never holds them")
    return request
