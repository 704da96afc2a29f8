"""`harness worker` with a broker URL Celery cannot use (an unknown transport, one whose client library is
missing, a URL that does not parse, a Redis database that is not a number) is bad input: exit 2 and one line
naming the URL (never its password) and what is wrong, before the database is touched or Celery starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = [
    ("bogus://x", "no such transport 'bogus'"),
    ("amqp://ana:s3cret@rabbit:notaport//", "Port could not be cast to integer"),
    ("redis://[::1", "Invalid IPv6 URL"),
    ("redis://:s3cret@127.0.0.1:6379/zz", "the Redis database is a number, not 'zz'"),
]


@pytest.mark.parametrize(("url", "problem"), CASES, ids=[c[1].split()[0] for c in CASES])
@pytest.mark.parametrize("how", ["option", "env"])
def test_a_broker_url_celery_cannot_use_is_exit_2(tmp_path: Path, url: str, problem: str, how: str) -> None:
    """Given as --broker or HARNESS_BROKER_URL: one line naming it, exit 2, no traceback, no database made."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["HARNESS_DATA_DIR"] = str(tmp_path / "data")
    argv = [sys.executable, "-m", "harness.cli", "worker", "--db", str(tmp_path / "h.db")]
    if how == "option":
        argv += ["--broker", url]
    else:
        env["HARNESS_BROKER_URL"] = url
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: broker "), done.stderr[-3000:]
    assert problem in lines[0] and "s3cret" not in lines[0], lines[0]
    assert not (tmp_path / "h.db").exists(), "the database was made before the bad broker was named"


def test_submit_with_a_broker_celery_cannot_use_makes_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`celery_app.submit` refuses a broker Celery cannot use before the Run is made: no Run is left in
    CREATED that no worker was told about."""
    from harness import celery_app
    from harness.config import build_runtime
    from harness.domain.errors import InvalidRequestError
    from harness.settings import Settings

    monkeypatch.setattr(celery_app, "app", celery_app.make_app("bogus://x"))
    rt = build_runtime(Settings(db=str(tmp_path / "h.db"), data_dir=tmp_path / "data"))
    try:
        with pytest.raises(InvalidRequestError, match="no such transport 'bogus'"):
            celery_app.submit({"task": "Where is order A-1001?", "user_id": "alice"}, rt)
        with pytest.raises(InvalidRequestError, match="no such transport 'bogus'"):
            celery_app.enqueue("any-run")
        assert rt.store.list_runs() == []
    finally:
        rt.close()
