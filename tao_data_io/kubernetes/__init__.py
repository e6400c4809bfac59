"""Kubernetes: every manifest a TAO job needs, rendered by pure functions (:mod:`.render`) from a
:class:`~tao_data_io.launch.plan.LaunchPlan` and :class:`.settings.KubernetesSettings`, with the
static scripts the pods run (:mod:`.scripts`); and the backend that applies them to a cluster
and follows the job (:mod:`.backend`, with :mod:`.api`, :mod:`.facts`, :mod:`.gates`,
:mod:`.apply`, :mod:`.waiting` and :mod:`.pods`).

The only package allowed to import the ``kubernetes`` client (the ``kubernetes`` extra): the
renderer builds plain dicts and needs no client, so ``render-job`` works without it.
"""
