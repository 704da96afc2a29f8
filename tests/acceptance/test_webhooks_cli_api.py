"""The pushes and the cost view as users drive them: `harness webhooks test|deliver|list|redeliver`,
`harness costs`, the deliveries and costs API (tenant-scoped, redelivery for operators only) and the
console's Webhooks page."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config import Runtime, build_runtime
from harness.settings import Settings
from tests.fakes.webhook_receiver import SECRET, WebhookReceiver

from .api_helpers import make_client

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KEYS = {"t1/tess": "tess-key-0123456789", "t1/olga": "olga-key-0123456789", "t2/mallory": "mallory-key-012345"}
ROLES = {"t1/tess": ["tester"], "t1/olga": ["operator"], "t2/mallory": ["tester", "lead"]}


@dataclass
class Ran:
    """What one `harness` command did."""

    returncode: int
    stdout: str
    stderr: str


def harness(*args: str, env: dict[str, str] | None = None) -> Ran:
    """The `harness` command line, run in this process (as the console script would run it)."""
    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    return Ran(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def rt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call_log: Path) -> Iterator[Runtime]:
    """t1's callbacks signed with the receiver's secret; 2 attempts, 0.3 s apart; API keys for tess, olga,
    mallory; on the system clock, which the CLI's processes share."""
    monkeypatch.setenv("HARNESS_WEBHOOK_SECRET", SECRET)
    identities = {"identities": {who: {"roles": ROLES[who], "api_key_sha256": hashlib.sha256(k.encode()).hexdigest()}
                                 for who, k in KEYS.items()}}
    (tmp_path / "identities.yaml").write_text(yaml.safe_dump(identities))
    (tmp_path / "webhooks.yaml").write_text(yaml.safe_dump({
        "callback_secrets": {"*": {"secret_env": "HARNESS_WEBHOOK_SECRET"}},
        "internal_callbacks": {"t1": ["127.0.0.1"]},  # the loopback receiver of these tests
        "delivery": {"max_attempts": 2, "backoff_s": 0.3, "timeout_s": 2}}))
    runtime = build_runtime(Settings(
        db=str(tmp_path / "w.db"), skills_dirs=(FIXTURES / "skills",), policy_file=FIXTURES / "policy.yaml",
        llm_rules=FIXTURES / "llm_rules.yaml", identities_file=tmp_path / "identities.yaml",
        data_dir=tmp_path / "data", webhooks_file=tmp_path / "webhooks.yaml"))
    yield runtime
    runtime.close()


def test_webhooks_test_sends_a_signed_ping_and_says_how_it_went() -> None:
    """A 2xx receiver verifies the ping (exit 0); a failing one is exit 1; a bad URL or secret is exit 2."""
    env = {"HARNESS_WEBHOOK_SECRET": SECRET}
    with WebhookReceiver() as receiver:
        done = harness("webhooks", "test", receiver.url, "--json", env=env)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["ok"] and doc["status_code"] == 204
        assert [g.valid for g in receiver.got] == [True] and receiver.got[0].webhook_id == doc["webhook_id"]
        assert receiver.got[0].body and receiver.got[0].body["type"] == "webhook.ping"
        receiver.mode = "500"
        assert harness("webhooks", "test", receiver.url, env=env).returncode == 1
    for args, message in ((["ftp://127.0.0.1/x"], "http or https"), (["http://127.0.0.1:9/x", "--secret-env",
                                                                        "UNSET_SECRET_VAR"], "empty or unset")):
        bad = harness("webhooks", "test", *args, env=env)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr
    wrong = harness("webhooks", "test", "http://127.0.0.1:9/x", env={"HARNESS_WEBHOOK_SECRET": "not-base64!"})
    assert wrong.returncode == 2 and "not a Standard Webhooks secret" in wrong.stderr
    assert "not-base64!" not in wrong.stderr  # a secret never appears in a message


