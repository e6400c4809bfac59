"""Names derived from job ids: every object a job's render makes has a name a real API server
takes (the stand-in's rules, :func:`tests.kube.validation.invalid`), and no two valid job ids — nor
two roles of one id — share a name within a kind, whatever the ids look like; ids the project
mints begin with a letter."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tao_data_io.backends.kubernetes.apply import creation_order, secret_object
from tao_data_io.backends.kubernetes.render import render_job
from tao_data_io.backends.kubernetes.settings import KubernetesSettings
from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.names import mint_job_id
from tao_data_io.records import JobRecord, RecordStore
from tao_data_io.request import JobRequest

from .kube.validation import invalid
from .kube_helpers import DNS_1035, ITS_CREDENTIALS_BASE, ITS_FILES_BASE, LONG_ID, STAGER, plan_for, req

#: The job id rule (docs/requests.md: 1-52 lowercase letters, digits or '-', a letter or digit at each end).
JOB_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobRequest, LaunchPlan, JobRecord]:
    """A job with every kind and role of object: tier B (a stage Job of 4 shards) of 2 nodes (a
    Service, an Indexed training Job), forwarding credentials (the per-job Secret)."""
    request = req(compute_shape={"gpus": 8, "nodes": 2}, inputs=[{"source": "s3://bkt-1/data/", "target": "/data"}])
    plan, record = plan_for(request, tmp_path_factory.mktemp("names"), "B")
    return request, plan, record


def objects_of(job: tuple[JobRequest, LaunchPlan, JobRecord], job_id: str) -> list[dict[str, Any]]:
    """Everything the backend would create for ``job`` under ``job_id``, the per-job Secret included."""
    request, plan, record = job
    rendered = render_job(plan.model_copy(update={"job_id": job_id}),
                          KubernetesSettings(namespace="default", stager_image=STAGER, pvc_claim="tao-data", shards=4),
                          request=request, record=record.model_copy(update={"job_id": job_id}), config=None,
                          environ={})
    return creation_order(rendered, secret_object(rendered, None))


def names_of(job: tuple[JobRequest, LaunchPlan, JobRecord], job_id: str) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in objects_of(job, job_id)]


def look_alikes(job_id: str, names: list[tuple[str, str]]) -> list[str]:
    """Valid ids shaped to meet ``job_id``'s names: each name, each name less a role's suffix or a
    hash-looking tail, the id plus ``-stage`` (and less it), the id plus a hash-looking tail."""
    digest = hashlib.sha256(job_id.encode()).hexdigest()
    found = {job_id + "-stage", job_id.removesuffix("-stage"), *(f"{job_id}-{digest[:k]}" for k in range(1, 11))}
    for _, name in names:
        base = name
        for suffix in ("-files", "-credentials", "-stage"):
            base = base.removesuffix(suffix)
        found |= {name, base, base.rsplit("-", 1)[0], name.rsplit("-", 1)[0], name[:52].rstrip("-")}
    return sorted(candidate for candidate in found if JOB_ID.fullmatch(candidate) and candidate != job_id)


_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"


def _job_id_of(length: int) -> st.SearchStrategy[str]:
    ends = st.text(_ALNUM, min_size=1, max_size=1)
    if length == 1:
        return ends
    return st.tuples(ends, st.text(_ALNUM + "-", min_size=length - 2, max_size=length - 2), ends).map("".join)


#: Valid ids of every length alike (the boundaries, 46-52, are where derived names change shape).
job_ids = st.integers(1, 52).flatmap(_job_id_of)


@pytest.mark.parametrize(("first", "second"), [
    (LONG_ID, ITS_FILES_BASE), (LONG_ID, ITS_CREDENTIALS_BASE), ("foo", "foo-stage"), ("2x8-torchrun", "x2x8-torchrun"),
])
def test_names_of_look_alike_job_ids_never_meet(job: tuple[JobRequest, LaunchPlan, JobRecord], first: str,
                                                second: str) -> None:
    ours, theirs = names_of(job, first), names_of(job, second)
    assert not set(ours) & set(theirs)
    assert len(set(ours)) == len(ours) == len(set(theirs))
    for obj in [*objects_of(job, first), *objects_of(job, second)]:
        for version in ("1.29", "1.32"):
            kubernetes_validate.validate(json.loads(json.dumps(obj)), version, strict=True)


def check_names_of(job: tuple[JobRequest, LaunchPlan, JobRecord], first: str, *others: str) -> None:
    """Every object of ``first`` passes the API server's rules; no two of one kind share a name (a
    stage Job is never the training Job); and no object of ``first``'s look-alikes or ``others``
    is named like one of ``first``'s in its kind."""
    assert [problem for obj in objects_of(job, first) for problem in invalid(obj)] == []
    ours = names_of(job, first)
    assert len(set(ours)) == len(ours), ours
    for second in [*look_alikes(first, ours), *others]:
        assert not set(ours) & set(names_of(job, second)), (first, second)


@pytest.mark.parametrize("length", range(1, 53))
def test_names_of_job_ids_of_every_length_never_meet_their_look_alikes(
        job: tuple[JobRequest, LaunchPlan, JobRecord], length: int) -> None:
    """Every id length, beginning with a letter and with a digit: where derived names change
    shape (ids of 46-52 characters) is covered whatever the draw below."""
    for start in "a9":
        middle = "".join("b-7c"[i % 4] for i in range(max(length - 2, 0)))
        check_names_of(job, (start + middle + "z")[:length])


@settings(max_examples=200, deadline=None)
@given(data=st.data(), first=job_ids)
def test_names_derived_from_job_ids_are_valid_and_never_meet(job: tuple[JobRequest, LaunchPlan, JobRecord],
                                                             data: st.DataObject, first: str) -> None:
    """For any valid id: its names are valid and its own, and no look-alike id nor another valid
    id gets one of them (:func:`check_names_of`)."""
    check_names_of(job, first, data.draw(job_ids.filter(lambda other: other != first)))


def test_minted_job_ids_begin_with_a_letter(tmp_path: Path) -> None:
    """Every id the project mints — names.mint_job_id, which RecordStore.open (the CLI, the
    pipeline) and the submit flow call when a request names none — is a valid id and a DNS-1035
    label, whatever the clock or the random part; none comes from a UUID or a flow run id."""
    minted = [mint_job_id() for _ in range(200)]
    minted += [mint_job_id(datetime(year, 1, 1, tzinfo=timezone.utc)) for year in (1, 2000, 9999)]
    minted.append(RecordStore(tmp_path / "records").open(backend="local", image="i", network_arch="dino",
                                                         action="train", results_dir="/results").job_id)
    assert all(JOB_ID.fullmatch(job_id) and DNS_1035.fullmatch(job_id) for job_id in minted), minted
    assert len(set(minted[:200])) == 200
