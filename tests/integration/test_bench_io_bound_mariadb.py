"""The I/O-bound benchmark (issue 37) on MariaDB: `harness serve` on a fresh MariaDB database, five Runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from tests.integration.conftest import MARIADB_ADMIN, require_service

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_io_bound.py"


def _bench_databases() -> set[str]:
    engine = sa.create_engine(MARIADB_ADMIN, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.text("SHOW DATABASES LIKE 'hk_bench_%'")).scalars())
    finally:
        engine.dispose()


def test_harness_serve_on_mariadb_drives_every_run_and_drops_its_database() -> None:
    """Five Runs POSTed at once to `harness serve` on MariaDB all succeed, each with its two model calls, its
    connections are counted, and the database made for it is gone afterwards."""
    require_service("mariadb")
    before = _bench_databases()
    done = subprocess.run([sys.executable, str(BENCH), "--runs", "5", "--delay", "0.05", "--limit-s", "60", "--json",
                           "--backends", "mariadb", "--no-langgraph"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)["rounds"][0].values()
    assert "error" not in result, result
    assert result["contender"] == "harness-mariadb"
    assert result["failures"] == 0 and result["succeeded"] == 5 and result["model_calls"] == 10
    assert result["peak_pg_connections"] >= 1  # the service's pool, read from MariaDB's processlist
    assert _bench_databases() <= before
