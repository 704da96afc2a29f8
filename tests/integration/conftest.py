"""Real database servers for the integration tests: a fresh database per test on SQLite, PostgreSQL and
MariaDB (SPEC D2, D3), and the loopback Redis.

Each server gets one migrated template database per test session; every test then gets its own clone,
dropped afterwards. Only databases this module created (prefix `harness_t`) are ever dropped. A service
that is not running is started; a test skips, with the reason, only when the service cannot be had —
or fails instead when HARNESS_REQUIRE_SERVICES=1 (CI, where a silent skip would hide a broken backend).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.sql.database import create_engine
from harness.adapters.sql.migration import migrate
from tests.sqlite_template import migrated_sqlite

BACKENDS = ("sqlite", "postgresql", "mariadb")
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
MARIADB_ADMIN = "mysql+pymysql://root@127.0.0.1:3306/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
_START_TIMEOUT_S = 30.0


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_port(port: int, up: bool = True, timeout_s: float = _START_TIMEOUT_S) -> bool:
    """Wait until the port is (or, with up=False, is no longer) accepting connections."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_open(port) == up:
            return True
        time.sleep(0.1)
    return False


def _start_postgres() -> None:
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if versions and shutil.which("pg_ctlcluster"):
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"],
                       capture_output=True, timeout=60, check=False)


def _start_mariadb() -> None:
    if os.path.exists("/usr/sbin/mariadbd") and shutil.which("start-stop-daemon"):
        subprocess.run(["start-stop-daemon", "--start", "--oknodo", "--background",
                        "--exec", "/usr/sbin/mariadbd"], capture_output=True, timeout=60, check=False)


def _start_redis() -> None:
    if shutil.which("redis-server"):
        subprocess.run(["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379",
                        "--save", "", "--appendonly", "no"], capture_output=True, timeout=60, check=False)


_SERVICES: dict[str, tuple[int, str, Callable[[], None]]] = {
    "postgresql": (5432, "psycopg", _start_postgres),
    "mariadb": (3306, "pymysql", _start_mariadb),
    "redis": (6379, "redis", _start_redis),
}
_availability: dict[str, str | None] = {}


def service_problem(name: str) -> str | None:
    """None when the service is up (started here if it was not) and its driver installed, else why not."""
    if name not in _availability:
        port, driver, start = _SERVICES[name]
        if importlib.util.find_spec(driver) is None:
            _availability[name] = f"the {driver} driver is not installed (pip install -e '.[scale]')"
        elif not port_open(port):
            start()
            _availability[name] = None if wait_for_port(port) else f"{name} is not running on port {port} " \
                "and could not be started"
        else:
            _availability[name] = None
    return _availability[name]


def require_service(name: str) -> None:
    """Skip (or, under HARNESS_REQUIRE_SERVICES=1, fail) the test when the service cannot be had."""
    problem = service_problem(name)
    if problem is None:
        return
    if os.environ.get("HARNESS_REQUIRE_SERVICES") == "1":
        pytest.fail(problem)
    pytest.skip(problem)


def _new_name(kind: str) -> str:
    """harness_<kind>_<pid of this test process>_<random>: the pid tells whose database it is."""
    return f"harness_{kind}_{os.getpid()}_{uuid.uuid4().hex[:10]}"


def _orphaned(names: list[str]) -> list[str]:
    """This module's databases whose test process is gone (killed before it could drop them)."""
    found = []
    for name in names:
        parts = name.split("_")
        if len(parts) != 4 or parts[1] not in ("t", "tmpl") or not parts[2].isdigit():
            continue
        try:
            os.kill(int(parts[2]), 0)
        except ProcessLookupError:
            found.append(name)
        except PermissionError:
            pass
    return found


class PostgresServer:
    """Creates, clones and drops this session's databases on the loopback PostgreSQL."""

    def __init__(self) -> None:
        self.admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with self.admin.connect() as conn:
            names = conn.exec_driver_sql("SELECT datname FROM pg_database WHERE datname LIKE 'harness%%'")
            for name in _orphaned(list(names.scalars())):
                self.drop(name)
        self.template = self.create(migrated=True, kind="tmpl")

    @staticmethod
    def url(name: str) -> str:
        """The SQLAlchemy URL of one of this server's databases."""
        return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"

    def create(self, *, migrated: bool = False, kind: str = "t") -> str:
        """A new empty (or migrated) database; returns its name."""
        name = _new_name(kind)
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        if migrated:
            engine = create_engine(self.url(name))
            migrate(engine)
            engine.dispose()
        return name

    def clone(self) -> str:
        """A new database holding the migrated template's schema and rows."""
        name = _new_name("t")
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return name

    def drop(self, name: str) -> None:
        """Drop one of this session's databases, ending any connection a test left open."""
        assert name.startswith("harness_"), name
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        """Drop the template and release the admin connection."""
        self.drop(self.template)
        self.admin.dispose()


