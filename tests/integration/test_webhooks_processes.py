"""Webhook delivery across OS processes (SPEC P4 / N1): delivery processes released together never send
one event twice; a process SIGKILLed between a commit and its send loses nothing; a receiver killed
mid-delivery gets the event again, under the same webhook-id. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.adapters.sql.store import SqlStore
from harness.adapters.sql.webhooks import WebhookOutbox
from harness.adapters.webhook_http import WebhookSender
from harness.clock import FakeClock
from harness.domain.ids import ordered_id
from harness.domain.webhooks import OutgoingEvent
from harness.kernel.states import FINAL
from harness.webhooks.config import load_webhook_config
from harness.webhooks.delivery import WebhookDispatcher
from tests.fakes.webhook_receiver import Got, read_log, start_process
from tests.integration.test_races import start_forked

from .webhook_setup import webhook_runtime, write_config

pytestmark = pytest.mark.slow
DISPATCHERS, EVENTS = 3, 24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dispatch(db: str, config: str, barrier: Any, out: str) -> None:
    """One delivery process: wait for the others, then deliver until nothing is due; report by file."""
    store = SqlStore.open(db, migrate_schema=False)
    loaded = load_webhook_config(Path(config))
    dispatcher = WebhookDispatcher(WebhookOutbox(store), loaded, WebhookSender(loaded.delivery.timeout_s))
    barrier.wait(30)
    report = dispatcher.deliver_all()
    Path(out).write_text(json.dumps(report.to_dict()))


def _assert_signed_and_same(got: list[Got]) -> Counter[str]:
    """Every request verified; repeats of a webhook-id carried the same body. Returns the counts by id."""
    assert got and all(g.valid for g in got), [g for g in got if not g.valid]
    bodies: dict[str, Any] = {}
    for g in got:
        assert bodies.setdefault(g.webhook_id, g.body) == g.body
    return Counter(g.webhook_id for g in got)


def test_delivery_processes_released_together_send_each_event_once(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three processes claiming from one outbox at once (a barrier) send every event exactly once: the
    claims' row locks (SKIP LOCKED; SQLite's write lock) give each delivery to one process."""
    port, log = _free_port(), str(tmp_path / "received.jsonl")
    config = write_config(tmp_path, monkeypatch, timeout_s=5.0, lease_s=30, batch=4)
    store = SqlStore.open(backend_url)
    outbox = WebhookOutbox(store)
    with store.engine.begin() as conn:
        outbox.enqueue(conn, [OutgoingEvent(ordered_id(), "run.finished", None, "t1", "caller:t1",
                                            f"http://127.0.0.1:{port}/hooks", {"n": n}) for n in range(EVENTS)])
    receiver = start_process(port, log, "slow", delay_s=0.03)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(DISPATCHERS)
    outs = [str(tmp_path / f"report-{i}.json") for i in range(DISPATCHERS)]
    children = [ctx.Process(target=_dispatch, args=(backend_url, str(config), barrier, out)) for out in outs]
    try:
        start_forked(store, *children)
        for child in children:
            child.join(120)
            assert child.exitcode == 0
    finally:
        receiver.kill()
        receiver.wait(10)
    reports = [json.loads(Path(out).read_text()) for out in outs]
    delivered = [d for r in reports for d in r["delivered"]]
    ids = {d.delivery_id for d in outbox.list(limit=1000)}
    assert sorted(delivered) == sorted(ids) and len(delivered) == EVENTS
    assert sum(1 for r in reports if r["delivered"]) >= 2, "one process took everything: nothing raced"
    counts = _assert_signed_and_same(read_log(log))
    assert set(counts) == ids and set(counts.values()) == {1}
    assert outbox.counts() == {"pending": 0, "delivered": EVENTS, "dead": 0}
    store.close()


def _drive_and_deliver(db: str, tmp: str, config: str, callback: str, ready: Any) -> None:
    """Create Runs with a callback and drive them to their end (each close commits its event), delivering
    after every third: until killed. Events therefore wait between their commit and their send most of the
    time, whatever the machine's speed, as well as in the middle of a send."""
    rt = webhook_runtime(db, Path(tmp), Path(config))
    dispatcher = rt.dispatcher()
    n = 0
    while True:
        rt.runs.create_run({"task": f"echo {n}", "tenant_id": "t1", "user_id": "tess", "roles": ["tester"],
                            "callback": callback})
        ready.set()
        if n % 3 == 2:
            dispatcher.deliver_once()
        n += 1


def test_a_process_killed_between_commit_and_send_loses_no_event(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call_log: Path) -> None:
    """SIGKILL at random moments of a process that commits Runs' closes and sends their events: every
    closed Run has its one result event, every event its closed Run; after the leases run out another
    process delivers every event, each signed, repeats only under the same webhook-id."""
    port, log = _free_port(), str(tmp_path / "received.jsonl")
    config = write_config(tmp_path, monkeypatch, timeout_s=2.0, lease_s=10)
    callback = f"http://127.0.0.1:{port}/hooks"
    receiver = start_process(port, log, "slow", delay_s=0.15)
    store = SqlStore.open(backend_url)
    outbox = WebhookOutbox(store)
    ctx, rng, left_pending = mp.get_context("fork"), random.Random(), 0
    try:
        for _ in range(3):
            ready = ctx.Event()
            child = ctx.Process(target=_drive_and_deliver,
                                args=(backend_url, str(tmp_path), str(config), callback, ready))
            start_forked(store, child)
            assert ready.wait(60)
            time.sleep(rng.uniform(0.2, 0.9))
            os.kill(child.pid or 0, signal.SIGKILL)
            child.join(30)
            assert child.exitcode == -signal.SIGKILL
            left_pending += outbox.counts()["pending"]
        finals = {r.run_id for r in store.list_runs(tenant_id="t1", limit=10_000) if r.state in FINAL}
        events = [d for d in outbox.list(limit=10_000) if d.event_type == "run.finished"]
        assert sorted(d.run_id or "" for d in events) == sorted(finals)  # one event per close, none without
        assert left_pending > 0, "no kill left an event unsent: the test proved nothing"
        later = SqlStore(store.engine, FakeClock(time.time() + 60))  # every lease the dead process held is over
        rt_config = load_webhook_config(config)
        dispatcher = WebhookDispatcher(WebhookOutbox(later), rt_config, WebhookSender(rt_config.delivery.timeout_s))
        report = dispatcher.deliver_all()
        dispatcher.close()
        assert not report.dead and outbox.counts()["pending"] == 0
    finally:
        receiver.kill()
        receiver.wait(10)
    counts = _assert_signed_and_same(read_log(log))
    assert set(counts) == {d.delivery_id for d in outbox.list(limit=10_000)}
    store.close()
