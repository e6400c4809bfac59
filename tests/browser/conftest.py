"""The browser suite's fixtures: the demo's stack (:mod:`tests.browser.stack`) once per module,
headless Chromium once per module, and a fresh page per test whose screenshots go to the test's
temporary directory (never the checkout)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.embedded.s3 import EmbeddedS3

from .stack import PrefectStack, start_stack
from .ui import CHROMIUM, UI_TIMEOUT_MS, PageLog, missing, shot

#: The page's log of the test that ran it, for the failure's report.
_PAGE_LOG = pytest.StashKey[tuple[Any, PageLog, Path]]()


@pytest.fixture(scope="module")
def prefect_stack(s3_server: EmbeddedS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectStack]:
    """Prefect's server, blocks, deployments and a process worker, as ``make demo`` starts them;
    stopped by the pids the stack recorded, whatever the tests did."""
    s3_server.create_bucket("tao-browser")
    home = tmp_path_factory.mktemp("browser-stack")
    try:
        # In a thread of its own: Playwright's sync API runs an event loop in this one (the chromium
        # fixture may be up already), where Prefect's sync-or-async methods (Block.save) would
        # return a coroutine instead of saving.
        with ThreadPoolExecutor(1) as thread:
            started = thread.submit(start_stack, home, s3_server, "tao-browser").result()
        yield started
    finally:
        from deployments.stack import Stack

        Stack(home).stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(chromium: Any, prefect_stack: PrefectStack, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A page of its own (no state shared between tests); its last view is saved as
    ``tmp_path/shots/last.png`` for a failure's post-mortem, and a failing test's report says what
    the page showed (:func:`pytest_runtest_makereport`)."""
    context = chromium.new_context(viewport={"width": 1400, "height": 1400})
    context.set_default_timeout(UI_TIMEOUT_MS)
    opened = context.new_page()
    log = PageLog()
    log.attach(opened)
    request.node.stash[_PAGE_LOG] = (opened, log, tmp_path / "shots")
    try:
        yield opened
    finally:
        try:
            shot(opened, tmp_path / "shots", "last")
        finally:
            context.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A browser test that failed says what its page showed when it failed: the URL, a screenshot
    (in the test's temporary directory, never the checkout), the toasts, the API's error answers
    and the page's last API calls."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.failed or _PAGE_LOG not in item.stash:
        return
    opened, log, shots = item.stash[_PAGE_LOG]
    shots.mkdir(parents=True, exist_ok=True)
    said = log.report(opened, shots / "failed.png")
    stack = item.funcargs.get("prefect_stack") if isinstance(item, pytest.Function) else None
    if isinstance(stack, PrefectStack):  # why the server answered as it did (its 503s included)
        said += f"\nthe server's log: {stack.home / 'prefect-server.log'}; the worker's: {stack.home / 'worker.log'}"
    report.sections.append(("what the page showed", said))
