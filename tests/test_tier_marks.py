"""The tier marks tests/conftest.py gives each test from what it uses (``unit``, ``http``, ``kube``):
read from the test's own code and from the code of every fixture it uses, directly or through
another fixture, wherever pytest finds that fixture — the test's module, a module it imports the
fixture from, tests/conftest.py — and a fixture of the module overriding one of conftest.py's.
Each specimen below is made an item of this module, as collection makes one, and marked by the
session's own hook; no specimen runs, so no fixture of theirs is set up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from . import kube_cluster
from .kube.apiserver import KubeStandIn

#: A fixture imported from the module that defines it, as the Kubernetes tests take theirs.
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


@pytest.fixture
def a_stand_in() -> type:
    return KubeStandIn


@pytest.fixture
def through_another(a_stand_in: type) -> type:
    return a_stand_in


@pytest.fixture
def s3_env() -> dict[str, str]:
    """Overrides conftest.py's ``s3_env`` (which starts the session's S3 server) with nothing."""
    return {}


def _uses_nothing() -> None:
    pass


def _uses_a_fixture_of_this_module(a_stand_in: type) -> None:
    pass


def _uses_it_through_another_fixture(through_another: type) -> None:
    pass


def _uses_an_imported_fixture(input_bucket: str) -> None:
    pass


def _uses_a_conftest_fixture(s3_credentials: Any) -> None:
    pass


def _uses_an_override_of_a_conftest_fixture(s3_env: dict[str, str]) -> None:
    pass


@contextmanager
def _a_stand_in_for_a_while() -> Iterator[type]:
    yield KubeStandIn


def _uses_a_context_manager_helper() -> None:
    with _a_stand_in_for_a_while():
        pass


@pytest.mark.parametrize(("specimen", "tier"), [
    (_uses_nothing, "unit"),
    (_uses_a_fixture_of_this_module, "kube"),
    (_uses_it_through_another_fixture, "kube"),
    (_uses_an_imported_fixture, "http"),  # input_bucket → conftest.py's moto_credentials: ThreadedMotoServer
    (_uses_a_conftest_fixture, "http"),  # s3_credentials → s3_server, whose code starts EmbeddedS3
    (_uses_an_override_of_a_conftest_fixture, "unit"),
    (_uses_a_context_manager_helper, "kube"),  # read through @contextmanager's wrapper, as seeded_cluster is
], ids=lambda value: value.__name__.strip("_") if callable(value) else value)
def test_a_test_is_marked_by_what_it_and_its_fixtures_use(request: pytest.FixtureRequest,
                                                          specimen: Callable[..., None], tier: str) -> None:
    module = request.node.getparent(pytest.Module)
    item = pytest.Function.from_parent(module, name=specimen.__name__, callobj=specimen)
    request.config.hook.pytest_collection_modifyitems(session=request.session, config=request.config, items=[item])
    tiers = {mark.name for mark in item.iter_markers()} & {"unit", "http", "kube", "flows", "docker", "slurm"}
    assert tiers == {tier}, item.fixturenames
