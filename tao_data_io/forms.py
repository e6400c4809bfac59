"""The request's JSON schema as a form: what the Prefect server checks a run's parameters against
before any worker sees them, and what its UI draws the run form from.

Why here and not only in the validators: the Prefect server validates a deployment run's
parameters against the flow's JSON schema when the run is *created* (``enforce_parameter_schema``),
so what the schema says is refused — an unknown field, a wrong type, a well-known credential's
shape in any text — never reaches a worker, and never lands in the server's database as a run's
parameters. The model's own validators still run on the worker (they say more, and the CLI has
no server): the schema only moves the common refusals earlier.

Every text of the form carries ``not: {pattern: CREDENTIAL_SHAPES}``, including the free-form
spec's values and keys at any depth (:data:`SpecTree`, a recursive schema) and the keys of the request's
mappings (``propertyNames``). The runtime check is the same pattern
(:func:`~tao_data_io.redaction.credential_shape_fields`), so the CLI refuses what the server does.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BeforeValidator, WithJsonSchema
from pydantic.config import JsonDict
from typing_extensions import TypeAliasType

from .redaction import CREDENTIAL_SHAPES, SECRET_NAME_WORDS, SECRET_NAMES

#: What every text of a form may not hold.
NO_CREDENTIAL = {"not": {"pattern": CREDENTIAL_SHAPES}}


def _any_case(word: str) -> str:
    """``word`` as a JSON schema pattern of any case: the schema's regular expressions (ECMA 262,
    as the server's and the UI's validators read them) have no flag for it."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


#: A credential's variable name (:func:`~tao_data_io.credentials.is_secret_name`) as a pattern:
#: a value has no shape to know a pasted secret access key by, its name has.
SECRET_NAME = "|".join([*(f"^{name}$" for name in sorted(SECRET_NAMES)), *map(_any_case, SECRET_NAME_WORDS)])
#: The names of a request's plain variables: never a credential's shape, never a credential's name
#: (a credential is forwarded by name, ``forward_env``), so the server refuses it before storing it.
PLAIN_VARIABLE_NAMES: JsonDict = {
    "propertyNames": {"not": {"anyOf": [{"pattern": CREDENTIAL_SHAPES}, {"pattern": SECRET_NAME}]}}}
#: Keys that make a string schema a choice among fixed words (nothing to guard).
_FIXED = ("enum", "const")
#: Where a JSON schema keeps the schemas it is made of.
_NESTED_ONE = ("items", "additionalProperties")
_NESTED_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")

#: A text that refuses a credential's shape, in the form (a parameter of its own, or inside a model).
GuardedText = Annotated[str, WithJsonSchema({"type": "string", **NO_CREDENTIAL})]
#: What a :data:`SpecTree` ends in.
_SpecLeaf = Union[GuardedText, bool, int, float, None]
#: A JSON value whose every text is guarded, a mapping's keys too, at any depth: the form's view of a TAO spec.
SpecTree = TypeAliasType("SpecTree", Union[_SpecLeaf, list["SpecTree"], dict[GuardedText, "SpecTree"]])  # type: ignore[misc]  # mypy cannot resolve a TypeAliasType naming itself (python/mypy#18252)


def _as_is(value: Any) -> Any:
    return value


#: A spec mapping, validated as ``dict[str, Any]`` (a YAML date stays a date, as it always was) but
#: drawn and checked by the server as a :data:`SpecTree`.
SpecMapping = Annotated[dict[str, Any], BeforeValidator(_as_is, json_schema_input_type=dict[str, SpecTree])]


def guard_texts(schema: dict[str, Any], *_: Any) -> None:
    """``json_schema_extra`` of the request's models: every free text among ``schema``'s
    properties, at any depth, refuses a credential's shape. A reference to another model is left
    alone (that model guards its own)."""
    for prop in schema.get("properties", {}).values():
        _guard(prop)


def _guard(schema: Any) -> None:
    if not isinstance(schema, dict) or "$ref" in schema:
        return
    if schema.get("type") == "string" and not any(key in schema for key in _FIXED) and "not" not in schema:
        schema.update(NO_CREDENTIAL)
    if schema.get("type") == "object" and "propertyNames" not in schema:
        schema["propertyNames"] = dict(NO_CREDENTIAL)  # a key can be the pasted credential
    for key in _NESTED_ONE:
        _guard(schema.get(key))
    for key in _NESTED_MANY:
        for child in schema.get(key, ()):
            _guard(child)
