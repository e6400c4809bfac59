"""The Kubernetes stand-in the backend's tests run against, split by the component each part
imitates, each module naming the upstream code it follows:

* :mod:`.apiserver` — the API server over real HTTP (kmock), selectors, dry run, graceful
  deletion, garbage collection, injected faults; :class:`.apiserver.KubeStandIn` runs it;
* :mod:`.validation` — the names and labels the API server refuses;
* :mod:`.rbac` — request info and the RBAC authorizer, from the Role this project ships;
* :mod:`.admission` — the LimitRanger and quota admission; :mod:`.pod_security` — Pod Security;
* :mod:`.control_plane` — one look at a Job: :mod:`.job_controller` (pods, the failure policy,
  conditions by version), :mod:`.kubelet` (each pod's steps, termination, evictions) and
  :mod:`.volumes` (ownership and fsGroup on a claim's volume);
* :mod:`.kueue` — Kueue's webhook, Workloads, admission and eviction.

Tests of the stand-in itself, pinning each modelled rule to upstream, are ``tests/test_standin_*.py``.
"""
