"""Kubernetes: every manifest a TAO job needs, rendered by pure functions (:mod:`.render`) from a
:class:`~tao_data_io.launch.plan.LaunchPlan` and :class:`.settings.RenderSettings`, with the
static scripts the pods run (:mod:`.scripts`).

The only package allowed to import the ``kubernetes`` client (the ``kubernetes`` extra): the
renderer itself builds plain dicts and needs no client; applying them is a later step.
"""
