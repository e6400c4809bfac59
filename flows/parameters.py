"""The flows' parameters as the Prefect server checks them when a run is created: the schema
Prefect builds from a flow's signature, closed where it stays open.

Prefect builds a deployment's parameter schema from the flow's signature (``ParameterSchema``,
in ``prefect deploy`` as in ``to_deployment``), and checks a run's parameters against it before
storing them (``enforce_parameter_schema``). Two doors stay open there, and what passes them is
stored as the run's parameters until a worker runs it:

- **any parameter name**: the schema's top level admits what the flow does not take. The worker
  then crashes binding it, before the flow's first line, where nothing of ours masks;
- **a block reference's text**: the server checks ``{"$ref": …}`` against a branch of its own
  (``preprocess_schema``) that takes any text, as a value or under any key.

``ParameterSchema`` has no field for the first, and the server writes the second itself, so the
schema is closed on the server once the deployment exists (``python -m deployments.schemas``):
no parameter beyond the flow's, and a reference only by a block's id or ``TYPE/NAME``.
"""

from __future__ import annotations

import copy
from typing import Any

from tao_data_io.forms import NO_CREDENTIAL

#: A block document's id, as the run form's picker sends it.
_BLOCK_ID = {"type": "string", "pattern": "^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$"}
#: What ``Block.load_from_ref`` loads: an id, ``{"block_document_id": id}`` or ``{"block_document_slug": TYPE/NAME}``.
_BLOCK_REFERENCE = {"anyOf": [
    _BLOCK_ID,
    {"type": "object", "properties": {"block_document_id": _BLOCK_ID}, "required": ["block_document_id"],
     "additionalProperties": False},
    {"type": "object", "properties": {"block_document_slug": {"type": "string", **NO_CREDENTIAL}},
     "required": ["block_document_slug"], "additionalProperties": False},
]}
#: Beside each use of a block: a mapping whose ``$ref`` is not a reference is refused.
_NOT_A_REFERENCE = {"type": "object", "required": ["$ref"], "properties": {"$ref": {"not": _BLOCK_REFERENCE}}}


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of the parameter schema ``schema`` (a deployment's ``parameter_openapi_schema``)
    that refuses a parameter the flow does not take and any reference to a block but its id or
    ``TYPE/NAME``, at any depth (a nested block's too). Closing a closed schema changes nothing."""
    result = copy.deepcopy(schema)
    result["additionalProperties"] = False
    definitions = result.get("definitions", {})
    blocks = {f"#/definitions/{name}" for name, definition in definitions.items() if "block_type_slug" in definition}
    _guard_references(result.get("properties", {}), blocks)
    _guard_references(definitions, blocks)
    return result


def _guard_references(schema: Any, blocks: set[str]) -> None:
    """Put the reference guard beside every use of a block in ``schema``. A use is a ``$ref`` that
    pydantic writes with the field's title and description only: the guard is its only ``not``
    (the texts' guards never go beside a ``$ref``: :func:`tao_data_io.forms.guard_texts`)."""
    if isinstance(schema, dict):
        for child in list(schema.values()):
            _guard_references(child, blocks)
        if isinstance(schema.get("$ref"), str) and schema["$ref"] in blocks:
            schema["not"] = copy.deepcopy(_NOT_A_REFERENCE)
    elif isinstance(schema, list):
        for child in schema:
            _guard_references(child, blocks)
