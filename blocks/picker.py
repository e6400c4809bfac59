"""What makes a block a parameter type the Prefect UI draws as a picker and the server accepts a
reference to: a schema closed to unknown fields.

Why: the server checks a reference to a saved block (``{"$ref": {"block_document_id": …}}``)
against ``oneOf`` [the block's own schema, a reference]. A block whose fields are all optional
and whose schema admits unknown fields matches both branches, so every reference is refused
("valid under each of"; Prefect issue #14393). A closed schema leaves the reference only its
branch. Loading stays as Prefect's (a saved document with an old field still loads): only the
schema is closed.

Its texts also refuse a well-known credential's shape, as the request's do
(:func:`tao_data_io.forms.guard_texts`): the form is where a key gets pasted into a field meant
for a variable's name, and what the form saves is stored by Prefect in clear.
"""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block, schema_extra
from pydantic import ConfigDict

from tao_data_io.forms import guard_texts


def _closed(schema: dict[str, Any], model: type[Block]) -> None:
    schema_extra(schema, model)
    schema["additionalProperties"] = False
    guard_texts(schema)


#: ``model_config`` of a block that is a flow parameter.
PICKABLE = ConfigDict(json_schema_extra=_closed)  # type: ignore[typeddict-item]