def test_dead_letters_through_the_cli_and_the_api(rt: Runtime, tmp_path: Path) -> None:
    """A push that fails its attempts is dead: `harness webhooks list --status dead` and the API show it to
    its tenant only; only an operator redelivers it; `harness webhooks deliver` then sends it."""
    db = str(tmp_path / "w.db")
    env = {"HARNESS_WEBHOOKS_FILE": str(tmp_path / "webhooks.yaml"), "HARNESS_IDENTITIES": str(tmp_path /
                                                                                                "identities.yaml")}
    with WebhookReceiver(mode="500") as receiver:
        result = rt.runs.create_run({"task": "echo hi", "tenant_id": "t1", "user_id": "tess", "roles": ["tester"],
                                     "callback": receiver.url})
        for _ in range(2):
            out = harness("webhooks", "deliver", "--db", db, "--json", env=env)
            assert out.returncode == 0, out.stderr
            time.sleep(0.4)  # the CLI runs on the system clock: let the 0.3 s backoff pass
        listed = json.loads(harness("webhooks", "list", "--status", "dead", "--db", db, "--json", env=env).stdout)
        assert [d["run_id"] for d in listed["deliveries"]] == [result.run_id] and listed["counts"]["dead"] == 1
        dead_id = listed["deliveries"][0]["delivery_id"]
        with make_client(rt, webhook_interval_s=0) as client:
            tess, olga, mallory = ({"X-API-Key": KEYS[w]} for w in ("t1/tess", "t1/olga", "t2/mallory"))
            page = client.get("/api/v1/webhooks/deliveries", params={"status": "dead"}, headers=tess).json()
            assert [d["delivery_id"] for d in page["deliveries"]] == [dead_id]
            assert page["deliveries"][0]["last_error"] == "HTTP 5xx"
            assert client.get("/api/v1/webhooks/deliveries", headers=mallory).json()["deliveries"] == []
            assert client.post(f"/api/v1/webhooks/deliveries/{dead_id}/redeliver", headers=tess).status_code == 403
            assert client.post(f"/api/v1/webhooks/deliveries/{dead_id}/redeliver",
                               headers={"X-API-Key": KEYS["t2/mallory"]}).status_code == 403
            again = client.post(f"/api/v1/webhooks/deliveries/{dead_id}/redeliver", headers=olga)
            assert again.status_code == 200 and again.json()["status"] == "pending"
            assert client.post(f"/api/v1/webhooks/deliveries/{dead_id}/redeliver", headers=olga).status_code == 409
            assert client.get("/api/v1/webhooks/deliveries", params={"status": "nope"}, headers=tess).status_code == 422
            client.post("/ui/login", data={"api_key": KEYS["t1/olga"], "next": "/ui/webhooks"})
            html = client.get("/ui/webhooks").text
            assert dead_id in html and "run.finished" in html
        receiver.mode = "ok"
        sent = json.loads(harness("webhooks", "deliver", "--db", db, "--json", env=env).stdout)
        assert sent["delivered"] == [dead_id]
        assert all(g.valid for g in receiver.got) and {g.webhook_id for g in receiver.got} == {dead_id}
    assert harness("webhooks", "redeliver", "nope", "--db", db, env=env).returncode == 2
    assert harness("webhooks", "list", "--status", "lost", "--db", db, env=env).returncode == 2


def test_a_callback_over_http_is_validated(rt: Runtime) -> None:
    """The run API refuses a callback that is not http(s) with a 422 naming the field, and accepts one."""
    with make_client(rt, webhook_interval_s=0) as client:
        tess = {"X-API-Key": KEYS["t1/tess"]}
        bad = client.post("/api/v1/runs", json={"task": "echo hi", "callback": "file:///etc/passwd"}, headers=tess)
        assert bad.status_code == 422 and "callback" in bad.text
        ok = client.post("/api/v1/runs", json={"task": "echo hi", "callback": "http://127.0.0.1:9/h"}, headers=tess)
        assert ok.status_code == 202, ok.text


def test_harness_costs_and_the_cost_api(rt: Runtime, tmp_path: Path) -> None:
    """`harness costs --by user --since 7d --json` and GET /api/v1/costs agree; bad input is exit 2 / 422."""
    for user in ("tess", "olga"):
        rt.runs.create_run({"task": "echo hi", "tenant_id": "t1", "user_id": user, "roles": ["tester"]})
    db = str(tmp_path / "w.db")
    out = harness("costs", "--by", "user", "--since", "7d", "--json", "--db", db)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    assert {g["key"] for g in doc["groups"]} == {"tess", "olga"} and doc["total_usd"] > 0
    assert harness("costs", "--by", "planet", "--db", db).returncode == 2
    assert harness("costs", "--since", "last tuesday", "--db", db).returncode == 2
    with make_client(rt, webhook_interval_s=0) as client:
        tess = {"X-API-Key": KEYS["t1/tess"]}
        view = client.get("/api/v1/costs", params={"group_by": "user"}, headers=tess).json()
        assert view["total_usd"] == pytest.approx(doc["total_usd"])
        assert client.get("/api/v1/costs", headers={"X-API-Key": KEYS["t2/mallory"]}).json()["groups"] == []
        assert client.get("/api/v1/costs", params={"from": "yesterday"}, headers=tess).status_code == 422
        assert client.get("/api/v1/costs", params={"from": "2030-01-02", "to": "2030-01-01"},
                          headers=tess).status_code == 422
        assert client.get("/api/v1/costs", params={"group_by": "planet"}, headers=tess).status_code == 422
        assert client.get("/api/v1/costs", params={"group_by": "day", "from": "2999-01-01"},
                          headers=tess).json()["groups"] == []


def test_the_api_refuses_a_callback_inside_the_network(rt: Runtime) -> None:
    """A tenant without an allowance gets a 422 naming the opt-in for a callback to a loopback service
    (Redis here), however spelled; the tenant allowed loopback receivers is accepted."""
    with make_client(rt, webhook_interval_s=0) as client:
        mallory, tess = {"X-API-Key": KEYS["t2/mallory"]}, {"X-API-Key": KEYS["t1/tess"]}
        for url in ("http://localhost:6379/", "http://2130706433:5432/", "http://169.254.169.254/latest/"):
            refused = client.post("/api/v1/runs", json={"task": "echo hi", "callback": url}, headers=mallory)
            assert refused.status_code == 422, refused.text
            assert "internal" in refused.text and "internal_callbacks" in refused.text
        accepted = client.post("/api/v1/runs", json={"task": "echo hi", "callback": "http://127.0.0.1:9/x"},
                               headers=tess)
        assert accepted.status_code == 202, accepted.text
