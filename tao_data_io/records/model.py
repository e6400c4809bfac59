"""The job record document: what we know about one TAO job, and the rules every copy obeys.

Why a module of its own: the document is the contract between every pod that touches a job
(submit writes it, the in-pod agent and ``collect`` update it, a scheduled ``resync`` reads
it), whichever storage keeps it. Its rules live in the model so no storage can keep a
record that breaks them:

* a versioned, strict schema (an unknown field is a version skew, never ignored);
* the TAO state vocabulary, of which COMPLETE, ERROR and CANCELED are final;
* names and paths only: a validator refuses any string holding the value of a credential
  variable in the environment, naming the field but never echoing the value.

Job ids are DNS labels of at most 52 characters because a renderer uses them as Kubernetes
Job names; they also become file names and object keys, so that check is the stores'
confinement too.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Final, Literal

from pydantic import (AfterValidator, AliasChoices, AwareDatetime, ConfigDict, Field, JsonValue, ValidationError,
                      model_validator)

from ..redaction import credential_value_fields
from ..errors import UsageError
from ..names import check_backend_ref, check_job_id
from ..schema import Strict, describe_validation_error
from .storage import DamagedRecordError
from ..vocabulary import STATES, STORAGE_TIERS, State, StorageTier
from ..vocabulary import TERMINAL_STATES as TERMINAL_STATES  # re-exported: the package's lazy exports find it here

SCHEMA_VERSION: Final = "1"


#: Fields that say *which* job this is. A retried ``open`` with the same values is the same
#: job (the existing record is returned); any difference means a different job. The storage
#: tier is not one of them: it is decided after the record is opened (``set_tier``).
IDENTITY_FIELDS = ("job_id", "backend", "image", "network_arch", "action", "results_dir", "request_digest")
#: Fields ``update`` may not change: identity belongs to ``open``, state to ``mark``, the tier
#: to ``set_tier``, so no change function can bypass their rules.
GUARDED_FIELDS = frozenset({*IDENTITY_FIELDS, "schema_version", "created_at", "state", "history", "forward_env",
                            "backend_ref", "message", "storage_tier", "storage_reason"})


def check_state(value: str) -> str:
    if value not in STATES:
        raise UsageError(f"state {value!r} is not a TAO job state: use one of {', '.join(STATES)}")
    return value


def check_tier(value: str, *, what: str = "storage_tier") -> str:
    if value not in STORAGE_TIERS:
        raise UsageError(f"{what} {value!r} is not a storage tier: use one of {', '.join(STORAGE_TIERS)}")
    return value


def now() -> datetime:
    return datetime.now(timezone.utc)


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]
NonEmpty = Annotated[str, Field(min_length=1)]


class _Stored(Strict):
    """A part of the stored record. Fields this version does not know are kept, not refused: a
    newer version may add fields within schema version 1 (additions only; anything else is a new
    schema version, refused), and workers, pods and laptops upgrade one at a time. What this
    version reads, it writes back whole. Unknown fields are still data: the credential check
    covers them."""

    model_config = ConfigDict(extra="allow", frozen=True, hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        return data


class Transition(_Stored):
    """One entry of a record's history: who reported which state, when, and why."""

    at: UtcDatetime
    state: State
    #: Who reported it: ``cli``, ``agent``, ``flow``… A history written before the word was settled
    #: calls it ``source`` (the word for an input's URI); it still reads.
    reporter: NonEmpty = Field(validation_alias=AliasChoices("reporter", "source"))
    message: str | None = None


class Attempt(_Stored):
    """One launch of the job: a retried or resubmitted job that had run and ended launches again,
    as the next attempt, with what the earlier ones uploaded restored into its results directory
    first (TAO resumes from the newest checkpoint there)."""

    number: Annotated[int, Field(ge=1)]
    started_at: UtcDatetime
    #: The backend object of this attempt.
    backend_ref: str | None = None
    #: What was restored before its command started (None: nothing, as for a first attempt).
    restored: str | None = None
    ended_at: UtcDatetime | None = None
    #: Its terminal state, once it ended.
    state: State | None = None


class OutputRoute(_Stored):
    """Where a job's results go and why (set at submit by the routing step)."""

    route: NonEmpty
    destination: NonEmpty
    reason: str | None = None
    #: An S3 route's claimant: the job record its prefix belongs to (``<job id>@<created_at>``, see
    #: :mod:`tao_data_io.results_claim`), pinned here so a pod's copy of the record claims for the
    #: original. None on other routes, and on a route recorded before claims: the record's own.
    belongs_to: str | None = None


