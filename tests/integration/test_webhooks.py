"""Pushes (SPEC P4 / N1): approval requests and Run results are queued with their change, and delivered
signed to a real loopback receiver — at least once, retried with backoff, dead after the last attempt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.clock import FakeClock
from harness.config import Runtime
from harness.domain.contracts import CallerIdentity
from harness.domain.errors import BadInputError
from harness.domain.records import NewRun
from harness.drive.sweeper import ZombieSweeper
from harness.kernel.states import RunState
from tests.fakes.webhook_receiver import WebhookReceiver

from .webhook_setup import webhook_runtime, write_config

CALLBACK = "http://127.0.0.1:9/caller"  # nothing listens: these tests look at the outbox only
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"], "callback": CALLBACK}
LEE = CallerIdentity(tenant_id="t1", user_id="lee", roles=("tester", "lead"))


@pytest.fixture
def rt(backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock,
       call_log: Path) -> Iterator[Runtime]:
    """A pushing runtime on the backend under test."""
    runtime = webhook_runtime(backend_url, tmp_path, write_config(tmp_path, monkeypatch), clock)
    yield runtime
    runtime.close()


def queued(rt: Runtime, run_id: str) -> list[tuple[str, str]]:
    """(event type, endpoint) of the Run's queued deliveries, oldest first."""
    assert rt.webhook_outbox is not None
    return [(d.event_type, d.endpoint) for d in reversed(rt.webhook_outbox.list(run_id=run_id))]


def payloads(rt: Runtime, run_id: str, event_type: str) -> list[dict[str, object]]:
    assert rt.webhook_outbox is not None
    return [d.data() for d in rt.webhook_outbox.list(run_id=run_id) if d.event_type == event_type]


def test_an_approval_and_its_run_are_pushed_at_every_step(rt: Runtime) -> None:
    """A parked L3 Run pushes the request (caller and leads) and its park; the decision pushes the
    decision and the final result, each event once per endpoint with one event id across endpoints."""
    parked = rt.runs.create_run({"task": "purge cache", **TESS})
    assert parked.state == "AWAITING_HITL"
    assert sorted(queued(rt, parked.run_id)) == sorted([
        ("approval.requested", "caller:t1"), ("approval.requested", "approver:t1-leads"),
        ("run.awaiting_approval", "caller:t1")])
    requested = payloads(rt, parked.run_id, "approval.requested")
    assert len({p["event_id"] for p in requested}) == 1
    data = requested[0]["data"]
    assert isinstance(data, dict)
    assert data["risk_level"] == "high" and data["level"] == "L3"
    assert data["description"] == "test.purge(what='cache')"
    assert str(data["deadline"]).endswith("Z") and "T" in str(data["deadline"])
    links = data["links"]
    assert isinstance(links, dict)
    assert links["approve"] == f"http://127.0.0.1:8000/ui/approvals?request={parked.approval_request_id}" \
                               "&decision=approve"
    rt.runs.decide(parked.approval_request_id or "", LEE, "approve")
    events = queued(rt, parked.run_id)
    assert sorted(events[3:5]) == [("approval.decided", "approver:t1-leads"), ("approval.decided", "caller:t1")]
    assert events[5:] == [("run.finished", "caller:t1")]
    decided = payloads(rt, parked.run_id, "approval.decided")[0]["data"]
    assert isinstance(decided, dict) and decided["decision"] == "approved" and decided["decided_by"] == ["t1/lee"]
    finished = payloads(rt, parked.run_id, "run.finished")[0]["data"]
    assert isinstance(finished, dict)
    assert finished["state"] == "SUCCEEDED" and finished["trace_id"] == parked.run_id and finished["final"]
    assert finished["path"][-1] == "SUCCEEDED" and "artifacts" in finished and "answer" in finished


def test_every_ending_pushes_its_result_whoever_closes_the_run(rt: Runtime, clock: FakeClock) -> None:
    """A reject, a cancel, an approval timeout and a sweeper's close (a queued Run past its start deadline)
    each push the final result, not only a drive; a Run with no callback pushes nothing to a caller."""
    rejected = rt.runs.create_run({"task": "purge cache", **TESS})
    rt.runs.decide(rejected.approval_request_id or "", LEE, "reject", reason="not now")
    cancelled = rt.runs.create_run({"task": "update T-5", **TESS})
    rt.runs.cancel(cancelled.run_id, by="t1/tess")
    timed_out = rt.runs.create_run({"task": "update T-6", **TESS})
    clock.advance(3601)
    rt.runs.expire_approvals()
    # a queued Run is never failed for waiting: the sweeper closes it only past its start deadline
    stuck, _ = rt.store.create_run(NewRun("t1", "tess", "s", {"task": "echo x", **TESS},
                                          start_by=clock.now() + 60))
    clock.advance(10_000)
    assert stuck.run_id in ZombieSweeper(rt.store, rt.machine).sweep_once().not_started
    silent = rt.runs.create_run({"task": "echo quiet", "tenant_id": "t1", "user_id": "tess", "roles": ["tester"]})
    finals = {run_id: payloads(rt, run_id, "run.finished") for run_id in
              (rejected.run_id, cancelled.run_id, timed_out.run_id, stuck.run_id)}
    states = {run_id: [p["data"]["state"] for p in found] for run_id, found in finals.items()}  # type: ignore[index]
    assert states == {rejected.run_id: ["CLOSED_REJECTED"], cancelled.run_id: ["CLOSED_CANCELLED"],
                      timed_out.run_id: ["CLOSED_REJECTED"], stuck.run_id: ["CLOSED_FAILED"]}
    assert ("approval.timed_out", "caller:t1") in queued(rt, timed_out.run_id)
    assert ("approval.cancelled", "caller:t1") in queued(rt, cancelled.run_id)
    assert payloads(rt, rejected.run_id, "approval.decided")[0]["data"]["decision"] == "rejected"  # type: ignore[index]
    assert queued(rt, silent.run_id) == []


