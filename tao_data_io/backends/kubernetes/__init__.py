"""Kubernetes: every manifest a TAO job needs, rendered by pure functions (:mod:`.render`) from a
:class:`~tao_data_io.launch.plan.LaunchPlan` and :class:`.settings.KubernetesSettings`, with the
frame-side agents the pods run (:mod:`tao_data_io.launch.agents`); and the backend that applies them to a cluster
and follows the job (:mod:`.backend`, with :mod:`.api`, :mod:`.facts`, :mod:`.gates`,
:mod:`.apply`, :mod:`.waiting` and :mod:`.pods`).

The only package allowed to import the ``kubernetes`` client (the ``kubernetes`` extra): the
renderer builds plain dicts and needs no client, so ``render-job`` works without it.
"""

from ...launch.declaration import Declaration
from ...tier import Capabilities
from .settings import KubernetesSettings

DECLARATION = Declaration(
    settings=KubernetesSettings, implementation="tao_data_io.backends.kubernetes.backend:KubernetesBackend",
    install="tao-data-io[kubernetes]", title="Kubernetes",
    # Pods mount named claims (tier B) and, from 1.29 (native sidecars), fetch and upload themselves (tier C).
    capabilities=Capabilities(fetches_in_frame=True, binds_claims=True, multi_node=True, replaces_disrupted=True),
    summary="Run each job as a Kubernetes Job, on the in-cluster configuration or a kubeconfig context. Nothing "
            "about access is stored in Prefect.",
    settings_summary="The namespace, the kubeconfig context's NAME, the claim, Secret NAMES, images, TTL and "
                     "scheduling of each job's objects; names only, never the kubeconfig or a Secret's contents.")
