"""The web console as served HTML (SPEC U3): signed-in pages, tenant scoping, readable content."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from harness.config import Runtime
from harness.operations import Operations
from harness.service import views
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    REFUND_L3,
    client_fixture,
    create,
    key,
    runtime_fixture,
)


def _sign_in(client: TestClient, user: str) -> None:
    response = client.post(
        "/ui/login",
        content=f"api_key=demo-{user}-key&next=/ui/runs",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        follow_redirects=False,
    )
    assert response.status_code == 303


def test_pages_need_a_session(client: TestClient) -> None:
    """Every console page sends a visitor without a session to sign in, remembering where they were going."""
    for path in ("/ui/runs", "/ui/approvals", "/ui/runs/abc"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303
        assert response.headers["location"].startswith("/ui/login?next=")
    assert client.get("/", follow_redirects=False).headers["location"] == "/ui/runs"


def test_run_list_shows_live_state_and_legacy_status(client: TestClient) -> None:
    """The run list shows each Run's task, live state badge and legacy status badge."""
    ok = create(client, ORDER_STATUS)
    waiting = create(client, REFUND_L3)
    _sign_in(client, "alice")
    page = client.get("/ui/runs").text
    assert ORDER_STATUS in page and REFUND_L3 in page
    assert f'data-run-id="{ok["run_id"]}"' in page
    assert 'data-state="SUCCEEDED"' in page and 'data-legacy="done"' in page
    assert 'data-state="AWAITING_HITL"' in page and 'data-legacy="running"' in page
    assert 'data-testid="pending-count">1<' in page
    assert 'tabindex="0"' in page  # rows are reachable by keyboard
    assert waiting["run_id"]


def test_run_page_is_readable_not_raw_json(client: TestClient) -> None:
    """A run page shows the timeline, verdicts, trace steps and answer as text, with no JSON dumps."""
    run = create(client, ORDER_STATUS)
    _sign_in(client, "alice")
    page = client.get(f"/ui/runs/{run['run_id']}").text
    assert run["answer"] in page
    for heading in ("Timeline", "Policy verdicts", "Trace", "Step outputs", "Assemble context"):
        assert heading in page
    assert page.count('class="tl-state"') == len(run["path"])
    trace = client.get(f"/api/v1/runs/{run['run_id']}/trace", headers=key("alice")).json()
    (policy,) = [r["data"] for r in trace["records"] if r["kind"] == "policy"]
    checks = len(policy["verdicts"]) + policy["passed"]
    assert checks > 1 and f"{checks} checks:" in page and f"{checks} pass" in page
    # a line per listed verdict, and one for the passes the trace counts
    assert page.count('class="rec rec-policy"') == len(policy["verdicts"]) + 1
    assert f"{policy['passed']} verdicts" in page
    assert not re.search(r'\{&#34;|\{"[a-z_]+": ', page), "raw JSON in the page"


def test_inbox_offers_decisions_and_break_glass_only_to_holders(client: TestClient) -> None:
    """The inbox shows the exact actions with approve and reject; break-glass only for its role holders."""
    create(client, REFUND_L3)
    _sign_in(client, "carol")
    page = client.get("/ui/approvals").text
    assert "refunds.issue" in page and 'data-testid="approve"' in page and 'data-testid="reject"' in page
    assert 'data-testid="break-glass"' not in page
    _sign_in(client, "dave")
    assert 'data-testid="break-glass"' in client.get("/ui/approvals").text


def test_other_tenants_runs_are_not_shown(client: TestClient) -> None:
    """zoe's console shows a not-found page for tenant default's Run and lists none of them."""
    run = create(client, ORDER_STATUS, "alice")
    _sign_in(client, "zoe")
    response = client.get(f"/ui/runs/{run['run_id']}")
    assert response.status_code == 404 and ORDER_STATUS not in response.text
    assert run["run_id"] not in client.get("/ui/runs").text


