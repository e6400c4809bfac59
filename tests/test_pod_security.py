"""The API stand-in's Pod Security admission refuses exactly what upstream's does: every pass and
fail fixture of kubernetes/pod-security-admission (test/testdata/<level>/v<version>/, vendored in
tests/data/pod-security/) at both levels, for the first and the last Kubernetes version this
project supports. A fixture it admitted that upstream refuses, or the reverse, fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from .kube.pod_security import pod_security_violations

FIXTURES = Path(__file__).parent / "data" / "pod-security"
VERSIONS = {"1.29": (1, 29), "1.32": (1, 32)}


def fixtures() -> list[Any]:
    cases = []
    for level in ("baseline", "restricted"):
        for shown, version in VERSIONS.items():
            for case in yaml.safe_load_all((FIXTURES / f"{level}-v{shown}.yaml").read_text()):
                cases.append(pytest.param(level, version, case["expect"], case["pod"],
                                          id=f"{level}-v{shown}-{case['fixture']}"))
    return cases


@pytest.mark.parametrize(("level", "version", "expect", "pod"), fixtures())
def test_the_stand_ins_pod_security_agrees_with_upstreams_fixtures(level: str, version: tuple[int, int],
                                                                   expect: str, pod: dict[str, Any]) -> None:
    found = pod_security_violations(pod, level, version)
    assert (found == []) == (expect == "pass"), found


def test_every_level_and_version_has_fixtures_of_both_outcomes() -> None:
    """The vendored files are whole: a truncated copy would make the test above pass vacuously."""
    for level, least in (("baseline", 40), ("restricted", 88)):
        for shown in VERSIONS:
            cases = yaml.safe_load_all((FIXTURES / f"{level}-v{shown}.yaml").read_text())
            outcomes = [case["expect"] for case in cases]
            assert len(outcomes) >= least and {"pass", "fail"} == set(outcomes)


def test_a_refusal_lists_baseline_checks_then_restricted_ones_each_in_id_order() -> None:
    """policy/registry.go orders a refusal's checks: baseline IDs sorted, then restricted IDs
    sorted, a restricted check replacing its baseline form (hostPath volumes are reported as a
    restricted volume type)."""
    pod = {"spec": {"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
                    "containers": [{"name": "c", "image": "i", "securityContext": {"privileged": True}}]}}
    assert [v.split(" (")[0] for v in pod_security_violations(pod, "baseline")] == [
        "host namespaces", "hostPath volumes", "privileged"]
    assert [v.split(" (")[0] for v in pod_security_violations(pod, "restricted")] == [
        "host namespaces", "privileged", "allowPrivilegeEscalation != false", "unrestricted capabilities",
        "restricted volume types", "runAsNonRoot != true", "seccompProfile"]


@pytest.mark.parametrize(("pod", "version", "refused"), [
    ({"spec": {"securityContext": {"seLinuxOptions": {"type": "container_engine_t"}}, "containers": []}},
     (1, 30), True),
    ({"spec": {"securityContext": {"seLinuxOptions": {"type": "container_engine_t"}}, "containers": []}},
     (1, 31), False),
    ({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": ""}},
      "spec": {"containers": [{"name": "c", "image": "i"}]}}, (1, 32), False),
], ids=["container_engine_t before 1.31", "container_engine_t from 1.31", "an AppArmor annotation naming no profile"])
def test_baseline_rules_the_fixtures_do_not_cover_follow_the_standard(pod: dict[str, Any], version: tuple[int, int],
                                                                      refused: bool) -> None:
    assert bool(pod_security_violations(pod, "baseline", version)) == refused
