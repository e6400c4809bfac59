"""One service for the whole test session (the session's dockerd, its SLURM cluster), however
many test modules take its fixture: pytest makes a session fixture's definition once per module
that names it, so the service is counted out to them and stopped when the last lets go. A failed
start is remembered, so every test that needs the service fails with the same reason, once tried
— the project tests on real engines and never skips them. A module of its own, so the services'
modules share it without importing each other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import pytest

Service = TypeVar("Service")


class Shared(Generic[Service]):
    """``start()`` once for the session (``failed``: the exception a failed start raises, its
    message said as ``what`` did not start), ``stop(service)`` when the last user lets go."""

    def __init__(self, what: str, start: Callable[[], Service], stop: Callable[[Service], None],
                 failed: type[Exception]) -> None:
        self.what, self.start, self.stop, self.failed = what, start, stop, failed
        self.service: Service | None = None
        self.users = 0
        self.failure: str | None = None

    def acquire(self) -> Service:
        if self.service is None and self.failure is None:
            try:
                self.service = self.start()
            except self.failed as exc:
                self.failure = f"{self.what} did not start: {exc}"
        if self.failure is not None:
            pytest.fail(self.failure, pytrace=False)
        assert self.service is not None
        self.users += 1
        return self.service

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.service is not None:
            service, self.service = self.service, None
            self.stop(service)
