"""Credential blocks that hold the NAMES of environment variables, never their values.

Why names: a Prefect block document lives in the server's database (Fernet-encrypted with a key
kept in the same database), is shown by the API to anyone with access, and is copied into every
environment that loads it. A credential belongs to the machine that uses it — the worker — so a
block says only *where* the worker finds it (``AWS_ACCESS_KEY_ID``, or ``MY_TEAM_S3_KEY`` on a
worker that names it so), and the value is read from the worker's environment when a task runs.
No field is a ``SecretStr``; every field is a variable name, checked as one.

Each block maps the names it is given onto the names the core reads (``AWS_*`` with the legacy
TAO names as fallbacks, ``HF_TOKEN``, ``NGC_KEY``) in an environment built in memory
(:meth:`CredentialSet.environ`); the core then applies its own rules to it — precedence of the
AWS names over the legacy ones included — so those rules exist once, in
:mod:`tao_data_io.credentials`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from prefect.blocks.abstract import CredentialsBlock
from pydantic import AfterValidator, Field, WithJsonSchema, model_validator

from blocks.presentation import DOCUMENTATION_URL, LOGO_URL, code_example
from blocks.picker import PICKABLE
from tao_data_io.credentials import AWS_TO_LEGACY, S3Credentials, s3_credentials_from_env
from tao_data_io.redaction import credential_shape_fields
from tao_data_io.errors import UsageError
from tao_data_io.names import ENV_NAME_PATTERN, check_credential_name
from tao_data_io.staging.pretrained import registry_for
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.uris import HFModelURI, NGCModelURI, parse_model_uri

if TYPE_CHECKING:
    from prefect_aws import AwsCredentials

    from tao_data_io.staging.pretrained.registry import Registry


def _env_name(value: str) -> str:
    """A variable's name — refused when it is a credential's value pasted into the field (a key's
    or token's shape: ``AKIA…``, ``ghp_…``; or a long run of mixed letters and digits, as an AWS
    secret key with no ``/`` or ``+`` is), which saving would store in Prefect in clear."""
    if credential_shape_fields(value) or _looks_random(value):
        raise ValueError("this field holds a credential's value (a key's or token's shape), not a variable name: give "
                         "the NAME of the variable on the worker that holds it, such as AWS_ACCESS_KEY_ID")
    return check_credential_name(value, what="variable name")


#: From this length, a name with no ``_`` that mixes lower and upper case letters and digits is
#: taken for a pasted key (an AWS secret key is 40 such characters, 3 times in 10 with no ``/`` or
#: ``+``); variable names are words joined by ``_``.
_RANDOM_FROM = 32


def _looks_random(value: str) -> bool:
    return (len(value) >= _RANDOM_FROM and value.isalnum() and value.isascii() and not value.isupper()
            and not value.islower() and any(c.isdigit() for c in value))


def refused_name_fields(data: Any) -> dict[str, str]:
    """Why a block document's ``data`` (as the UI or the API sends it to Prefect's server) cannot
    be stored: each field of :data:`ENV_NAME_FIELDS` whose value is not a variable's name, with
    what it must be — the fix, never the value. Prefect's server does not check a block document
    against its block's schema, and its v2 UI's form checks the values against nothing (it sends
    them as the schema), so :mod:`deployments.server` asks this before the server stores one."""
    if not isinstance(data, Mapping):
        return {}
    refused = {}
    for name in sorted(ENV_NAME_FIELDS & {key for key in data if isinstance(key, str)}):
        value = data[name]
        if value is None:
            continue
        try:
            if not isinstance(value, str):
                raise ValueError("not a string")
            _env_name(value)
        except (ValueError, UsageError):
            refused[name] = ("must be the NAME of the variable on the worker that holds the credential (letters, "
                             "digits and '_', such as AWS_SECRET_ACCESS_KEY), never the credential's value (nor a "
                             "variable that steers programs, such as PATH)")
    return refused


#: A field that holds the name of an environment variable (never a value). Its schema says so
#: too, for a form that checks it; Prefect's server does not, and its v2 UI checks nothing, so the
#: demo's server refuses a value that is not a name before storing it (:func:`refused_name_fields`).
EnvName = Annotated[str, AfterValidator(_env_name), WithJsonSchema({"type": "string", "pattern": ENV_NAME_PATTERN})]
#: Said once, in each credential block's description, rather than in every field's help.
_NAMES_ONLY = "Each field NAMES a worker's environment variable; no value is stored in Prefect."


def _name(default: str | None, title: str, holds: str) -> Any:
    return Field(default, title=title, description=f"The variable that holds {holds}.")


class _EnvCredentials(CredentialsBlock, ABC):
    """What the three credential blocks share: a table of (the name the core reads, the name this
    block says the worker uses), and the in-memory environment built from it. Prefect's
    ``CredentialsBlock``, so they are offered wherever Prefect asks for credentials; abstract, so
    ``prefect block register`` passes it over."""

    model_config = PICKABLE
    _logo_url = LOGO_URL
    _documentation_url = DOCUMENTATION_URL

    @abstractmethod
    def pairs(self) -> list[tuple[str, str | None]]:
        """(core name, configured name) for every variable this block maps."""

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) as the core should see it: this block's variables
        under the core's names. Built in memory; never logged, returned by a task or stored."""
        return CredentialSet((self,)).environ(base)


