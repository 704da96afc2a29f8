"""Shared fixtures: a real SQLite store in a temporary folder, and a fake clock."""

from __future__ import annotations

import compileall
import gc
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.drive.state_machine import StateMachine
from harness.settings import Settings
from tests.sqlite_template import migrated_sqlite

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """Compile the code under test once, before the test processes start, where the environment says not to
    write bytecode (PYTHONDONTWRITEBYTECODE): otherwise every process the tests start (`harness serve`, the
    CLI, a spawned worker, a bench child) compiles all of harness again from source, half a second of CPU
    each and hundreds of processes a run. The files go where Python looks for them anyway (__pycache__,
    ignored by git) and are used only while their source is unchanged (its size and time are in them).
    Fixture folders are left as they are: tests copy them, or load them as skills, file by file."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):  # once, in the controlling process
        for folder in (ROOT / "src" / "harness", ROOT / "tests", ROOT / "benchmarks"):
            if folder.is_dir():
                compileall.compile_dir(folder, quiet=2, rx=re.compile(r"[/\\]fixtures[/\\]"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection loaded (every test module and what it imports: most of a worker's objects) is frozen:
    the garbage collector's full collections during the tests then walk only what the tests allocate."""
    gc.freeze()


@pytest.fixture(autouse=True, scope="session")
def _checkpoint_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Checkpoint signing keys go to a folder of the test session, never to the user's own key folder
    (~/.config/harness/keys), and so does the data directory a test names none for (never
    ~/.local/share/harness); child processes, module-wide servers included, inherit both."""
    base = tmp_path_factory.getbasetemp()
    names = {"HARNESS_CHECKPOINT_KEY_DIR": base / "checkpoint-keys", "HARNESS_DATA_DIR": base / "harness-data"}
    before = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(path) for name, path in names.items()})
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def clock() -> FakeClock:
    """A clock that only moves when the test says so."""
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Path of a fresh SQLite database file (created on first open)."""
    return tmp_path / "harness.db"


@pytest.fixture
def store(db_path: Path, clock: FakeClock) -> Iterator[SqlStore]:
    """A migrated store on the fake clock: SQLite, or the database of a module that overrides `db_path` with
    its backend's URL."""
    s = SqlStore.open(migrated_sqlite(db_path) if isinstance(db_path, Path) else db_path, clock)
    yield s
    s.close()


@pytest.fixture
def machine(store: SqlStore) -> StateMachine:
    """The state machine over the test store."""
    return StateMachine(store)


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """File where the test skills log every invocation (a countable side effect)."""
    path = tmp_path / "calls.jsonl"
    path.touch()
    monkeypatch.setenv("HARNESS_TEST_CALL_LOG", str(path))
    return path


@pytest.fixture
def test_runtime(tmp_path: Path, clock: FakeClock, call_log: Path) -> Iterator[Runtime]:
    """A runtime over the test skills, rules, policy and identities (tests/fixtures) on the fake clock."""
    settings = Settings(db=migrated_sqlite(tmp_path / "rt.db"), skills_dirs=(FIXTURES / "skills",),
                        policy_file=FIXTURES / "policy.yaml", llm_rules=FIXTURES / "llm_rules.yaml",
                        identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data")
    rt = build_runtime(settings, clock=clock)
    yield rt
    rt.close()


@pytest.fixture
def support_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    """A runtime over the bundled support example, with its ledger in the test folder."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    settings = Settings(db=migrated_sqlite(tmp_path / "support.db"), data_dir=tmp_path / "data")
    rt = build_runtime(settings)
    yield rt
    rt.close()
