"""The job request: everything the data mover needs to know about one TAO job, versioned.

Why pydantic: the request arrives from users (YAML/JSON files, a Prefect parameter, an agent)
and is the contract every later step reads, so it is validated once, at the edge, with errors
that name the field path, the bad value and the fix. It holds names and paths only: credentials
are listed by *name* in ``forward_env`` and never appear as values.

The shape follows the TAO renderer contract (see ``reference/tao-run-on-kubernetes.md``): a
``mode`` of ``args`` (native argv) or ``config`` (a **nested** spec serialised to a file whose
path replaces ``{config_path}`` in the command).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from .credentials import Redactor, credential_value_fields, is_secret_name, masked
from .documents import load_document, read_document
from .errors import UsageError
from .frame import check_container_path, check_frame_target, place_sources
from .names import ENV_NAME_RULE, check_job_id, is_env_name
from .schema import Strict, describe_validation_error
from .spec import iter_strings, remote_uris
from .uris import is_remote_uri, parse_s3_url, parse_uri, staging_location

SCHEMA_VERSION = "1"
#: A Kubernetes binary quantity such as ``16Gi`` (what ``/dev/shm`` sizes are written in).
_BINARY_QUANTITY = re.compile(r"[1-9][0-9]{0,5}(Ki|Mi|Gi|Ti)")
_QUANTITY_FACTORS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}


def is_binary_quantity(value: str) -> bool:
    return bool(_BINARY_QUANTITY.fullmatch(value))


def quantity_bytes(quantity: str) -> int:
    """``16Gi`` → 17179869184 (the quantity was validated by :class:`ComputeShape`)."""
    return int(quantity[:-2]) * _QUANTITY_FACTORS[quantity[-2:]]


class ComputeShape(Strict):
    gpus: int = Field(default=1, ge=0, le=64)
    nodes: int = Field(default=1, ge=1, le=512)
    #: Size of ``/dev/shm`` in the frame: data loaders and NCCL hang silently when it is small.
    shm_size: str = "16Gi"

    @field_validator("shm_size")
    @classmethod
    def _shm_size(cls, value: str) -> str:
        if not is_binary_quantity(value):
            raise ValueError(f"shm_size {value!r} is not a binary quantity: write a whole number with Ki, Mi, Gi "
                             "or Ti, such as 16Gi")
        return value


class InputSpec(Strict):
    """One input to stage. ``source`` is ``s3://``, ``hf://``, ``ngc://`` or a local absolute path
    (already readable from the compute frame: tier A). ``target`` is where the job sees it; when
    omitted it is derived from the source under the inputs root."""

    source: str
    kind: Literal["auto", "folder", "file", "selective", "archive", "model"] = "auto"
    target: str | None = None
    # annotation-selective
    annotation: str | None = None
    keys: list[str] = Field(default_factory=list)
    annotation_format: Literal["parquet", "jsonl", "json", "csv"] | None = None
    missing: Literal["error", "skip"] = "error"
    # archive
    strip_components: int = Field(default=0, ge=0, le=32)
    # folder
    excludes: list[str] = Field(default_factory=list)
    #: A folder whose prefix holds no object is an error (a typo in the prefix, usually) unless
    #: this says an empty folder is expected.
    allow_empty: bool = False

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


class OutputSpec(Strict):
    results_dir: str = "/results"
    upload_excludes: list[str] = Field(default_factory=list)

    @field_validator("results_dir")
    @classmethod
    def _results_dir(cls, value: str) -> str:
        return check_frame_target(value, what="results_dir")


class MountSpec(Strict):
    """A pre-positioned source (tier A): a host/PVC path mounted at ``target``."""

    source: str
    target: str
    read_only: bool = True

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return check_container_path(value, what="source")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        return check_frame_target(value, what="target")


class StoragePrefs(Strict):
    tier: Literal["A", "B", "C"] | None = None
    pvc_claim: str | None = None
    air_gapped: bool = False


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


EnvValue = Annotated[str, BeforeValidator(_env_text)]


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


class JobRequest(Strict):
    schema_version: Literal["1"]
    job_id: str | None = None
    image: str = Field(min_length=1)

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if any(ch.isspace() or not ch.isprintable() for ch in value):
            raise ValueError(f"image {value!r} holds whitespace or a control character; write an image reference "
                             "such as nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt")
        return value
    command: str | list[str]
    mode: Literal["args", "config"]
    args: list[str] | None = None
    spec: dict[str, Any] | None = None
    config_format: Literal["json", "yaml", "toml"] | None = None
    compute_shape: ComputeShape = Field(default_factory=ComputeShape)
    inputs: list[InputSpec] = Field(default_factory=list)
    outputs: OutputSpec = Field(default_factory=OutputSpec)
    mounts: list[MountSpec] = Field(default_factory=list)
    #: Plain variables for the job. Numbers and booleans are written as YAML users write them
    #: (``EPOCHS: 3``) and passed as their text (``"3"``, ``"true"``).
    environment: dict[str, EnvValue] = Field(default_factory=dict)
    forward_env: list[str] = Field(default_factory=list)
    storage: StoragePrefs = Field(default_factory=StoragePrefs)
    #: Whether the job may use the network. The local frame runs without one unless this is
    #: true; a Kubernetes pod always has the cluster network.
    network: bool = False

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
            raise ValueError(f"{overlap} appear in both environment and forward_env; a credential is forwarded by name only")
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
            spelled = item.source.rstrip("/") if item.source.startswith("s3://") else item.source
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
        data = load_document(text, fmt, what=f"request {str(path)!r}", environ=environ)
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
        raise masked(invalid, Redactor(environ)) from None  # the value may be a pasted credential
    leaked = credential_value_fields(request.model_dump(mode="json"), environ)
    if leaked:
        raise UsageError(f"invalid job {source}: {', '.join(leaked)} holds the value of a credential variable of this "
                         "environment; a request names credentials in forward_env and never holds their values")
    return request