class S3EnvCredentials(_EnvCredentials):
    _block_type_name = "TAO S3 Credentials"
    _block_type_slug = "tao-s3-credentials"
    _description = f"Where a worker finds its S3 credentials. {_NAMES_ONLY}"
    _code_example = code_example("S3EnvCredentials", "s3_env_credentials",
                                 'client = s3_env_credentials.get_client("s3")  '
                                 "# boto3, from the worker's variables")

    access_key_id_env: EnvName = _name("AWS_ACCESS_KEY_ID", "Access key id", "the access key id")
    secret_access_key_env: EnvName = _name("AWS_SECRET_ACCESS_KEY", "Secret access key", "the secret access key")
    session_token_env: EnvName | None = _name("AWS_SESSION_TOKEN", "Session token",
                                              "a session token, for temporary credentials (empty: none)")
    endpoint_url_env: EnvName | None = _name("AWS_ENDPOINT_URL", "Endpoint URL",
                                             "the endpoint of an S3-compatible store (empty or unset: AWS)")
    region_env: EnvName | None = _name("AWS_DEFAULT_REGION", "Region", "the region")
    read_legacy_names: bool = Field(
        True, title="Also read TAO's legacy names",
        description="When a variable above is unset, read TAO's legacy name for it instead: "
                    f"{', '.join(AWS_TO_LEGACY.values())}.")

    @model_validator(mode="before")
    @classmethod
    def _fold_legacy_fields(cls, data: Any) -> Any:
        """A block saved with one field per legacy name (``access_key_id_legacy_env``, …) loads
        with them folded into ``read_legacy_names``: all four TAO's names, on; all cleared, off. A
        legacy name changed from TAO's own, or some cleared and not others, cannot be kept by one
        switch: refused naming the fields and the fix, never read differently from before."""
        old = {f"{field}_legacy_env": AWS_TO_LEGACY[aws] for field, aws in
               (("access_key_id", "AWS_ACCESS_KEY_ID"), ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
                ("endpoint_url", "AWS_ENDPOINT_URL"), ("region", "AWS_DEFAULT_REGION"))}
        if not isinstance(data, dict) or not old.keys() & data.keys():
            return data
        data = dict(data)
        given = {field: data.pop(field, legacy) for field, legacy in old.items()}  # absent: that form's default
        for field, value in given.items():
            if value not in (None, old[field]):
                raise ValueError(f"{field} {value!r}: legacy names other than TAO's own ({old[field]}) are no longer "
                                 f"read; set the matching field above to {value!r} instead and save the block again")
        cleared = sorted(field for field, value in given.items() if value is None)
        if cleared and len(cleared) < len(old):
            raise ValueError(f"{', '.join(cleared)} cleared but not the other legacy names: one switch "
                             "(read_legacy_names) now reads all four or none — choose it and save the block again")
        data.setdefault("read_legacy_names", not cleared)
        return data

    def pairs(self) -> list[tuple[str, str | None]]:
        def legacy(core: str) -> tuple[str, str | None]:
            return AWS_TO_LEGACY[core], AWS_TO_LEGACY[core] if self.read_legacy_names else None

        return [("AWS_ACCESS_KEY_ID", self.access_key_id_env), legacy("AWS_ACCESS_KEY_ID"),
                ("AWS_SECRET_ACCESS_KEY", self.secret_access_key_env), legacy("AWS_SECRET_ACCESS_KEY"),
                ("AWS_SESSION_TOKEN", self.session_token_env),
                ("AWS_ENDPOINT_URL", self.endpoint_url_env), legacy("AWS_ENDPOINT_URL"),
                ("AWS_DEFAULT_REGION", self.region_env), legacy("AWS_DEFAULT_REGION")]

    def credentials(self, base: Mapping[str, str] | None = None) -> S3Credentials:
        """The core's S3 credentials, resolved now by the core's rules (a missing variable is a
        CredentialError naming it)."""
        return s3_credentials_from_env(self.environ(base))

    def get_client(self, client_type: str = "s3") -> Any:
        """A boto3 S3 client from the worker's variables, built as the core builds its own
        (endpoint, region, retries): Prefect's ``CredentialsBlock`` interface, as prefect-aws's
        ``AwsCredentials.get_client("s3")``. Only S3: it is the one service these names are for."""
        if client_type != "s3":
            raise UsageError(f"client_type {client_type!r}: a TAO S3 credentials block gives S3 clients only "
                             "(client_type='s3')")
        return make_s3_client(self.credentials())

    def aws_credentials(self, base: Mapping[str, str] | None = None) -> AwsCredentials:
        """prefect-aws's ``AwsCredentials`` for code that wants a boto3 client from it, built in
        memory from :meth:`credentials`. It holds values: never ``save()`` it."""
        from prefect_aws import AwsCredentials

        resolved = self.credentials(base)
        return AwsCredentials(aws_access_key_id=resolved.access_key_id,
                              aws_secret_access_key=resolved.secret_access_key,
                              aws_session_token=resolved.session_token, region_name=resolved.region,
                              aws_client_parameters={"endpoint_url": resolved.endpoint_url}
                              if resolved.endpoint_url else {})


