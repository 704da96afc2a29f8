"""The console's cost page in a real browser (SPEC U3; seed 004 §3.6 cost dashboard): a chart of spend per
day drawn as SVG by the server and tables by user and by skill, agreeing with the cost API. The screenshot
goes to test-artifacts/ (and to HARNESS_SCREENSHOT_DIR when set)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.domain.records import NewRun
from harness.domain.traces import CostTrace
from harness.kernel.states import FINAL

from .test_console_browser import ARGS, ARTIFACTS, CHROMIUM, _sign_in, playwright_api
from .test_console_browser import server as _server_fixture

server = _server_fixture
DAY = 86_400.0
#: (days ago, user, skill or None for a planning call, USD) of the history seeded before the server starts
HISTORY = [(d, user, skill, usd) for d in range(1, 13) for user, skill, usd in (
    ("alice", None, 0.004 + 0.001 * (d % 4)), ("bob", "orders.lookup", 0.002 * (d % 3)),
    ("carol", "refunds.draft", 0.003 if d % 2 else 0.0))] + [(3, "dave", "shell.exec", 0.02)]


@pytest.fixture(scope="module")
def seeded(server: str) -> Iterator[str]:
    """The server's database with two weeks of recorded spend, and one real Run made today."""
    db = _db_of(server)
    store = SqlStore.open(db, FakeClock())
    ledger = CostLedger(store)
    now = __import__("time").time()
    for days_ago, user, skill, usd in HISTORY:
        if usd == 0:
            continue
        store.clock = FakeClock(now - days_ago * DAY)
        run, _ = store.create_run(NewRun("default", user, "s", {"task": "history"}))
        ledger.record(CostTrace(run_id=run.run_id, source=f"llm:openai:{'tool:' + skill if skill else 'plan'}",
                                input_tokens=int(usd * 1e6), output_tokens=int(usd * 2e5), api_calls=1, usd=usd,
                                model="gpt-4o-mini", tenant_id="default", user_id=user, skill_id=skill))
    store.clock = FakeClock(__import__("time").time())
    _wait_until_all_final(store)  # the server's worker picks up the history Runs; their spend lands now
    store.close()
    done = httpx.post(f"{server}/api/v1/runs", json={"task": "Where is order A-1001?"},
                      headers={"X-API-Key": "demo-alice-key"}, params={"wait": "true"}, timeout=30).json()
    assert done["state"] == "SUCCEEDED" and done["cost"]["usd"] == 0  # the offline scripted model costs nothing
    yield server


def _wait_until_all_final(store: SqlStore, timeout: float = 120.0) -> None:
    """Wait until the server has driven every Run of its database to a final state (so the totals hold)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with store.engine.connect() as conn:
            open_runs = conn.execute(sa.select(sa.func.count()).select_from(t.runs).where(
                t.runs.c.state.not_in([s.value for s in FINAL]))).scalar()
        if not open_runs:
            return
        time.sleep(0.2)
    raise AssertionError(f"{open_runs} Run(s) of the history were not driven to a final state")


def _db_of(server: str) -> str:
    """The database file the module's server runs on (its --db is in its command line)."""
    for pid in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"harness.cli" in argv and b"serve" in argv and server.rsplit(":", 1)[1].encode() in argv:
            return argv[argv.index(b"--db") + 1].decode()
    raise AssertionError("the server's process was not found")


def test_the_cost_page_charts_spend_per_day_and_tables_it_by_user_and_skill(seeded: str) -> None:
    """The cost page shows a bar for each day with spend, users and skills with their spend, and a total
    equal to the cost API's for the same period."""
    ARTIFACTS.mkdir(exist_ok=True)
    api = httpx.get(f"{seeded}/api/v1/costs", params={"group_by": "day"}, headers={"X-API-Key": "demo-alice-key"},
                    timeout=10).json()
    spend_days = [g["key"] for g in api["groups"] if g["usd"] > 0]
    assert len(spend_days) >= 12
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        _sign_in(page, seeded, "demo-alice-key")
        page.click("header nav >> text=Costs")
        page.wait_for_url(f"{seeded}/ui/costs")
        page.wait_for_selector("[data-testid=cost-chart] rect.bar")
        bars = page.eval_on_selector_all("[data-testid=cost-chart] rect.bar", "els => els.map(e => e.dataset.day)")
        assert sorted(bars) == sorted(spend_days)
        users = page.inner_text("[data-testid=costs-by-user]")
        for user in ("alice", "bob", "carol", "dave"):
            assert user in users
        skills = page.inner_text("[data-testid=costs-by-skill]")
        for skill in ("(planning)", "orders.lookup", "refunds.draft", "shell.exec"):
            assert skill in skills
        shown = page.inner_text("[data-testid=cost-total]").replace("$", "").replace(",", "")
        assert float(shown) == pytest.approx(api["total_usd"], abs=5e-5)
        target = ARTIFACTS / "console-costs.png"
        page.screenshot(path=target, full_page=True)
        browser.close()
    extra = os.environ.get("HARNESS_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        shutil.copy(target, Path(extra) / "costs.png")
