"""The tier decision table (:func:`tao_data_io.tier.choose_tier`), what it refuses, and what a
backend cannot honour."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.tier import Capabilities, ClusterFacts, VolumeFacts, choose_tier

from .helpers import req


S3_INPUT = {"inputs": [{"source": "s3://bkt-1/coco/"}]}
LOCAL_INPUT = {"inputs": [{"source": "/pvc/coco", "target": "/data/coco"}]}
BOUND = VolumeFacts(name="data", phase="Bound")
#: What the decision reads: a cluster's frames mount claims and fetch their own inputs; a host
#: stages them itself; an old cluster only mounts claims.
CLUSTER = Capabilities(fetches_in_frame=True, binds_claims=True)
HOST = Capabilities(stages_on_host=True)
CLAIMS_ONLY = Capabilities(binds_claims=True)


@pytest.mark.parametrize(("fields", "facts", "tier", "fragment"), [
    (LOCAL_INPUT, ClusterFacts(backend="kubernetes", capabilities=CLUSTER), "A", "pre-positioned"),
    ({**LOCAL_INPUT, "storage": {"air_gapped": True}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER),
     "A", "air-gapped"),
    (S3_INPUT, ClusterFacts(backend="local", capabilities=HOST), "B", "staging root"),
    ({**S3_INPUT, "storage": {"pvc_claim": "data"}},
     ClusterFacts(backend="kubernetes", capabilities=CLUSTER, volumes=[BOUND]), "B", "Bound"),
    ({**S3_INPUT, "storage": {"pvc_claim": "data"}},
     ClusterFacts(backend="kubernetes", capabilities=CLUSTER,
                  volumes=[BOUND.model_copy(update={"holds_inputs": True})]), "B", "nothing moves"),
    (S3_INPUT, ClusterFacts(backend="kubernetes", capabilities=CLUSTER, volumes=[BOUND]), "C", "names none"),
    ({**S3_INPUT, "storage": {"pvc_claim": "data"}},
     ClusterFacts(backend="kubernetes", capabilities=CLUSTER,
                  volumes=[BOUND.model_copy(update={"phase": "Pending"})]), "C", "Pending"),
    ({**S3_INPUT, "storage": {"tier": "C", "pvc_claim": "data"}},
     ClusterFacts(backend="kubernetes", capabilities=CLUSTER, volumes=[BOUND]), "C", "was asked"),
    ({**LOCAL_INPUT, "storage": {"tier": "B"}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER),
     "A", "nothing moves"),
], ids=["pre-positioned", "air-gapped-local", "local-frame", "bound-pvc", "cache-hit", "no-claim-named",
        "claim-pending", "explicit-c", "b-asked-nothing-remote"])
def test_choose_tier(fields: dict[str, Any], facts: ClusterFacts, tier: str, fragment: str) -> None:
    decision = choose_tier(req(mode="args", command="train", args=[], **fields), facts)
    assert decision.tier == tier and fragment in decision.reason, decision
    named_otherwise = facts.model_copy(update={"backend": "a-third-backend"})  # the decision reads abilities only
    assert choose_tier(req(mode="args", command="train", args=[], **fields), named_otherwise).tier == tier


@pytest.mark.parametrize(("fields", "facts", "fragment"), [
    ({**S3_INPUT, "storage": {"air_gapped": True}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER), "s3://bkt-1/coco/"),
    (S3_INPUT, ClusterFacts(backend="kubernetes", capabilities=CLUSTER, air_gapped=True), "air-gapped"),
    ({**S3_INPUT, "storage": {"tier": "A"}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER), "impossible"),
    ({**S3_INPUT, "storage": {"tier": "B"}}, ClusterFacts(backend="kubernetes", capabilities=CLUSTER), "needs a Bound"),
    ({**S3_INPUT, "storage": {"tier": "C"}}, ClusterFacts(backend="kubernetes", capabilities=CLAIMS_ONLY), "1.29"),
    (S3_INPUT, ClusterFacts(backend="kubernetes", capabilities=CLAIMS_ONLY), "no tier is possible"),
], ids=["air-gapped-remote", "cluster-air-gapped", "a-with-remote", "b-without-pvc", "c-unsupported", "nothing-works"])
def test_choose_tier_refusals(fields: dict[str, Any], facts: ClusterFacts, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        choose_tier(req(mode="args", command="train", args=[], **fields), facts)
    with pytest.raises(UsageError, match=fragment):
        choose_tier(req(mode="args", command="train", args=[], **fields),
                    facts.model_copy(update={"backend": "a-third-backend"}))


def test_tier_c_warns_about_idle_gpus_above_the_threshold() -> None:
    facts = ClusterFacts(backend="kubernetes", capabilities=CLUSTER, input_bytes=50 * 1024**3)
    decision = choose_tier(req(mode="args", command="train", args=[], **S3_INPUT), facts)
    assert decision.tier == "C" and "idle GPU" in decision.warnings[0]
    assert choose_tier(req(mode="args", command="train", args=[], **S3_INPUT),
                       facts.model_copy(update={"input_bytes": 1024})).warnings == []


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"storage": {"pvc_claim": "data"}}, "storage.pvc_claim 'data' names a volume claim, which the host backend does "
                                         "not mount: drop storage.pvc_claim"),
    ({"compute_shape": {"nodes": 2}}, "compute_shape.nodes 2 asks for 2 nodes, and the host backend runs a job on one"),
    ({"compute_shape": {"disruption_retries": 2}}, "compute_shape.disruption_retries 2 asks for a lost pod to be "
                                                   "replaced, which the host backend never does"),
], ids=["claim", "multi-node", "disruption-retries"])
def test_what_a_backend_cannot_honour_is_refused_naming_the_field_and_the_backend(fields: dict[str, Any],
                                                                                 fragment: str) -> None:
    from tao_data_io.tier import refuse_unsupported

    request = req(mode="args", command="train", args=[], **S3_INPUT, **fields)
    with pytest.raises(UsageError, match=re.escape(fragment)):
        refuse_unsupported(request, "host", HOST)
    refuse_unsupported(request, "cluster", Capabilities(binds_claims=True, multi_node=True, replaces_disrupted=True))
