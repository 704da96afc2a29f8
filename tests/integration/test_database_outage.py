"""A database that drops connections, refuses them or refuses writes is answered with the documented JSON
error (503 `database_unavailable` with Retry-After), never a plain-text 500, and /health reports it —
writes included — on SQLite, PostgreSQL and MariaDB; the refused request creates nothing and the service
recovers when the database does (SPEC U2).

The database really refuses: PostgreSQL's sessions are terminated (pg_terminate_backend) and the database
made read-only or closed to connections; MariaDB's connections are killed and the service's own account
loses its write privileges or is locked; SQLite's files are made immutable (chattr +i: root ignores
file modes).
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from harness.adapters.sql import schema as t
from harness.config import build_runtime
from harness.service.app import create_app
from harness.service.settings import ServiceSettings
from harness.settings import Settings
from tests.acceptance.api_helpers import ORDER_STATUS, key

from .conftest import MARIADB_ADMIN, PG_ADMIN


class Outage:
    """Makes one backend's database refuse, and takes it back."""

    url: str
    can_refuse_connections = True

    def refuse_writes(self) -> None:
        """Reads still work; every write fails."""
        raise NotImplementedError

    def refuse_connections(self) -> None:
        """Every session is dropped and no new one is accepted."""
        raise NotImplementedError

    def restore(self) -> None:
        """The database works again."""
        raise NotImplementedError


class SqliteOutage(Outage):
    """The database file and its write-ahead log made immutable: existing connections' writes fail with
    an I/O error, new connections open read-only; reads go on."""

    can_refuse_connections = False

    def __init__(self, path: Path) -> None:
        self.url = str(path)
        self.files = [path, path.with_name(path.name + "-wal")]

    def refuse_writes(self) -> None:
        for f in self.files:
            subprocess.run(["chattr", "+i", str(f)], check=True)

    def restore(self) -> None:
        for f in self.files:
            subprocess.run(["chattr", "-i", str(f)], check=False)


class PostgresOutage(Outage):
    """Sessions terminated; the database read-only for new sessions, or closed to every connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = sa.engine.make_url(url).database
        self.admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)

    def _sql(self, *statements: str) -> None:
        with self.admin.connect() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)

    def _terminate(self) -> str:
        return (f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{self.name}' "
                "AND pid <> pg_backend_pid()")

    def refuse_writes(self) -> None:
        self._sql(f'ALTER DATABASE "{self.name}" SET default_transaction_read_only = on', self._terminate())

    def refuse_connections(self) -> None:
        self._sql(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false', self._terminate())

    def restore(self) -> None:
        self._sql(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true',
                  f'ALTER DATABASE "{self.name}" RESET default_transaction_read_only', self._terminate())
        self.admin.dispose()


class MariaDbOutage(Outage):
    """The service connects with its own account; its connections are killed, and the account loses its
    write privileges, or is locked."""

    def __init__(self, url: str) -> None:
        admin_url = sa.engine.make_url(url)
        self.name = admin_url.database
        self.user = f"ho_{uuid.uuid4().hex[:10]}"
        self.admin = sa.create_engine(MARIADB_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        self._sql(f"CREATE USER '{self.user}'@'%%' IDENTIFIED BY 'pw'",
                  f"GRANT ALL PRIVILEGES ON `{self.name}`.* TO '{self.user}'@'%%'")
        self.url = admin_url.set(username=self.user, password="pw").render_as_string(hide_password=False)

    def _sql(self, *statements: str) -> None:
        with self.admin.connect() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)

    def _kill(self) -> None:
        with self.admin.connect() as conn:
            ids = conn.exec_driver_sql(
                f"SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{self.user}'").scalars().all()
            for pid in ids:
                conn.exec_driver_sql(f"KILL CONNECTION {int(pid)}")

    def refuse_writes(self) -> None:
        self._sql(f"REVOKE INSERT, UPDATE, DELETE ON `{self.name}`.* FROM '{self.user}'@'%%'")
        self._kill()

    def refuse_connections(self) -> None:
        self._sql(f"ALTER USER '{self.user}'@'%%' ACCOUNT LOCK")
        self._kill()

    def restore(self) -> None:
        self._sql(f"GRANT ALL PRIVILEGES ON `{self.name}`.* TO '{self.user}'@'%%'",
                  f"ALTER USER '{self.user}'@'%%' ACCOUNT UNLOCK")
        self._kill()

    def drop(self) -> None:
        self._sql(f"DROP USER IF EXISTS '{self.user}'@'%%'")
        self.admin.dispose()


@contextmanager
def outage_for(backend: str, backend_url: str) -> Iterator[Outage]:
    """The backend's outage control, restored (and its account dropped) whatever happens."""
    outage: Outage
    if backend == "sqlite":
        outage = SqliteOutage(Path(backend_url))
    elif backend == "postgresql":
        outage = PostgresOutage(backend_url)
    else:
        outage = MariaDbOutage(backend_url)
    try:
        yield outage
    finally:
        outage.restore()
        if isinstance(outage, MariaDbOutage):
            outage.drop()


