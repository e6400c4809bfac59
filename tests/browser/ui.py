"""Driving Prefect's UI (the v2 UI the server's ``/`` redirects to) with Playwright: the run form of
a deployment, its fields found by their labels, the block pickers, and a flow run's page.

Every helper clicks and types as a user does; none calls the API. The form draws each field as a
``div.group`` holding its label and a fieldset; a field of several types (``anyOf``) shows a tab
per type.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any

#: Debian's chromium (``make test`` installs it; Playwright's own browser download is not used).
CHROMIUM = "/usr/bin/chromium"
#: The longest a click waits for its element (the UI's first load on a busy machine is slow).
UI_TIMEOUT_MS = 60_000


def missing() -> str | None:
    """Why the browser suite cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401 - only whether it imports
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if shutil.which(CHROMIUM) is None:
        return f"chromium is not installed at {CHROMIUM} (apt-get install chromium; make test does)"
    return None


def field(scope: Any, label: str) -> Any:
    """The form field labelled exactly ``label`` (the innermost one, where a model nests another)."""
    return scope.locator(f"xpath=//div[contains(concat(' ', @class, ' '), ' group ')]"
                         f"[./div/div/label[normalize-space(.)='{label}']]").last


def open_custom_run(page: Any, ui: str, deployment_id: Any) -> None:
    """The deployment's page, then Run → Custom run."""
    page.goto(f"{ui}/deployments/deployment/{deployment_id}")
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_text("Custom run", exact=True).click()
    page.get_by_role("heading", name="Parameters").wait_for()


def fill_request(page: Any, *, image: str, command: str, mode: str, args: list[str], job_id: str | None = None) -> None:
    """The request parameter's JobRequest tab, filled field by field."""
    field(page, "request (Optional)").get_by_role("tab", name="JobRequest", exact=True).click()
    if job_id is not None:
        job = field(page, "Job Id (Optional)")
        job.get_by_role("tab", name="str", exact=True).click()
        job.locator("textarea").fill(job_id)
    page.get_by_label("Image", exact=True).fill(image)
    field(page, "Command").locator("textarea").first.fill(command)  # the str tab, the one shown
    field(page, "Mode").get_by_role("button", name="Select Mode").click()
    page.get_by_role("option", name=mode, exact=True).click()
    page.get_by_role("listbox").wait_for(state="detached")
    given = field(page, "Args (Optional)")
    given.get_by_role("tab", name="list", exact=True).click()
    for index, arg in enumerate(args):
        given.get_by_role("button", name="Add item").click()
        given.locator("textarea").nth(index).fill(arg)


def pick_block(page: Any, parameter: str, block_type_tab: str, name: str) -> None:
    """In ``parameter``'s field, the block type's tab, then the saved block ``name`` in its picker."""
    chosen = field(page, f"{parameter} (Optional)")
    chosen.get_by_role("tab", name=block_type_tab, exact=True).click()
    picker = chosen.get_by_role("button", name="Select a block")
    picker.click()
    page.get_by_role("option", name=name, exact=True).click()
    page.get_by_role("listbox").wait_for(state="detached")  # closed: a click elsewhere is not swallowed
    picker.filter(has_text=name).wait_for()


def submit(page: Any, runs: Callable[[], int]) -> Any:
    """Submit the run form once nothing of it is open (an open list swallows the next click), and
    return the server's answer to the flow run it asked for (the form's POST to the deployment's
    ``create_flow_run``; the click is done only once that POST was made).

    A 503 is Prefect's "try again": the server's SQLite was busy (``database is locked`` when the
    create's read transaction turns into a write after another writer, such as the worker's poll
    every second, committed), the transaction was rolled back and nothing was created. Prefect's
    own client resends such a request; the UI only toasts "Unknown error while creating flow run."
    and keeps the form as it was, so a user clicks Submit again, and so does this — at most
    :data:`SUBMIT_TRIES` times, and each time only once ``runs()`` (the deployment's flow runs,
    counted through the API) says that no flow run was created.
    """
    page.get_by_role("listbox").wait_for(state="detached")
    button = page.get_by_role("button", name="Submit", exact=True)
    before = runs()
    for _ in range(SUBMIT_TRIES - 1):
        answer = _click_and_answer(page, button)
        if answer.status != SERVER_BUSY:
            return answer
        if runs() != before:
            raise AssertionError(f"the server answered {SERVER_BUSY} to the form's Submit, yet a flow run was created")
    return _click_and_answer(page, button)


#: What Prefect's server answers a request it may be sent again (``is_client_retryable_exception``).
SERVER_BUSY = 503
#: How many times :func:`submit` clicks while the server answers :data:`SERVER_BUSY` (each answer
#: comes within a second; with the demo's worker polling every second, 4 of 7 first Submits were
#: answered 503 on two idle cores, 1 of 6 with the worker polling every 10 s).
SUBMIT_TRIES = 10


def _click_and_answer(page: Any, button: Any, answers: Callable[[Any], bool] | None = None) -> Any:
    with page.expect_response(answers or _creates_flow_run) as answered:
        button.click()
    return answered.value


def save_block(page: Any, saved: Callable[[], bool]) -> Any:
    """Click the block form's Save and return the server's answer to the block document it asked
    for (the form's POST to ``/block_documents/``); clicked again, as :func:`submit` does, while
    the server answers :data:`SERVER_BUSY` and ``saved()`` (through the API) says nothing was
    saved."""
    button = page.get_by_role("button", name="Save", exact=True)
    for _ in range(SUBMIT_TRIES - 1):
        answer = _click_and_answer(page, button, _creates_block_document)
        if answer.status != SERVER_BUSY:
            return answer
        if saved():
            raise AssertionError(f"the server answered {SERVER_BUSY} to the block form's Save, yet the block was saved")
    return _click_and_answer(page, button, _creates_block_document)


