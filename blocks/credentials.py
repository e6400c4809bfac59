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
from typing import TYPE_CHECKING, Annotated

from prefect.blocks.core import Block
from pydantic import AfterValidator, Field

from blocks.picker import PICKABLE
from tao_data_io.credentials import AWS_TO_LEGACY, S3Credentials, s3_credentials_from_env
from tao_data_io.names import ENV_NAME_RULE, check_credential_name

if TYPE_CHECKING:
    from prefect_aws import AwsCredentials


def _env_name(value: str) -> str:
    return check_credential_name(value, what="variable name")


#: A field that holds the name of an environment variable (never a value).
EnvName = Annotated[str, AfterValidator(_env_name)]
_NAME_HELP = f"The NAME of an environment variable on the worker ({ENV_NAME_RULE}), never its value."


def _name(default: str | None, title: str, what: str) -> object:
    return Field(default, title=title, description=f"{what} {_NAME_HELP}")


class _EnvCredentials(Block, ABC):
    """What the three credential blocks share: a table of (the name the core reads, the name this
    block says the worker uses), and the in-memory environment built from it. Abstract, so
    ``prefect block register`` passes it over."""

    model_config = PICKABLE

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
    _description = ("Where a worker finds its S3 credentials: names of environment variables, read on the worker "
                    "when a task runs. No value is stored in Prefect.")

    access_key_id_env: EnvName = _name("AWS_ACCESS_KEY_ID", "Access key id variable", "Holds the access key id.")
    access_key_id_legacy_env: EnvName | None = _name(
        AWS_TO_LEGACY["AWS_ACCESS_KEY_ID"], "Access key id variable (legacy)",
        "Read when the first is unset: the legacy TAO name.")
    secret_access_key_env: EnvName = _name("AWS_SECRET_ACCESS_KEY", "Secret access key variable",
                                           "Holds the secret access key.")
    secret_access_key_legacy_env: EnvName | None = _name(
        AWS_TO_LEGACY["AWS_SECRET_ACCESS_KEY"], "Secret access key variable (legacy)",
        "Read when the first is unset: the legacy TAO name.")
    session_token_env: EnvName | None = _name("AWS_SESSION_TOKEN", "Session token variable",
                                              "Holds a session token, for temporary credentials.")
    endpoint_url_env: EnvName | None = _name("AWS_ENDPOINT_URL", "Endpoint URL variable",
                                             "Holds the endpoint of an S3-compatible store (unset: AWS).")
    endpoint_url_legacy_env: EnvName | None = _name(
        AWS_TO_LEGACY["AWS_ENDPOINT_URL"], "Endpoint URL variable (legacy)",
        "Read when the first is unset: the legacy TAO name.")
    region_env: EnvName | None = _name("AWS_DEFAULT_REGION", "Region variable", "Holds the region.")
    region_legacy_env: EnvName | None = _name(AWS_TO_LEGACY["AWS_DEFAULT_REGION"], "Region variable (legacy)",
                                              "Read when the first is unset: the legacy TAO name.")

    def pairs(self) -> list[tuple[str, str | None]]:
        return [
            ("AWS_ACCESS_KEY_ID", self.access_key_id_env),
            (AWS_TO_LEGACY["AWS_ACCESS_KEY_ID"], self.access_key_id_legacy_env),
            ("AWS_SECRET_ACCESS_KEY", self.secret_access_key_env),
            (AWS_TO_LEGACY["AWS_SECRET_ACCESS_KEY"], self.secret_access_key_legacy_env),
            ("AWS_SESSION_TOKEN", self.session_token_env),
            ("AWS_ENDPOINT_URL", self.endpoint_url_env),
            (AWS_TO_LEGACY["AWS_ENDPOINT_URL"], self.endpoint_url_legacy_env),
            ("AWS_DEFAULT_REGION", self.region_env),
            (AWS_TO_LEGACY["AWS_DEFAULT_REGION"], self.region_legacy_env),
        ]

    def credentials(self, base: Mapping[str, str] | None = None) -> S3Credentials:
        """The core's S3 credentials, resolved now by the core's rules (a missing variable is a
        CredentialError naming it)."""
        return s3_credentials_from_env(self.environ(base))

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


class HuggingFaceEnvCredentials(_EnvCredentials):
    _block_type_name = "TAO Hugging Face Credentials"
    _block_type_slug = "tao-hugging-face-credentials"
    _description = ("Where a worker finds its Hugging Face token (for hf:// models): the name of an environment "
                    "variable, read on the worker. No value is stored in Prefect.")

    token_env: EnvName = _name("HF_TOKEN", "Token variable", "Holds the Hub token (public repos need none).")

    def pairs(self) -> list[tuple[str, str | None]]:
        return [("HF_TOKEN", self.token_env)]


class NGCEnvCredentials(_EnvCredentials):
    _block_type_name = "TAO NGC Credentials"
    _block_type_slug = "tao-ngc-credentials"
    _description = ("Where a worker finds its NGC API key (for ngc:// models): the name of an environment "
                    "variable, read on the worker. No value is stored in Prefect.")

    key_env: EnvName = _name("NGC_KEY", "API key variable", "Holds the NGC API key.")

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