def test_an_escalation_is_pushed_to_the_new_levels_approvers(rt: Runtime, clock: FakeClock) -> None:
    """An L3 request that times out into L4 pushes approval.escalated, in the escalation's transaction."""
    parked = rt.runs.create_run({"task": "purge cache", **TESS})
    clock.advance(3601)
    rt.runs.expire_approvals()
    escalated = payloads(rt, parked.run_id, "approval.escalated")
    assert [p["data"]["level"] for p in escalated] == ["L4"]  # type: ignore[index]
    assert escalated[0]["data"]["escalated_from"] == parked.approval_request_id  # type: ignore[index]


def test_no_change_commits_without_its_event_and_no_event_without_its_change(
        rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A close whose event cannot be queued rolls back whole (the Run stays where it was); a lost race
    queues nothing."""
    assert rt.webhook_outbox is not None
    parked = rt.runs.create_run({"task": "purge cache", **TESS})
    before = len(queued(rt, parked.run_id))

    def broken(*_args: object) -> None:
        raise sa.exc.OperationalError("INSERT INTO webhook_deliveries", {}, Exception("disk full"))

    monkeypatch.setattr(rt.webhook_outbox, "enqueue", broken)
    with pytest.raises(sa.exc.OperationalError):
        rt.runs.cancel(parked.run_id, by="t1/tess")
    assert rt.store.get_run(parked.run_id).state == RunState.AWAITING_HITL
    monkeypatch.undo()
    lost = rt.machine.transition(parked.run_id, RunState.EXECUTING, RunState.FAILED, actor="stale", reason="late")
    assert lost.lost_race and len(queued(rt, parked.run_id)) == before


def test_a_callback_needs_a_signing_secret_and_a_valid_url(rt: Runtime) -> None:
    """A callback of a tenant with no signing secret, or not http(s), is refused before any Run exists."""
    with pytest.raises(BadInputError, match="no webhook signing secret"):
        rt.runs.create_run({"task": "echo a", "tenant_id": "t2", "user_id": "mallory", "callback": CALLBACK})
    for bad in ("ftp://127.0.0.1/x", "http://user:pw@127.0.0.1/x", "not a url", "http:///nohost"):
        with pytest.raises(BadInputError, match="callback"):
            rt.runs.create_run({"task": "echo a", **{**TESS, "callback": bad}})
    with rt.store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t.runs)).scalar_one() == 0


def test_delivery_survives_a_receiver_that_is_down_answers_500_is_slow_then_recovers(
        rt: Runtime, clock: FakeClock) -> None:
    """Each failed attempt is retried after a doubling backoff; every request the receiver got carried a
    valid signature and the same webhook-id; the event ends delivered once the receiver answers 2xx."""
    with WebhookReceiver(mode="ok") as probe:
        port = probe.port
    url = f"http://127.0.0.1:{port}/hooks"
    result = rt.runs.create_run({"task": "echo hi", **{**TESS, "callback": url}})
    dispatcher = rt.dispatcher()
    try:
        assert dispatcher.deliver_once().retrying  # down: connection refused
        assert dispatcher.deliver_once().attempted == 0  # not due before its backoff
        delivery = rt.webhook_outbox.list(run_id=result.run_id)[0]  # type: ignore[union-attr]
        assert 10 <= delivery.next_attempt_at - clock.now() <= 11
        with WebhookReceiver(port=port, mode="500") as receiver:
            clock.advance(11)
            assert dispatcher.deliver_once().retrying
            receiver.mode, receiver.delay_s = "slow", 2.5  # longer than the 1 s send timeout
            clock.advance(23)
            assert dispatcher.deliver_once().retrying
            receiver.mode = "ok"
            clock.advance(45)
            assert dispatcher.deliver_once().delivered == [delivery.delivery_id]
            assert dispatcher.deliver_all().attempted == 0
            got = list(receiver.got)
    finally:
        dispatcher.close()
    assert len(got) == 3 and all(g.valid for g in got)
    assert {g.webhook_id for g in got} == {delivery.delivery_id}
    assert all(g.body == got[0].body for g in got)
    done = rt.webhook_outbox.get(delivery.delivery_id)  # type: ignore[union-attr]
    assert done is not None and done.status == "delivered" and done.attempts == 4


def test_a_delivery_is_dead_after_its_attempts_and_can_be_redelivered(rt: Runtime, clock: FakeClock) -> None:
    """After max_attempts failures a delivery is dead (listed, with its last error); redelivered, it is
    sent again with the same webhook-id and event id, and the redelivery is audited."""
    assert rt.webhook_outbox is not None
    with WebhookReceiver(mode="500") as receiver:
        result = rt.runs.create_run({"task": "echo hi", **{**TESS, "callback": receiver.url}})
        dispatcher = rt.dispatcher()
        try:
            for _ in range(4):
                dispatcher.deliver_once()
                clock.advance(200)
            dead = rt.webhook_outbox.list(status="dead")
            assert [d.run_id for d in dead] == [result.run_id] and dead[0].attempts == 4
            assert dead[0].last_error == "HTTP 5xx" and dead[0].last_status == 500
            assert dispatcher.deliver_once().attempted == 0
            receiver.mode = "ok"
            again = rt.webhook_outbox.redeliver(dead[0].delivery_id, tenant_id="t2", actor="x")
            assert again is None  # another tenant's delivery is not found
            again = rt.webhook_outbox.redeliver(dead[0].delivery_id, tenant_id="t1", actor="t1/ops")
            assert again is not None and again.status == "pending"
            assert dispatcher.deliver_once().delivered == [dead[0].delivery_id]
        finally:
            dispatcher.close()
        assert {g.webhook_id for g in receiver.got} == {dead[0].delivery_id} and len(receiver.got) == 5
        assert all(g.valid for g in receiver.got)
    assert [e.detail["delivery_id"] for e in rt.store.audit_events(event="webhook_redelivered")] == \
        [dead[0].delivery_id]


def test_a_secret_removed_from_the_configuration_makes_its_deliveries_dead(
        rt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delivery whose endpoint is no longer configured is not sent unsigned: it is dead, saying why."""
    assert rt.webhook_outbox is not None
    rt.runs.create_run({"task": "echo hi", **TESS})
    rt.webhooks._secrets.clear()  # type: ignore[union-attr]
    dispatcher = rt.dispatcher()
    try:
        report = dispatcher.deliver_once()
    finally:
        dispatcher.close()
    assert len(report.dead) == 1
    dead = rt.webhook_outbox.get(report.dead[0])
    assert dead is not None and "no longer configured" in (dead.last_error or "")


def test_the_payload_is_signed_over_its_exact_bytes(rt: Runtime) -> None:
    """A receiver with another secret rejects every delivery (none is accepted with a bad signature)."""
    other = "whsec_" + "b3RoZXItc2VjcmV0LW5vdC10aGUtY29uZmlndXJlZC0x"
    with WebhookReceiver(other, mode="ok") as receiver:
        rt.runs.create_run({"task": "echo hi", **{**TESS, "callback": receiver.url}})
        dispatcher = rt.dispatcher()
        try:
            report = dispatcher.deliver_once()
        finally:
            dispatcher.close()
        assert report.retrying and not report.delivered
        assert receiver.got and not any(g.valid for g in receiver.got)
    body = json.loads(rt.webhook_outbox.list()[0].payload)  # type: ignore[union-attr]
    assert body["type"] == "run.finished"


def test_a_deployment_with_nowhere_to_push_reads_nothing_for_pushes(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock, call_log: Path) -> None:
    """With no approver endpoint and no callback secret nothing can ever be pushed: a Run's park and close
    read nothing for it. With a webhooks file, the same Runs read their snapshot at each."""
    from harness.adapters.sql.webhooks import WebhookOutbox

    reads: list[str] = []
    snapshot = WebhookOutbox.run_snapshot

    def counted(tx: object, run_id: str) -> object:
        reads.append(run_id)
        return snapshot(tx, run_id)

    monkeypatch.setattr(WebhookOutbox, "run_snapshot", staticmethod(counted))
    monkeypatch.delenv("HARNESS_WEBHOOK_SECRET", raising=False)
    plain = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
    quiet = webhook_runtime(backend_url, tmp_path, None, clock)
    try:
        assert quiet.webhooks is not None and not quiet.webhooks.sends_anything()
        done = quiet.runs.create_run({"task": "echo quiet", **plain})
        parked = quiet.runs.create_run({"task": "purge cache", **plain})
        assert (done.state, parked.state) == ("SUCCEEDED", "AWAITING_HITL")
        assert reads == []
    finally:
        quiet.close()
    pushing = webhook_runtime(backend_url, tmp_path, write_config(tmp_path, monkeypatch), clock)
    try:
        assert pushing.webhooks is not None and pushing.webhooks.sends_anything()
        done = pushing.runs.create_run({"task": "echo told", **TESS})
        assert done.state == "SUCCEEDED" and done.run_id in reads
        assert queued(pushing, done.run_id) == [("run.finished", "caller:t1")]
    finally:
        pushing.close()