class _RegistryCredentials(_EnvCredentials, ABC):
    """A model registry's credentials: their client is the core's client of that registry, for one
    model URI (``listing()``: the resolved revision and every file's size and digest)."""

    _scheme: ClassVar[str]
    _uri_type: ClassVar[type]

    def get_client(self, model: str) -> Registry:
        """The core's client of this registry for ``model`` (a URI of its scheme), with this
        block's credentials: what a pull lists and fetches through."""
        uri = parse_model_uri(model)
        if not isinstance(uri, self._uri_type):
            raise UsageError(f"model {model!r} is not in this block's registry: give a {self._scheme} URI")
        return registry_for(uri, self.environ())


class HuggingFaceEnvCredentials(_RegistryCredentials):
    _block_type_name = "TAO Hugging Face Credentials"
    _block_type_slug = "tao-hugging-face-credentials"
    _description = f"Where a worker finds its Hugging Face token (hf://). {_NAMES_ONLY}"
    _code_example = code_example("HuggingFaceEnvCredentials", "hugging_face_env_credentials",
                                 'hub = hugging_face_env_credentials.get_client("hf://ORG/MODEL")\n'
                                 "print(hub.listing().revision)")
    _scheme, _uri_type = "hf://", HFModelURI

    token_env: EnvName = _name("HF_TOKEN", "Token", "the Hub token (public repos need none)")

    def pairs(self) -> list[tuple[str, str | None]]:
        return [("HF_TOKEN", self.token_env)]


class NGCEnvCredentials(_RegistryCredentials):
    _block_type_name = "TAO NGC Credentials"
    _block_type_slug = "tao-ngc-credentials"
    _description = f"Where a worker finds its NGC API key (ngc://). {_NAMES_ONLY}"
    _code_example = code_example("NGCEnvCredentials", "ngc_env_credentials",
                                 'ngc = ngc_env_credentials.get_client("ngc://ORG/TEAM/MODEL:VERSION")\n'
                                 "print(ngc.listing().revision)")
    _scheme, _uri_type = "ngc://", NGCModelURI

    key_env: EnvName = _name("NGC_KEY", "API key", "the NGC API key")

    def pairs(self) -> list[tuple[str, str | None]]:
        return [("NGC_KEY", self.key_env)]


@dataclass(frozen=True)
class CredentialSet(Mapping[str, str]):
    """The credential blocks a flow run uses, together: the environment the core should see.

    Why a mapping that holds names only: a verb passes its ``environ`` to the steps that need
    credentials, and the Prefect runner passes each step's arguments to its task. This mapping
    reads every value from the worker's environment when a step looks one up, and holds none
    itself — so what travels through the flow and its tasks is the variable names, never a
    value, and a value changed on the worker (a rotated token) is seen by the next step.
    """

    blocks: tuple[_EnvCredentials, ...] = ()

    def __getitem__(self, name: str) -> str:
        return self.environ()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.environ())

    def __len__(self) -> int:
        return len(self.environ())

    def __repr__(self) -> str:  # the names only, as the dataclass would, not the values a Mapping shows
        return f"CredentialSet(blocks={self.blocks!r})"

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) with each core name replaced by the value of the
        variable its block names (absent when that variable is unset). Every value is read from
        ``base``, so one block's mapping never feeds another's."""
        source = os.environ if base is None else base
        result = dict(source)
        pairs = [pair for block in self.blocks for pair in block.pairs()]
        values = {core: source.get(configured) if configured else None for core, configured in pairs}
        for core, value in values.items():
            result.pop(core, None)
            if value:
                result[core] = value
        return result

    @classmethod
    def of(cls, blocks: Iterable[_EnvCredentials | None]) -> CredentialSet:
        return cls(tuple(block for block in blocks if block is not None))


#: The fields of the credential blocks that hold a variable's NAME (:data:`EnvName`), by field
#: name, read from the blocks themselves: what :func:`refused_name_fields` checks in a block
#: document that Prefect's server is asked to save.
ENV_NAME_FIELDS = frozenset(name for block in (S3EnvCredentials, HuggingFaceEnvCredentials, NGCEnvCredentials)
                            for name in block.model_fields if name.endswith("_env"))
