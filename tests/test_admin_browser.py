"""The Lock admin in headless Chromium on a live server, against a lock held by another process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Browser, Page, expect, sync_playwright

from locks.models import Lock
from tests.conftest import BACKEND, ROOT, finish, read_event, spawn

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = ROOT / "artifacts" / "screenshots" / BACKEND
TIMEOUT_MS = 60_000  # generous: the machine is shared


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium")
    # Playwright's sync API keeps an event loop on this thread between calls; the ORM
    # calls of these tests are plain blocking code all the same.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def login(browser: Browser, base_url: str, username: str) -> Page:
    page = browser.new_context(base_url=base_url).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto("/admin/login/?next=/admin/locks/lock/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/locks/lock/")
    return page


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def hold_in_other_process(name: str, holder: str, gate: Path) -> tuple[Any, dict[str, Any]]:
    worker = spawn("hold_until", name, 120, holder, gate, module="tests.workers_django")
    event = read_event(worker)
    assert event["event"] == "acquired", event
    return worker, event


def test_superuser_sees_a_lock_of_another_process_and_breaks_it(
    browser: Browser, live_server: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    worker, held = hold_in_other_process("orders:42", "billing-worker-7", gate)
    try:
        User.objects.create_superuser("root", password="pw")
        page = login(browser, live_server.url, "root")

        row = page.locator("#result_list tbody tr", has_text="billing-worker-7")
        expect(row).to_have_count(1)
        expect(row.locator("th.field-name, td.field-name")).to_have_text("orders:42")
        expect(row.locator("td.field-token")).to_have_text(str(held["token"]))
        expect(row.locator("td.field-state")).to_have_text("held")
        left = float(row.locator("td.field-expires_in").inner_text())
        assert 0 < left <= 120
        shot(page, "01-changelist-lock-held-by-another-process.png")

        row.locator("input.action-select").check()
        page.select_option("select[name=action]", "break_locks")
        page.click("button[name=index]")
        expect(page.locator("#break-locks")).to_contain_text("billing-worker-7")
        expect(page.locator("#break-locks")).to_contain_text(str(held["token"]))
        shot(page, "02-break-confirmation.png")
        assert Lock.objects.filter(name="orders:42").exists(), "not broken before confirming"

        page.click("input[type=submit][value='Yes, break them']")
        expect(page.locator(".messagelist")).to_contain_text("Broke 1 lock(s): 'orders:42'.")
        expect(page.locator("#result_list tbody tr", has_text="billing-worker-7")).to_have_count(0)
        shot(page, "03-lock-broken.png")
    finally:
        gate.touch()
    events = {e["event"]: e for e in finish(worker)}

    assert not Lock.objects.filter(name="orders:42").exists()
    entry = LogEntry.objects.get(object_id="orders:42")
    assert "billing-worker-7" in entry.change_message
    assert str(held["token"]) in entry.change_message
    assert events["renew"]["outcome"] == "LockLost"
    assert events["release"]["outcome"] == "LockLost"


def test_staff_without_break_permission_cannot_break(
    browser: Browser, live_server: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    worker, held = hold_in_other_process("orders:43", "billing-worker-8", gate)
    try:
        user = User.objects.create_user("viewer", password="pw", is_staff=True)
        user.user_permissions.set(Permission.objects.filter(codename="view_lock"))
        page = login(browser, live_server.url, "viewer")

        row = page.locator("#result_list tbody tr", has_text="billing-worker-8")
        expect(row).to_have_count(1)
        expect(page.locator("select[name=action]")).to_have_count(0)
        shot(page, "04-staff-without-permission-no-actions.png")

        # Forge the POST the action would send, with a valid session and CSRF token.
        context = page.context
        csrf = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
        url = f"{live_server.url}/admin/locks/lock/"
        forged = context.request.post(
            url,
            form={
                "csrfmiddlewaretoken": csrf,
                "action": "break_locks",
                "_selected_action": "orders:43",
                "index": "0",
            },
            headers={"Referer": url},
        )
        assert forged.status == 403
        assert Lock.objects.get(name="orders:43").token == held["token"]
        page.goto("/admin/locks/lock/")
        expect(page.locator("#result_list tbody tr", has_text="billing-worker-8")).to_have_count(1)
        shot(page, "05-staff-forged-post-refused.png")
    finally:
        gate.touch()
    events = {e["event"]: e for e in finish(worker)}

    assert events["renew"]["outcome"] == "ok" and events["release"]["outcome"] == "ok"
    assert not LogEntry.objects.exists()
