"""The console's page in a real headless Chromium (Debian's ``chromium``, driven by Playwright
with the system browser): log in, see the mailboxes and the charts, replay a dead letter and
watch it leave the list, find a mail and read its timeline; a viewer cannot replay, and a form
without its CSRF token is refused. Screenshots land in the test's tmp dir."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.integration.console.conftest import OPERATOR_TOKEN, VIEWER_TOKEN, ConsoleStack

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: deploy/bootstrap.sh installs Debian's chromium")
    with sync_playwright() as playwright:
        # --no-sandbox: the tests run as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def logged_in(browser: Browser, stack: ConsoleStack, token: str) -> Page:
    page = browser.new_context(viewport={"width": 1360, "height": 900}).new_page()
    page.goto(stack.url + "/")
    expect(page).to_have_url(stack.url + "/login")
    page.fill("#token", token)
    page.click("button[type=submit]")
    expect(page.locator("#mailboxes")).to_be_visible()
    return page


def test_operator_sees_mailboxes_replays_a_dead_letter_and_reads_a_timeline(
    browser: Browser, console_stack: ConsoleStack, tmp_path: Path
) -> None:
    page = logged_in(browser, console_stack, OPERATOR_TOKEN)
    row = page.locator(f'#mailboxes tr[data-mailbox="imap/{console_stack.account}/INBOX"]')
    expect(row).to_be_visible()
    expect(row.locator("svg.spark")).to_have_count(1)
    expect(row.locator(".badge")).to_have_count(1)
    expect(page.locator("#outcomes svg rect").first).to_be_attached()
    # The stylesheet and the script were served (the page is not the bare HTML fallback).
    expect(page.locator("header.top")).to_have_css("position", "sticky")
    page.screenshot(path=str(tmp_path / "console.png"))

    cookie = next(c for c in page.context.cookies() if c["name"] == "mailtap_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert OPERATOR_TOKEN not in page.content()

    record = console_stack.dead_commands[3]
    dead = page.locator(f'#dlq tr[data-record="{record}"]')
    expect(dead).to_be_visible()
    count_before = int(page.locator("#dlq-count").inner_text())
    page.evaluate("window.notReloaded = true")
    dead.get_by_role("button", name="replay").click()
    # A replay reads the delivery topic and writes four times (audit, command, drop note,
    # audit): seconds on a loaded machine.
    expect(dead).to_have_count(0, timeout=30_000)
    assert page.evaluate("window.notReloaded === true")  # removed in place by console.js
    expect(page.locator("#flash")).to_contain_text(f"{record} replayed")
    expect(page.locator("#dlq-count")).to_have_text(str(count_before - 1))
    page.reload()  # gone on the server too, not only from the page
    expect(page.locator(f'#dlq tr[data-record="{record}"]')).to_have_count(0)

    page.fill("input[name=q]", f"<{console_stack.ticket_message_id}>")
    page.get_by_role("button", name="Find mail").click()
    story = page.locator("#story")
    expect(story.locator(".verdict")).to_contain_text("reply SENT")
    for kind in ("mail", "workflow", "command", "delivery"):
        expect(story.locator(f"li.step-{kind}").first).to_be_visible()
    story.scroll_into_view_if_needed()
    page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)


def test_a_viewer_cannot_replay_and_a_form_without_csrf_is_refused(
    browser: Browser, console_stack: ConsoleStack, tmp_path: Path
) -> None:
    record = console_stack.dead_commands[-1]
    page = logged_in(browser, console_stack, VIEWER_TOKEN)
    dead = page.locator(f'#dlq tr[data-record="{record}"]')
    expect(dead).to_be_visible()
    expect(dead.get_by_role("button", name="replay")).to_be_disabled()
    expect(dead.get_by_role("button", name="drop")).to_have_count(0)
    expect(page.locator("#mailboxes").get_by_role("button", name="pause")).to_have_count(0)
    page.screenshot(path=str(tmp_path / "viewer.png"))

    # The forms' endpoint with the viewer's own cookie: refused, with or without a token.
    refused = page.request.post(
        f"{console_stack.url}/ui/dlq/{record}/replay",
        form={"csrf": "forged"},
        headers={"Accept": "application/json"},
    )
    assert refused.status == 403
    operator = logged_in(browser, console_stack, OPERATOR_TOKEN)
    no_csrf = operator.request.post(
        f"{console_stack.url}/ui/dlq/{record}/replay", headers={"Accept": "application/json"}
    )
    assert no_csrf.status == 403 and "CSRF" in no_csrf.json()["message"]
    page.reload()
    expect(page.locator(f'#dlq tr[data-record="{record}"]')).to_be_visible()
