"""Driving Prefect's UI (the v2 UI the server's ``/`` redirects to) with Playwright: the run form of
a deployment, its fields found by their labels, the block pickers, and a flow run's page.

Every helper clicks and types as a user does; none calls the API. The form draws each field as a
``div.group`` holding its label and a fieldset; a field of several types (``anyOf``) shows a tab
per type.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

#: Debian's chromium (``make test`` installs it; Playwright's own browser download is not used).
CHROMIUM = "/usr/bin/chromium"
#: The longest a click waits for its element (the UI's first load on a busy machine is slow).
UI_TIMEOUT_MS = 60_000


def missing() -> str | None:
    """Why the browser suite cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
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


def submit(page: Any) -> None:
    """Submit the run form once nothing of it is open (an open list swallows the next click)."""
    page.get_by_role("listbox").wait_for(state="detached")
    page.get_by_role("button", name="Submit", exact=True).click()


def toast(page: Any, text: str) -> str:
    """The text of the first notification that says ``text`` (waits for it)."""
    found = page.locator("[data-sonner-toast]").filter(has_text=text).first
    found.wait_for()
    return str(found.inner_text())


def shot(page: Any, where: Path, name: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(where / f"{name}.png"), full_page=True)