def _creates_block_document(response: Any) -> bool:
    return bool(response.request.method == "POST" and response.url.rstrip("/").endswith("/api/block_documents"))


def open_block_form(page: Any, ui: str, block_type_slug: str) -> None:
    """Blocks → + (the catalog) → the block type's Create."""
    page.goto(f"{ui}/blocks")
    page.locator("a[href$='/blocks/catalog']").first.click()  # the "+" beside the page's title
    page.wait_for_url("**/blocks/catalog")
    page.locator(f"a[href$='/blocks/catalog/{block_type_slug}/create']").click()
    page.wait_for_url(f"**/blocks/catalog/{block_type_slug}/create")
    page.get_by_role("button", name="Save", exact=True).wait_for()


def paste(page: Any, box: Any, text: str) -> None:
    """What a paste does in ``box``: what it held cleared, then one input event with the whole text."""
    box.fill("")
    box.focus()
    page.keyboard.insert_text(text)


def _creates_flow_run(response: Any) -> bool:
    return bool(response.request.method == "POST" and response.url.endswith("/create_flow_run"))


def from_run_menu(page: Any, url: str, run_name: str, item: str, asks: str) -> Any:
    """The flow run's page at ``url`` (once it shows ``run_name``), its menu's ``item``, and the
    dialog that asks ``asks`` to confirm it (returned, unanswered)."""
    page.goto(url)
    page.get_by_text(run_name).first.wait_for()
    page.get_by_role("button", name="Open menu").click()
    page.get_by_role("menuitem", name=item, exact=True).click()
    dialog = page.get_by_role("alertdialog").or_(page.get_by_role("dialog")).first
    dialog.get_by_text(asks).wait_for()
    return dialog


def toast(page: Any, text: str) -> str:
    """The text of the first notification that says ``text`` (waits for it)."""
    found = page.locator("[data-sonner-toast]").filter(has_text=text).first
    found.wait_for()
    return str(found.inner_text())


def shot(page: Any, where: Path, name: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(where / f"{name}.png"), full_page=True)


#: Each notification the page shows, kept in ``window.__toasts`` as it appears (a toast is gone
#: within seconds; a failure's report still says what it said).
TOAST_RECORDER = """
window.__toasts = [];
new MutationObserver(() => {
  for (const toast of document.querySelectorAll('[data-sonner-toast]')) {
    if (toast.dataset.recorded) continue;
    const text = (toast.innerText || '').trim();
    if (!text) continue;
    toast.dataset.recorded = '1';
    window.__toasts.push(new Date().toISOString().slice(11, 23) + ' ' + text.replace(/\\s+/g, ' '));
  }
}).observe(document, {childList: true, subtree: true, characterData: true});
"""


@dataclass
class PageLog:
    """What a page did, for a failure's report: its calls to Prefect's API (method, path, status,
    when), its console errors and uncaught exceptions; the toasts are the page's own
    (:data:`TOAST_RECORDER`)."""

    started: float = dataclass_field(default_factory=time.monotonic)
    lines: list[str] = dataclass_field(default_factory=list)
    failed: list[Any] = dataclass_field(default_factory=list)

    def attach(self, page: Any) -> None:
        page.add_init_script(TOAST_RECORDER)
        page.on("request", lambda request: self._say(f"-> {request.method} {_api_path(request.url)}")
                if _is_api(request.url) else None)
        page.on("response", self._response)
        page.on("requestfailed", lambda request: self._say(
            f"!! {request.method} {_api_path(request.url)} failed: {request.failure}"))
        page.on("console", lambda message: self._say(f"console.{message.type}: {message.text}")
                if message.type in ("error", "warning") else None)
        page.on("pageerror", lambda error: self._say(f"page error: {error}"))

    def _response(self, response: Any) -> None:
        if not _is_api(response.url):
            return
        self._say(f"<- {response.status} {response.request.method} {_api_path(response.url)}")
        if response.status >= 400:
            self.failed.append(response)

    def _say(self, line: str) -> None:
        self.lines.append(f"{time.monotonic() - self.started:7.2f}s {line}")

    def report(self, page: Any, screenshot: Path) -> str:
        """The page's URL, its screenshot (saved now, at ``screenshot``), the toasts it showed, what
        the API answered with an error, and its last calls to the API."""
        from playwright.sync_api import Error as PlaywrightError

        said = [f"url: {page.url}"]
        try:
            page.screenshot(path=str(screenshot), full_page=True)
            said.append(f"screenshot: {screenshot}")
        except PlaywrightError as exc:  # a closed or crashed page still reports the rest
            said.append(f"screenshot: none ({exc})")
        try:
            toasts = page.evaluate("window.__toasts || []")
        except PlaywrightError as exc:
            toasts = [f"(unreadable: {exc})"]
        said += ["toasts:", *(f"  {text}" for text in toasts or ["(none)"])]
        for response in self.failed[-5:]:
            try:
                body = response.text()[:1500]
            except PlaywrightError as exc:
                body = f"(unreadable: {exc})"
            said.append(f"{response.status} {response.request.method} {_api_path(response.url)}: {body}")
        said += ["the page's last API calls and errors:", *(f"  {line}" for line in self.lines[-40:])]
        return "\n".join(said)


def _is_api(url: str) -> bool:
    return "/api/" in url


def _api_path(url: str) -> str:
    return url.split("/api", 1)[-1]