class JobRecord(_Stored):
    schema_version: Literal["1"] = SCHEMA_VERSION
    job_id: Annotated[str, AfterValidator(check_job_id)]
    #: The name of the backend the job runs on (``local``, ``docker``…). A record written before
    #: the word was settled calls it ``platform``; it still reads.
    backend: NonEmpty = Field(validation_alias=AliasChoices("backend", "platform"))
    image: NonEmpty
    network_arch: NonEmpty
    action: NonEmpty
    #: None until the storage step decides it (the record is opened before that).
    storage_tier: StorageTier | None = None
    storage_reason: str | None = None
    results_dir: NonEmpty
    #: The request's declared ``outputs.upload_excludes`` (aws-cli patterns), applied by every
    #: upload of this job's results on top of the ``.tao/*`` that is always excluded.
    upload_excludes: list[str] = Field(default_factory=list)
    #: The request's ``outputs.results_limit`` (a binary quantity): the most the job's results
    #: prefix may hold once an upload ends, by apparent size, counting what earlier uploads left
    #: there. None in a record that predates it: no limit.
    results_limit: str | None = None
    #: The NAMES of the credential variables the request forwards to the job (never values):
    #: whatever they are called, their values are masked in the job's log wherever it is shown.
    forward_env: list[str] = Field(default_factory=list)
    state: State
    #: The backend's own reference to the job once it is launched (``NAMESPACE/NAME`` of a Kubernetes
    #: Job; each backend parses its own), printable and bounded.
    backend_ref: Annotated[str, AfterValidator(check_backend_ref)] | None = None
    #: The message of the latest transition.
    message: str | None = None
    created_at: UtcDatetime
    updated_at: UtcDatetime
    history: list[Transition] = Field(default_factory=list)
    output_route: OutputRoute | None = None
    #: Upload summaries, appended by the steps that upload results.
    uploads: list[dict[str, JsonValue]] = Field(default_factory=list)
    #: The verify probe's verdict from inside the compute frame (per path: pass/fail and why),
    #: stored before the job's command may start.
    verify: dict[str, JsonValue] | None = None
    #: What rebuilds the backend the job runs on (``backends.backend_for(backend, backend_config)``):
    #: the dump of its settings model — a local run root, a namespace and context; names and paths,
    #: never a credential — so the verbs after submit reach the job without being told again where
    #: it is.
    backend_config: dict[str, JsonValue] | None = None
    #: SHA-256 of the request this job was opened for: the same job id with another request is
    #: another job, refused at open, and a retried submit is recognised as the same one.
    request_digest: str | None = None
    #: Who watches the job, as its orchestrator names it (``prefect-flow-run/<id>``: the root run
    #: of the flow that submitted or last collects it). A watcher that was canceled means the job
    #: should be; a watcher that crashed means nothing — the next collect takes over.
    owner: str | None = None
    #: Where following the job's log got to (the backend's cursor: byte offsets, timestamps), so a
    #: watcher that restarts shows what is new, not the whole log again.
    log_cursor: str | None = None
    #: Every launch of the job, oldest first (see :class:`Attempt`).
    attempts: list[Attempt] = Field(default_factory=list)

    @model_validator(mode="after")
    def _no_credential_values(self) -> JobRecord:
        leaked = credential_value_fields(self.model_dump(mode="json"))
        if leaked:
            fields = ", ".join(repr(field) for field in leaked)
            raise ValueError(f"record field {fields} holds the value of a credential variable; a job record keeps "
                             "names and paths only — refer to the variable by its name instead")
        return self

    def identity(self) -> dict[str, Any]:
        return self.model_dump(include=set(IDENTITY_FIELDS))

    def claimant(self) -> str:
        """This record as the claimant of a results prefix (:mod:`tao_data_io.results_claim`): its
        job id and creation time, which it keeps for life (attempts, a changed request, a copy into
        another store) and which two records of one job id in two stores do not share."""
        return f"{self.job_id}@{self.created_at.isoformat()}"

    def encode(self) -> bytes:
        """The stored form: indented JSON, readable and diffable by hand, one document per job."""
        return self.model_dump_json(indent=2).encode() + b"\n"


def validated(data: dict[str, Any]) -> JobRecord:
    """A new record from ``data``, or a UsageError naming each bad field (never its value)."""
    try:
        return JobRecord.model_validate(data)
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, f"refusing to store job {data.get('job_id')!r}")) from None


def decoded(data: bytes, *, job_id: str, where: str) -> JobRecord:
    """The record stored at ``where`` for ``job_id``, or DamagedRecordError saying why not."""
    try:
        record = JobRecord.model_validate_json(data)
    except ValidationError as exc:
        raise DamagedRecordError(describe_validation_error(exc, f"{where} is not a valid job record")) from None
    if record.job_id != job_id:
        raise DamagedRecordError(f"{where} holds job {record.job_id!r}, not {job_id!r}")
    return record
