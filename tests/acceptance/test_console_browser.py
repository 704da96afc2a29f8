"""The web console in a real browser (SPEC U3): start a Run, approve it from the inbox as a support lead,
and watch it reach SUCCEEDED through live updates. Screenshots go to test-artifacts/.

Needs Debian's chromium (`apt-get install -y chromium`) and the Python playwright package; the browser
is never downloaded by playwright itself.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

CHROMIUM = Path(os.environ.get("HARNESS_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

playwright_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
if not CHROMIUM.exists():
    pytest.skip(f"no chromium at {CHROMIUM}: apt-get install -y chromium", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`harness serve` as a subprocess on a loopback port with a fresh database; yields its base URL."""
    tmp_path = tmp_path_factory.mktemp("console")
    port = _free_port()
    env = {
        **os.environ,
        "HARNESS_EXAMPLE_LEDGER": str(tmp_path / "ledger.jsonl"),
        "HARNESS_DATA_DIR": str(tmp_path / "data"),
        "HARNESS_SESSION_SECRET": "browser-test-secret-0123",
    }
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "serve",
            "--port",
            str(port),
            "--db",
            str(tmp_path / "console.db"),
            "--log-json",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90  # a loaded machine starts the service slowly
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 401:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail(f"the server did not start: {(tmp_path / 'server.log').read_text()}")
        yield base
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


def _sign_in(page: object, base: str, key: str) -> None:
    page.goto(f"{base}/ui/runs")  # type: ignore[attr-defined]
    page.fill("#api_key", key)  # type: ignore[attr-defined]
    page.click("button[type=submit]")  # type: ignore[attr-defined]
    page.wait_for_url(f"{base}/ui/runs")  # type: ignore[attr-defined]


def _wait_for_state(page: Any, state: str) -> None:
    """Wait for the run page to show `state` through its live updates (no reload)."""
    page.wait_for_selector(f"[data-testid=run-state] [data-state={state}]", timeout=20_000)


def _requester_may_not_approve(page: Any) -> None:
    """The requester's run page: Approve disabled with the reason, Reject enabled, a readable deadline."""
    assert page.is_disabled("[data-testid=approve]") and page.is_enabled("[data-testid=reject]")
    assert "the requester cannot approve their own L3 request" in page.inner_text("[data-testid=why-not]")
    deadline = page.inner_text(".approval-callout time[data-rel=deadline]")
    assert re.match(r"in 2[34] h · ", deadline), deadline


def _approve_and_see_the_count_drop(page: Any, card: Any) -> None:
    """Approve with a reason typed; the waiting count and the navigation badge drop without a reload."""
    assert page.inner_text("[data-testid=pending-count]") == "1"
    assert page.get_attribute("[data-testid=waiting-count]", "data-waiting") == "1"
    page.evaluate("window.__marker = 'same page'")
    card.locator("textarea").fill("Gold customer, parcel lost")
    card.locator("[data-testid=approve]").click()
    page.wait_for_selector("[data-outcome].ok", timeout=20_000)
    page.wait_for_selector("[data-testid=waiting-count][data-waiting='0']", timeout=20_000)
    assert page.locator("[data-testid=pending-count]").count() == 0
    assert page.evaluate("window.__marker") == "same page"  # no reload


def test_start_approve_and_watch_a_run_succeed(server: str) -> None:
    """A Run started in the console parks for an L3 approval; its requester sees Approve disabled with the
    reason; a support lead approves it in the inbox, the waiting count and the badge drop at once, and the
    run page shows SUCCEEDED without a reload. No request of the pages (the favicon included) is a 404."""
    ARTIFACTS.mkdir(exist_ok=True)
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        missing: list[str] = []
        page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
        page.goto(f"{server}/ui/runs")
        page.wait_for_selector("#api_key")
        page.screenshot(path=ARTIFACTS / "console-1-login.png")
        _sign_in(page, server, "demo-alice-key")

        page.fill("[data-testid=new-run-task]", "Refund 180 EUR for order A-1003")
        page.click("[data-testid=new-run-submit]")
        page.wait_for_url(f"{server}/ui/runs/*")
        run_url = page.url
        _wait_for_state(page, "AWAITING_HITL")
        _requester_may_not_approve(page)
        page.screenshot(path=ARTIFACTS / "console-2-run-waiting.png", full_page=True)

        page.click("text=Sign out")
        _sign_in(page, server, "demo-carol-key")
        page.keyboard.press("g")
        page.keyboard.press("a")
        page.wait_for_url(f"{server}/ui/approvals")
        card = page.locator("article.card").first
        assert "Refund 180 EUR" in card.inner_text()
        page.keyboard.press("j")
        assert page.evaluate("document.activeElement.matches('article.card')")
        page.screenshot(path=ARTIFACTS / "console-3-inbox.png", full_page=True)
        _approve_and_see_the_count_drop(page, card)
        page.screenshot(path=ARTIFACTS / "console-4-approved.png", full_page=True)

        page.goto(run_url)
        page.wait_for_selector("[data-testid=run-state] [data-state=SUCCEEDED]", timeout=20_000)
        assert "Refund" in page.inner_text("[data-testid=run-answer]")
        assert "default/carol" in page.inner_text("[data-testid=timeline]")
        page.screenshot(path=ARTIFACTS / "console-5-run-succeeded.png", full_page=True)

        page.goto(f"{server}/ui/runs")
        page.keyboard.press("j")
        page.keyboard.press("Enter")
        page.wait_for_url(run_url)
        page.goto(f"{server}/ui/runs")
        page.screenshot(path=ARTIFACTS / "console-6-runs.png", full_page=True)
        shorts = page.locator("[data-testid=short-id]").all_inner_texts()
        assert len(shorts) == len(set(shorts))
        assert missing == []
        browser.close()


def test_live_update_without_reload(server: str) -> None:
    """The run page updates by itself when the Run is approved through the API (server-sent events)."""
    ARTIFACTS.mkdir(exist_ok=True)
    created = httpx.post(
        f"{server}/api/v1/runs",
        json={"task": "Refund 42.50 EUR for order A-1001"},
        headers={"X-API-Key": "demo-alice-key"},
        params={"wait": "true"},
        timeout=30,
    ).json()
    assert created["state"] == "AWAITING_HITL"
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        _sign_in(page, server, "demo-alice-key")
        page.goto(f"{server}/ui/runs/{created['run_id']}")
        page.wait_for_selector("[data-state=AWAITING_HITL]")
        page.evaluate("window.__marker = 'same page'")
        decided = httpx.post(
            f"{server}/api/v1/approvals/{created['approval_request_id']}/decision",
            json={"decision": "approve"},
            headers={"X-API-Key": "demo-alice-key"},
            timeout=30,
        )
        assert decided.status_code == 200
        page.wait_for_selector("[data-testid=run-state] [data-state=SUCCEEDED]", timeout=20_000)
        assert page.evaluate("window.__marker") == "same page"
        browser.close()