def json_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The response is the documented error shape with this status and code."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.text
    doc: dict[str, Any] = response.json()
    assert doc["error"] == code and doc["detail"], doc
    return doc


def test_an_outage_is_a_json_503_and_health_checks_writes(backend: str, backend_url: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused writes: /health is 503 naming the write, a new Run is a JSON 503 with Retry-After and is not
    created, reads still answer. Refused connections: every call is a JSON 503. Afterwards all works."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    with outage_for(backend, backend_url) as outage:
        rt = build_runtime(Settings(db=outage.url, data_dir=tmp_path / "data"))
        settings = ServiceSettings(housekeeping_interval_s=0.2, poll_interval_s=0.1, stream_lifetime_s=5.0,
                                   session_secret="test-secret-test-secret")
        try:
            with TestClient(create_app(rt, settings), raise_server_exceptions=False) as client:
                alice = key("alice")
                before = client.post("/api/v1/runs", json={"task": ORDER_STATUS}, headers=alice,
                                     params={"wait": "true"}).json()
                assert before["state"] == "SUCCEEDED"
                assert client.get("/health", headers=alice).json()["database"] == "ok"

                outage.refuse_writes()
                health = client.get("/health", headers=alice)
                assert health.status_code == 503 and health.headers["retry-after"]
                assert health.json()["database"].startswith("error: cannot write")
                assert health.json()["status"] == "degraded"
                refused = client.post("/api/v1/runs", json={"task": ORDER_STATUS}, headers=alice)
                json_error(refused, 503, "database_unavailable")
                assert int(refused.headers["retry-after"]) > 0
                assert client.get(f"/api/v1/runs/{before['run_id']}", headers=alice).status_code == 200

                if outage.can_refuse_connections:
                    with client.stream("GET", "/api/v1/events", headers=alice) as stream:
                        assert stream.status_code == 200
                        outage.refuse_connections()  # mid-stream: the stream ends with an error event
                        frames = "".join(stream.iter_text())
                    assert "event: error" in frames and '"database_unavailable"' in frames, frames
                    json_error(client.post("/api/v1/runs", json={"task": ORDER_STATUS}, headers=alice), 503,
                               "database_unavailable")
                    json_error(client.get(f"/api/v1/runs/{before['run_id']}", headers=alice), 503,
                               "database_unavailable")
                    json_error(client.get(f"/api/v1/runs/{before['run_id']}/events", headers=alice), 503,
                               "database_unavailable")
                    json_error(client.get("/api/v1/runs", headers=alice), 503, "database_unavailable")
                    health = client.get("/health", headers=alice)
                    assert health.status_code == 503 and health.json()["database"].startswith("error: cannot read")

                outage.restore()
                after = client.post("/api/v1/runs", json={"task": ORDER_STATUS}, headers=alice,
                                    params={"wait": "true"})
                assert after.status_code == 202 and after.json()["state"] == "SUCCEEDED", after.text
                assert client.get("/health", headers=alice).status_code == 200
            with rt.store.engine.connect() as conn:
                runs = conn.execute(sa.select(t.runs.c.run_id)).scalars().all()
            assert sorted(runs) == sorted([before["run_id"], after.json()["run_id"]])
        finally:
            rt.close()


def test_a_sqlite_connection_opened_during_an_outage_is_replaced_once_the_file_is_writable(tmp_path: Path) -> None:
    """SQLite opens a file it cannot write read-only, and such a connection stays read-only. Connections
    the pool opened during the outage are replaced at checkout once the file can be written again, so
    writes do not keep failing with "attempt to write a readonly database" after the outage is over."""
    from harness.adapters.sql.database import create_engine, resolve_url

    path = tmp_path / "h.db"
    engine = create_engine(resolve_url(str(path)))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE notes (n INTEGER)"))
        outage = SqliteOutage(path)
        outage.refuse_writes()
        try:
            opened = [engine.connect() for _ in range(4)]  # pooled during the outage: read-only
            for conn in opened:
                assert conn.execute(sa.text("SELECT count(*) FROM notes")).scalar_one() == 0
            for conn in opened:
                conn.close()
        finally:
            outage.restore()
        for n in range(8):  # every pooled connection has its turn
            with engine.begin() as conn:
                conn.execute(sa.text("INSERT INTO notes VALUES (:n)"), {"n": n})
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM notes")).scalar_one() == 8
    finally:
        engine.dispose()