def test_a_change_committed_while_the_run_page_is_built_reaches_its_live_stream(
        client: TestClient, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page shows the Run as it was read; a change committed right after that read (here: a cancel)
    must come through the page's event stream, so the stream starts at a cursor taken before the read.
    Regression: the cursor was taken after, the change fell between the two, and the page kept the
    Run's old state for good (seen about one time in four in the browser test)."""
    run = create(client, REFUND_L3)
    assert run["state"] == "AWAITING_HITL"
    read = views.run_document

    def read_then_cancel(ops: Operations, record: object) -> object:
        document = read(ops, record)  # type: ignore[arg-type]
        ops.cancel(run["run_id"], by="default/alice")
        return document

    monkeypatch.setattr(views, "run_document", read_then_cancel)
    _sign_in(client, "alice")
    page = client.get(f"/ui/runs/{run['run_id']}").text
    monkeypatch.undo()
    assert 'data-state="AWAITING_HITL"' in page  # the page shows what it read
    after = int(re.search(r'data-live-after="(\d+)"', page).group(1))  # type: ignore[union-attr]
    delivered = [c.to_state for c in runtime.reads.changes_after("default", after, run_id=run["run_id"])]
    assert "CLOSED_CANCELLED" in delivered


def test_run_list_tells_runs_apart_and_says_how_long_final_ones_took(client: TestClient) -> None:
    """Runs created in the same minute get different short ids (the random end of a time-ordered id, not
    its shared time prefix); a final Run's time column says how long it took, a waiting one how long it
    has been in its state."""
    runs = [create(client, ORDER_STATUS) for _ in range(3)] + [create(client, REFUND_L3)]
    _sign_in(client, "alice")
    page = client.get("/ui/runs").text
    shorts = re.findall(r'data-testid="short-id">([^<]+)<', page)
    assert len(shorts) == len(set(shorts)) == 4
    assert all(r["run_id"].replace("-", "").endswith(s.lstrip("…")) for r, s in zip(reversed(runs), shorts,
                                                                                  strict=True))
    times = re.findall(r'data-testid="time">(.*?)</td>', page)
    assert "in state" in times[0] and all("took" in t for t in times[1:]), times
    assert ">closed<" not in page


def test_trace_groups_add_up_and_read_in_the_order_the_run_went(client: TestClient) -> None:
    """The run page's trace: the header's record count is the sum of its groups; the steps are numbered
    in the order the Run passed them (the approval, 6, before the tools, 7); the deadline is no epoch."""
    run = create(client, REFUND_L3)
    decided = client.post(f"/api/v1/approvals/{run['approval_request_id']}/decision", json={"decision": "approve"},
                          headers=key("carol"))
    assert decided.status_code == 200, decided.text
    _sign_in(client, "alice")
    for _ in range(100):
        page = client.get(f"/ui/runs/{run['run_id']}").text
        if 'data-testid="run-state"><span class="badge tone-ok" data-state="SUCCEEDED"' in page:
            break
    total = int(re.search(r'data-testid="trace-count">(\d+) hash-chained', page).group(1))  # type: ignore[union-attr]
    counts = [int(n) for n in re.findall(r'data-count="(\d+)"', page)]
    assert sum(counts) == total
    numbers = re.findall(r'<span class="step-no">(\d)</span> ([A-Z][a-z]+(?: [a-z]+)?)', page)
    assert [int(n) for n, _ in numbers] == sorted(int(n) for n, _ in numbers)
    assert ("6", "Human approval") in numbers and ("7", "Tools") in numbers
    assert "State changes" in page and "Audit events" in page
    assert "approval needed by" in page and not re.search(r"by 1[78]\d{8}\b", page)


def test_decisions_the_caller_may_not_make_are_disabled_with_the_reason(client: TestClient) -> None:
    """The requester of an L3 request sees Approve disabled, saying why, and Reject (withdraw) enabled; a
    refused attempt reads as an attempt, never as an approval; the support lead may do both."""
    run = create(client, REFUND_L3)
    refused = client.post(f"/api/v1/approvals/{run['approval_request_id']}/decision", json={"decision": "approve"},
                          headers=key("alice"))
    assert refused.status_code in (403, 409), refused.text
    _sign_in(client, "alice")
    for page in (client.get("/ui/approvals").text, client.get(f"/ui/runs/{run['run_id']}").text):
        approve = re.search(r'<button type="submit" class="approve"[^>]*>', page).group(0)  # type: ignore[union-attr]
        reject = re.search(r'<button type="submit" class="reject"[^>]*>', page).group(0)  # type: ignore[union-attr]
        assert "disabled" in approve and "the requester cannot approve their own L3 request" in approve
        assert "disabled" not in reject
        assert "You cannot approve: the requester cannot approve their own L3 request" in page
    inbox = client.get("/ui/approvals").text
    assert "default/alice tried to approve — <span class=\"bad\">refused:" in inbox
    assert "default/alice approved" not in inbox
    _sign_in(client, "carol")
    inbox = client.get("/ui/approvals").text
    assert 'data-testid="why-not"' not in inbox and "disabled" not in re.search(
        r'<div class="buttons">.*?</div>', inbox, flags=re.S).group(0)  # type: ignore[union-attr]


def test_the_console_has_a_favicon(client: TestClient) -> None:
    """/favicon.ico, which browsers ask for, is an icon, not a 404; pages link the same icon."""
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert client.get("/ui/static/favicon.svg").content == icon.content
    assert 'rel="icon" href="/ui/static/favicon.svg"' in client.get("/ui/login").text