class MariaDbServer:
    """Creates, clones and drops this session's databases on the loopback MariaDB.

    MariaDB has no template databases and runs the migrations slowly (every DDL statement syncs), so a
    clone replays the template's own SHOW CREATE TABLE / TRIGGER output and copies its rows.
    """

    def __init__(self) -> None:
        self.admin = sa.create_engine(MARIADB_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with self.admin.connect() as conn:
            for name in _orphaned(list(conn.exec_driver_sql("SHOW DATABASES LIKE 'harness%%'").scalars())):
                self.drop(name)
        self.template = self.create(migrated=True, kind="tmpl")

    @staticmethod
    def url(name: str) -> str:
        """The SQLAlchemy URL of one of this server's databases."""
        return f"mysql+pymysql://root@127.0.0.1:3306/{name}"

    def create(self, *, migrated: bool = False, kind: str = "t") -> str:
        """A new empty (or migrated) database with the server's default character set; returns its name."""
        name = _new_name(kind)
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}`")
        if migrated:
            engine = create_engine(self.url(name))
            migrate(engine)
            engine.dispose()
        return name

    def clone(self) -> str:
        """A new database holding the migrated template's tables, triggers and rows."""
        name, src = _new_name("t"), self.template
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}`")
            conn.exec_driver_sql(f"USE `{name}`")
            conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 0")
            tables = conn.exec_driver_sql(f"SHOW FULL TABLES FROM `{src}` WHERE Table_type = 'BASE TABLE'")
            for (table, _kind) in tables.all():
                conn.exec_driver_sql(conn.exec_driver_sql(f"SHOW CREATE TABLE `{src}`.`{table}`").one()[1])
                conn.exec_driver_sql(f"INSERT INTO `{table}` SELECT * FROM `{src}`.`{table}`")
            triggers = conn.exec_driver_sql(f"SELECT TRIGGER_NAME FROM information_schema.TRIGGERS "
                                            f"WHERE TRIGGER_SCHEMA = '{src}'")
            for (trigger,) in triggers.all():
                ddl = conn.exec_driver_sql(f"SHOW CREATE TRIGGER `{src}`.`{trigger}`").one()[2]
                conn.exec_driver_sql(ddl)
            conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 1")
        return name

    def drop(self, name: str) -> None:
        """Drop one of this session's databases."""
        assert name.startswith("harness_"), name
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")

    def close(self) -> None:
        """Drop the template and release the admin connection."""
        self.drop(self.template)
        self.admin.dispose()


class Servers:
    """The session's database servers, each set up on first use.

    A background thread keeps one spare clone ready per server and drops used databases, so the
    seconds of DDL a clone costs overlap the test before it instead of adding to it.
    """

    def __init__(self) -> None:
        self._servers: dict[str, PostgresServer | MariaDbServer] = {}
        self._spares: dict[str, Future[str]] = {}
        self._workers: dict[str, ThreadPoolExecutor] = {}

    def get(self, backend: str) -> PostgresServer | MariaDbServer:
        """The server for `backend`, skipping the test when it cannot be had."""
        require_service(backend)
        if backend not in self._servers:
            self._servers[backend] = PostgresServer() if backend == "postgresql" else MariaDbServer()
            self._workers[backend] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{backend}-clones")
        return self._servers[backend]

    def take_clone(self, backend: str) -> tuple[PostgresServer | MariaDbServer, str]:
        """A fresh migrated database of `backend` (the spare), and start making the next spare."""
        server = self.get(backend)
        worker = self._workers[backend]
        spare = self._spares.get(backend) or worker.submit(server.clone)
        name = spare.result()
        self._spares[backend] = worker.submit(server.clone)
        return server, name

    def drop_later(self, backend: str, name: str) -> None:
        """Drop a used database in the background."""
        self._workers[backend].submit(self._servers[backend].drop, name)

    def close(self) -> None:
        """Drop the spares, every used database and every template."""
        for backend, spare in self._spares.items():
            self._servers[backend].drop(spare.result())
        for worker in self._workers.values():
            worker.shutdown(wait=True)
        for server in self._servers.values():
            server.close()


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    """The loopback PostgreSQL and MariaDB, with this session's template databases."""
    s = Servers()
    yield s
    s.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that takes `backend` (or a fixture built on it) once per backend: all three, or
    those its module names in BACKENDS (a module re-collecting another's tests picks other backends)."""
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", getattr(metafunc.module, "BACKENDS", BACKENDS))


@pytest.fixture
def backend_url(backend: str, servers: Servers, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated database of the backend under test, dropped after the test.

    For SQLite it is a file path, exactly as the SQLite-only tests always passed it: a copy of the test
    process's migrated template (tests/sqlite_template.py), as the servers' databases are clones of theirs.
    """
    if backend == "sqlite":
        yield migrated_sqlite(tmp_path / "harness.db")
        return
    server, name = servers.take_clone(backend)
    try:
        yield server.url(name)
    finally:
        servers.drop_later(backend, name)


@pytest.fixture
def empty_backend_url(backend: str, servers: Servers, tmp_path: Path) -> Iterator[str]:
    """A fresh database of the backend under test with no tables at all (for migration tests)."""
    if backend == "sqlite":
        yield str(tmp_path / "empty.db")
        return
    server = servers.get(backend)
    name = server.create()
    try:
        yield server.url(name)
    finally:
        server.drop(name)


@pytest.fixture
def redis_url() -> str:
    """The shared loopback Redis (started if needed); tests isolate themselves by key names."""
    require_service("redis")
    return REDIS_URL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """An S3-compatible server (moto_server) on 127.0.0.1 with the bucket `runs-archive`, and credentials it
    accepts (it checks none), stopped afterwards; the test skips where boto3 is not installed."""
    boto3 = pytest.importorskip("boto3")
    port = _free_port()
    server = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    try:
        assert wait_for_port(port, timeout_s=30), "moto_server did not start"
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="runs-archive")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
