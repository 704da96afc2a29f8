"""Callbacks may not reach inside the deployment's network (server-side request forgery): a callback whose
host is or resolves to an internal address is refused at intake and at every send, against real loopback
listeners; an operator's per-tenant allowance lets internal receivers through."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.webhook_http import REFUSED_TARGET, WebhookSender
from harness.clock import FakeClock
from harness.config import Runtime
from harness.domain.errors import BadInputError
from harness.domain.outbound import OutboundGuard, OutboundRule
from tests.fakes.webhook_receiver import SECRET, WebhookReceiver

from .webhook_setup import webhook_runtime, write_config

TESS = {"task": "echo hi", "tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


@pytest.fixture
def guarded(backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock,
            call_log: Path) -> Iterator[Runtime]:
    """A pushing runtime whose tenant has no allowance for internal receivers (the default)."""
    monkeypatch.delenv("HARNESS_CALLBACK_ALLOW_INTERNAL", raising=False)
    runtime = webhook_runtime(backend_url, tmp_path, write_config(tmp_path, monkeypatch, internal=()), clock)
    yield runtime
    runtime.close()


def spellings(port: int) -> list[str]:
    """The loopback receiver's address as an attacker would spell it."""
    return [f"http://{host}:{port}/hook" for host in (
        "127.0.0.1", "localhost", "0x7f000001", "2130706433", "127.1", "0177.0.0.1", "[::ffff:127.0.0.1]",
        "[::1]", "LocalHost.")]


def test_a_callback_to_an_internal_address_is_refused_at_intake(guarded: Runtime) -> None:
    """Every spelling of a loopback listener, and the cloud metadata address, is refused when the Run is
    created, naming the opt-in; nothing is queued and nothing reaches the listener."""
    with WebhookReceiver() as receiver:
        port = int(receiver.url.rsplit(":", 1)[1].split("/", 1)[0])
        for url in [*spellings(port), "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/x"]:
            with pytest.raises(BadInputError, match="internal_callbacks") as refused:
                guarded.runs.create_run({**TESS, "callback": url})
            assert "callback" in str(refused.value)
        assert guarded.webhook_outbox is not None and guarded.webhook_outbox.list() == []
        assert receiver.got == []


def test_a_delivery_to_an_internal_address_is_refused_when_sent(
        guarded: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delivery whose target became internal after intake (the allowance withdrawn) is not sent: it is
    dead at once, and what its tenant reads is the category, not the network's answer."""
    assert guarded.webhooks is not None and guarded.webhook_outbox is not None
    with WebhookReceiver() as receiver:
        monkeypatch.setenv("HARNESS_CALLBACK_ALLOW_INTERNAL", "127.0.0.0/8")
        guarded.webhooks.load_secrets()
        guarded.runs.create_run({**TESS, "callback": receiver.url})
        monkeypatch.delenv("HARNESS_CALLBACK_ALLOW_INTERNAL")
        guarded.webhooks.load_secrets()
        dispatcher = guarded.dispatcher()
        try:
            report = dispatcher.deliver_once()
        finally:
            dispatcher.close()
        assert len(report.dead) == 1 and receiver.got == []
    dead = guarded.webhook_outbox.get(report.dead[0])
    assert dead is not None and dead.last_error == REFUSED_TARGET and dead.attempts == 1


def test_an_allowed_tenant_reaches_its_internal_receiver(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock,
        call_log: Path) -> None:
    """With `internal_callbacks` naming the loopback network, the same spellings are accepted and
    delivered, signed, to the real listener."""
    monkeypatch.delenv("HARNESS_CALLBACK_ALLOW_INTERNAL", raising=False)
    config = write_config(tmp_path, monkeypatch, internal=("127.0.0.0/8",))
    runtime = webhook_runtime(backend_url, tmp_path, config, clock)
    try:
        with WebhookReceiver() as receiver:
            port = int(receiver.url.rsplit(":", 1)[1].split("/", 1)[0])
            for url in (f"http://127.0.0.1:{port}/a", f"http://0x7f000001:{port}/b", f"http://localhost:{port}/c"):
                runtime.runs.create_run({**TESS, "callback": url})
            dispatcher = runtime.dispatcher()
            try:
                report = dispatcher.deliver_all()
            finally:
                dispatcher.close()
            assert len(report.delivered) == 3 and not report.dead
            assert sorted(g.path for g in receiver.got) == ["/a", "/b", "/c"]
            assert all(g.valid for g in receiver.got)
            with pytest.raises(BadInputError):  # the allowance is loopback, not every internal network
                runtime.runs.create_run({**TESS, "callback": "http://169.254.169.254/"})
    finally:
        runtime.close()


def test_the_send_connects_to_the_address_it_checked() -> None:
    """A name is resolved once and the request goes to that checked address with the URL's Host header:
    a name that resolves inside is refused, and one allowed reaches the listener under its own name."""
    answers = {"rebound.test": ["127.0.0.1"]}
    sender = WebhookSender(2.0, guard=OutboundGuard(lambda host: answers[host]))
    try:
        with WebhookReceiver() as receiver:
            port = int(receiver.url.rsplit(":", 1)[1].split("/", 1)[0])
            refused = sender.send(f"http://rebound.test:{port}/x", "m1", "{}", SECRET)
            assert not refused.ok and not refused.retry and refused.error == REFUSED_TARGET
            assert receiver.got == []
            sent = sender.send(f"http://rebound.test:{port}/y", "m2", "{}", SECRET,
                               rule=OutboundRule.parse(["127.0.0.1"]))
            assert sent.ok and [g.path for g in receiver.got] == ["/y"] and receiver.got[0].valid
    finally:
        sender.close()


def test_a_failed_send_tells_a_category_not_the_network_answer() -> None:
    """A closed port reads "refused", a silent listener "timed out", a 500 "HTTP 5xx"."""
    loopback = OutboundRule.parse(["127.0.0.1"])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    sender = WebhookSender(0.5)
    try:
        assert sender.send(f"http://127.0.0.1:{port}/", "m1", "{}", SECRET, rule=loopback).error == "refused"
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
            assert sender.send(url, "m2", "{}", SECRET, rule=loopback).error == "timed out"
        with WebhookReceiver(mode="500") as receiver:
            assert sender.send(receiver.url, "m3", "{}", SECRET, rule=loopback).error == "HTTP 5xx"
    finally:
        sender.close()
