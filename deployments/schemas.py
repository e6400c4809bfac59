"""Settle the parameters of this project's deployments on the Prefect server, after each deploy:
close their schemas (no parameter the flow does not take, a block reference only by its id or
``TYPE/NAME``), and point each block parameter's default at its saved block by id.

    .venv/bin/prefect deploy --all
    .venv/bin/python -m deployments.schemas      # after every `prefect deploy`, which writes them open again

Why a step of its own: ``prefect deploy`` writes the schema Prefect builds from each flow's
signature, whose model has no room for a closed top level (:mod:`flows.parameters` says what
stays open and what it lets the server store); the server keeps the schema it is given, and takes
a closed one through its API. The defaults, because Prefect's run form draws a block parameter as
the block's picker only when its value is a reference by id — what the picker itself sends — and
a deployment file can name a block only as ``TYPE/NAME``, whose id each server gives its own: the
form opened on a text box, and choosing the picker there lost the default. Deployments of other
flows are left alone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Sequence
from typing import Any
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import DeploymentUpdate
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowFilter, FlowFilterName
from prefect.client.schemas.responses import DeploymentResponse
from prefect.exceptions import ObjectNotFound

from flows.cancel import cancel_tao_job
from flows.collect import collect_tao_job
from flows.parameters import closed
from flows.resync import resync_tao_outputs
from flows.run import run_tao_job
from flows.submit import submit_tao_job

FLOW_NAMES = tuple(flow.name for flow in (submit_tao_job, collect_tao_job, run_tao_job, cancel_tao_job,
                                          resync_tao_outputs))


def close_parameter_schemas(deployment_ids: Collection[UUID] = ()) -> list[str]:
    """Close the parameter schema of every deployment of this project's flows (only those of
    ``deployment_ids``, when given) and pick its block parameters' saved blocks; returns one line
    per deployment."""
    only = DeploymentFilter(id=DeploymentFilterId(any_=list(deployment_ids))) if deployment_ids else None
    said = []
    with get_client(sync_client=True) as client:
        for deployment in client.read_deployments(flow_filter=FlowFilter(name=FlowFilterName(any_=list(FLOW_NAMES))),
                                                  deployment_filter=only):
            shown = f"{client.read_flow(deployment.flow_id).name}/{deployment.name}"
            schema = closed(deployment.parameter_openapi_schema or {})
            parameters, picked = _picked(client, deployment)
            closing = schema != deployment.parameter_openapi_schema
            changed = {**({"parameter_openapi_schema": schema} if closing else {}),
                       **({"parameters": parameters} if parameters != deployment.parameters else {})}
            if changed:  # one update for both
                client.update_deployment(deployment.id, DeploymentUpdate(**changed))
            said.append(f"{shown}: {'closed' if closing else 'closed already'}" + "".join(f"; {x}" for x in picked))
            if not deployment.enforce_parameter_schema:
                said[-1] += (" — but it does not enforce its schema: the server checks nothing (deploy it again "
                             "without --no-enforce-parameter-schema)")
    return said


def _picked(client: SyncPrefectClient, deployment: DeploymentResponse) -> tuple[dict[str, Any], list[str]]:
    """The deployment's parameters with each block parameter's ``TYPE/NAME`` (its own, or else the
    flow's default) replaced by a reference to that saved block by id, and a line for what was
    picked or could not be."""
    schema = deployment.parameter_openapi_schema or {}
    parameters = dict(deployment.parameters)
    said = []
    for parameter, slugs in _block_types(schema).items():
        value = parameters.get(parameter, schema["properties"][parameter].get("default"))
        if not isinstance(value, str) or value.partition("/")[0] not in slugs:
            continue
        block_type, _, block = value.partition("/")
        try:
            saved = client.read_block_document_by_name(block, block_type)
        except ObjectNotFound:
            said.append(f"{parameter}: {value} is not saved (left as text; save it and run this again)")
            continue
        parameters[parameter] = {"$ref": {"block_document_id": str(saved.id)}}
        said.append(f"{parameter} picked: {value}")
    return parameters, said


def _block_types(schema: dict[str, Any]) -> dict[str, set[str]]:
    """Each parameter of ``schema`` that may be a block, with the slugs of the block types it takes."""
    definitions = schema.get("definitions", {})
    found = {}
    for parameter, prop in schema.get("properties", {}).items():
        refs = [prop.get("$ref"), *(branch.get("$ref") for branch in prop.get("anyOf", []))]
        slugs = {definitions.get(ref.rsplit("/", 1)[-1], {}).get("block_type_slug") for ref in refs if ref}
        slugs.discard(None)
        if slugs:
            found[parameter] = slugs
    return found


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m deployments.schemas", description=__doc__.split("\n\n")[0]).parse_args(argv)
    said = close_parameter_schemas()
    for line in said or [f"no deployment of {', '.join(FLOW_NAMES)} on this server: run `prefect deploy --all` "
                         "first"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
