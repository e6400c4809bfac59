"""Close the parameter schemas of this project's deployments on the Prefect server: no parameter
the flow does not take, and a block reference only by its id or ``TYPE/NAME``.

    .venv/bin/prefect deploy --all
    .venv/bin/python -m deployments.schemas      # after every `prefect deploy`, which writes them open again

Why a step of its own: ``prefect deploy`` writes the schema Prefect builds from each flow's
signature, whose model has no room for a closed top level (:mod:`flows.parameters` says what
stays open and what it lets the server store); the server keeps the schema it is given, and takes
a closed one through its API. Deployments of other flows are left alone.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Sequence
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import DeploymentUpdate
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowFilter, FlowFilterName

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
    ``deployment_ids``, when given); returns one line per deployment."""
    only = DeploymentFilter(id=DeploymentFilterId(any_=list(deployment_ids))) if deployment_ids else None
    said = []
    with get_client(sync_client=True) as client:
        for deployment in client.read_deployments(flow_filter=FlowFilter(name=FlowFilterName(any_=list(FLOW_NAMES))),
                                                  deployment_filter=only):
            shown = f"{client.read_flow(deployment.flow_id).name}/{deployment.name}"
            schema = closed(deployment.parameter_openapi_schema or {})
            if schema == deployment.parameter_openapi_schema:
                said.append(f"{shown}: closed already")
            else:
                client.update_deployment(deployment.id, DeploymentUpdate(parameter_openapi_schema=schema))
                said.append(f"{shown}: closed")
            if not deployment.enforce_parameter_schema:
                said[-1] += (" — but it does not enforce its schema: the server checks nothing (deploy it again "
                             "without --no-enforce-parameter-schema)")
    return said


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m deployments.schemas", description=__doc__.split("\n\n")[0]).parse_args(argv)
    said = close_parameter_schemas()
    for line in said or [f"no deployment of {', '.join(FLOW_NAMES)} on this server: run `prefect deploy --all` "
                         "first"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
