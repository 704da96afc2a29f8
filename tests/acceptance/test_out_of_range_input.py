"""Input at the edges of what a number or a date can hold, as callers send it: the HTTP API answers a 422
naming the field and the CLI exits 2 with one line naming the option, never a 500 or a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from harness.cli import app
from harness.config import Runtime
from tests.acceptance.api_helpers import key, make_client, make_runtime
from tests.fakes.webhook_receiver import SECRET

#: callback URLs whose host no resolver can be asked for (a label over 63 characters, an empty label)
BAD_HOSTS = [f"http://{'a' * 64}.com/", "http://a..b/", "http://.example.com/"]
#: start deadlines whose offsets take them past the last or before the first day a date can hold
OUT_OF_RANGE_TIMES = ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+14:00"]


@pytest.fixture(name="client")
def client_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The service over the support example, signing callbacks (server errors raised to the test, not
    hidden as a 500)."""
    monkeypatch.setenv("HARNESS_WEBHOOK_SECRET", SECRET)
    runtime: Runtime = make_runtime(tmp_path, monkeypatch)
    try:
        with make_client(runtime) as client:
            yield client
    finally:
        runtime.close()


def harness(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    """`harness ARGS` on a throwaway database, run in this process."""
    return CliRunner().invoke(app, [*args, "--db", str(tmp_path / "cli.db")],
                              env={"HARNESS_DATA_DIR": str(tmp_path / "data"), **(env or {})})


def refused(result: Result, *words: str) -> None:
    """The command exited 2 with a message naming `words`, and no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output and not isinstance(result.exception, ArithmeticError | UnicodeError)
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.mark.parametrize("start_by", OUT_OF_RANGE_TIMES)
def test_http_start_by_out_of_range_is_422_naming_the_field(client: TestClient, start_by: str) -> None:
    """A start_by whose offset takes it out of the dates UTC can hold is a 422 naming start_by."""
    response = client.post("/api/v1/runs", json={"task": "hi", "start_by": start_by}, headers=key("alice"))
    assert response.status_code == 422, response.text
    assert "start_by" in response.json()["detail"] and "out of range" in response.json()["detail"]


@pytest.mark.parametrize("start_by", OUT_OF_RANGE_TIMES)
def test_cli_start_by_out_of_range_is_exit_2(tmp_path: Path, start_by: str) -> None:
    """`harness run --start-by` out of the dates UTC can hold exits 2 naming start_by."""
    refused(harness(tmp_path, "run", "hi", "--start-by", start_by), "start_by", "out of range")


@pytest.mark.parametrize("url", BAD_HOSTS)
def test_http_callback_with_an_invalid_host_name_is_422(client: TestClient, url: str) -> None:
    """A callback whose host is no valid host name is a 422 naming callback, not a resolver's UnicodeError."""
    response = client.post("/api/v1/runs", json={"task": "hi", "callback": url}, headers=key("alice"))
    assert response.status_code == 422, response.text
    assert "callback" in response.json()["detail"] and "not a valid host name" in response.json()["detail"]


@pytest.mark.parametrize("url", BAD_HOSTS)
def test_cli_webhooks_test_with_an_invalid_host_name_is_exit_2(tmp_path: Path, url: str) -> None:
    """`harness webhooks test URL` with a host that is no valid host name exits 2 saying so."""
    result = CliRunner().invoke(app, ["webhooks", "test", url], env={"HARNESS_WEBHOOK_SECRET": SECRET})
    refused(result, "not a valid host name")


@pytest.mark.parametrize(("variable", "value"), [("HARNESS_QUEUE_MAX_WAIT_S", "inf"),
                                                 ("HARNESS_QUEUE_MAX_WAIT_S", "1e300"),
                                                 ("HARNESS_LEASE_TTL_S", "1e400")])
def test_cli_run_refuses_an_absurd_duration_setting(tmp_path: Path, variable: str, value: str) -> None:
    """A duration setting of infinity or 1e300 stops `harness run` with exit 2 naming the setting, instead of
    an overflow in the queue's deadline or the lease's heartbeat thread."""
    name = variable.removeprefix("HARNESS_").lower()
    refused(harness(tmp_path, "run", "hi", env={variable: value}), "invalid settings", name)


@pytest.mark.parametrize("seconds", ["inf", "1e300", "3e11", "nan"])
def test_cli_run_start_within_out_of_range_is_exit_2(tmp_path: Path, seconds: str) -> None:
    """`harness run --start-within` past 366 days, infinite or NaN exits 2 naming the option."""
    refused(harness(tmp_path, "run", "hi", "--start-within", seconds), "--start-within")


@pytest.mark.parametrize("since", ["99999999999d", "800000d", "9999999999999999999999h"])
def test_cli_costs_since_before_the_year_1_is_exit_2(tmp_path: Path, since: str) -> None:
    """`harness costs --since` reaching back before the first date is exit 2 naming --since."""
    refused(harness(tmp_path, "costs", "--since", since), "--since", "before the year 1")


@pytest.mark.parametrize("seconds", ["inf", "1e300", "nan"])
def test_cli_webhooks_test_timeout_out_of_range_is_exit_2(seconds: str) -> None:
    """`harness webhooks test URL --timeout` past 300 s, infinite or NaN exits 2 naming --timeout."""
    result = CliRunner().invoke(app, ["webhooks", "test", "http://127.0.0.1:9/", "--timeout", seconds],
                                env={"HARNESS_WEBHOOK_SECRET": SECRET})
    refused(result, "--timeout")


@pytest.mark.parametrize("seconds", ["inf", "1e300", "-1", "nan", "0"])
def test_cli_sweep_forever_refuses_an_interval_not_above_0_or_not_finite(tmp_path: Path, seconds: str) -> None:
    """`harness sweep --forever --interval` of 0, a negative number, NaN or infinity exits 2 naming
    --interval, instead of sweeping in a tight loop, never, or with a traceback (a process of its own, so
    that a loop that does start ends the test at its timeout instead of hanging it)."""
    done = subprocess.run([sys.executable, "-m", "harness.cli", "sweep", "--forever", "--interval", seconds,
                           "--db", str(tmp_path / "cli.db")], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "HARNESS_DATA_DIR": str(tmp_path / "data")})
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "--interval" in done.stderr


@pytest.mark.parametrize("seconds", ["inf", "nan", "0", "-5"])
def test_cli_run_wait_timeout_not_above_0_or_not_finite_is_exit_2(tmp_path: Path, seconds: str) -> None:
    """`harness run --wait --timeout nan` stopped waiting at once; now every such value is refused."""
    refused(harness(tmp_path, "run", "hi", "--wait", "--timeout", seconds), "--timeout")
    assert not (tmp_path / "cli.db").exists()  # refused while the options were read, before any Run


@pytest.mark.parametrize("days", ["inf", "nan"])
def test_cli_archive_older_than_days_not_finite_is_exit_2(tmp_path: Path, days: str) -> None:
    """`harness archive --older-than-days inf` was taken as a period ("keep final Runs inf day(s)")."""
    refused(harness(tmp_path, "archive", "--older-than-days", days, "--dry-run"), "--older-than-days")
