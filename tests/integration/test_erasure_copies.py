"""An erasure request leaves none of the person's words anywhere, on SQLite, PostgreSQL and MariaDB: Runs
whose task, history, metadata, tool output and approver's reason carry a marker, one of them archived and
pruned, are erased; then no table, no file of the test (the SQLite database and its WAL, every segment,
an export made afterwards) holds the marker, another person's data is untouched, and the chain, the
checkpoints, the rewritten segment and the exports still verify."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.retention import RetentionStore
from harness.audit import standalone
from harness.audit.checkpoint import publish_checkpoint
from harness.audit.checkpoint_files import current_key
from harness.audit.export import export_run
from harness.audit.reconcile import reconcile
from harness.audit.segment import verify_segment
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity
from harness.retention.archiver import Archiver
from harness.retention.policy import DAY_S, RetentionPolicy
from harness.retention.storage import LocalSegmentStore
from harness.settings import Settings
from harness.wiring.retention import erase_user

from ..conftest import FIXTURES
from .webhook_setup import write_config

#: lower case, as a full-text index keeps its words
MARK = "qzmarkerxv7731"
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


def make_runtime(db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Runtime:
    """The test skills, rules, policy and identities over `db`, on a fake clock; t1's Runs push their
    results to a callback (the deliveries wait in the webhook outbox: no delivery process runs)."""
    settings = Settings(db=db, skills_dirs=(FIXTURES / "skills",), policy_file=FIXTURES / "policy.yaml",
                        llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                        data_dir=tmp_path / "data", webhooks_file=write_config(tmp_path, monkeypatch))
    return build_runtime(settings, clock=FakeClock())


@pytest.fixture
def runtime(backend_url: str, tmp_path: Path, call_log: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    """The runtime over the backend under test."""
    rt = make_runtime(backend_url, tmp_path, monkeypatch)
    yield rt
    rt.close()


def request(task: str, n: int) -> dict[str, object]:
    """A request of tess's with the marker in its history and metadata, whose result is pushed back."""
    return {"task": task, **TESS, "callback": "http://127.0.0.1:9/cb",
            "history": [{"role": "user", "content": f"earlier, {MARK} said {n}"}],
            "metadata": {"note": f"{MARK}-{n}"}}


def in_tables(engine: sa.Engine, needle: str) -> dict[str, int]:
    """Occurrences of `needle` per table, in every column of every row of every table."""
    found: dict[str, int] = {}
    with engine.connect() as conn:
        for name in sa.inspect(conn).get_table_names():
            table = sa.Table(name, sa.MetaData(), autoload_with=conn)
            n = 0
            for row in conn.execute(sa.select(table)):
                for value in row:
                    text = bytes(value).decode("latin-1") if isinstance(value, (bytes, memoryview)) else str(value)
                    n += text.count(needle)
            if n:
                found[name] = n
    return found


def in_files(folder: Path, needle: bytes) -> dict[str, int]:
    """Occurrences of `needle` per file under `folder` (gzip files decompressed)."""
    found: dict[str, int] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        if data.count(needle):
            found[str(path.relative_to(folder))] = data.count(needle)
    return found


def test_an_erasure_leaves_none_of_the_persons_words_anywhere(runtime: Runtime, backend: str,
                                                                tmp_path: Path) -> None:
    """Every copy of the marker (rows, stored contents, memory, segments, free pages, WAL, exports) is gone
    after `erase`, another person's Run keeps its contents, and verify, reconcile and the segment pass."""
    erase_and_search(runtime, tmp_path, vacuum=True, sqlite=backend == "sqlite")


def test_without_vacuum_sqlite_still_overwrites_what_it_erased(tmp_path: Path, call_log: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With --no-vacuum the file keeps its free pages, but secure_delete zeroed what the erasure deleted or
    replaced and the WAL was truncated: the marker is in neither."""
    rt = make_runtime(str(tmp_path / "harness.db"), tmp_path, monkeypatch)
    try:
        erase_and_search(rt, tmp_path, vacuum=False, sqlite=True)
    finally:
        rt.close()


def erase_and_search(rt: Runtime, tmp_path: Path, *, vacuum: bool, sqlite: bool) -> None:
    """The scenario: Runs of tess's carrying the marker (one archived and pruned), one of bob's; erase
    tess; search everything."""
    store = rt.store
    clock = store.clock
    assert isinstance(clock, FakeClock)
    cpdir, archive = tmp_path / "checkpoints", tmp_path / "archive"
    old = rt.runs.create_run(request(f"echo old {MARK}", 1))
    assert old.state == "SUCCEEDED", old.error
    publish_checkpoint(SqlAuditReads(store), cpdir)
    clock.advance(40 * DAY_S)
    archived = Archiver(RetentionStore(store), LocalSegmentStore(archive), cpdir,
                        policy=RetentionPolicy(days=30)).run()
    assert archived.pruned_runs == 1, archived
    echoed = rt.runs.create_run(request(f"echo {MARK} here", 2))
    assert echoed.state == "SUCCEEDED" and MARK in json.dumps(echoed.model_dump(mode="json")), echoed.error
    parked = rt.runs.create_run(request("update T-7", 3))
    verdict, approved = rt.runs.decide(parked.approval_request_id or "", CallerIdentity(
        tenant_id="t1", user_id="tess", roles=("tester",)), "approve", reason=f"fine by me, {MARK}")
    assert verdict.accepted and approved.state == "SUCCEEDED", approved.error
    other = rt.runs.create_run({"task": "echo bob's own words", "tenant_id": "t1", "user_id": "bob",
                                "roles": ["tester"]})
    assert other.state == "SUCCEEDED", other.error
    with store.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO memory_entries (entry_id, tenant_id, scope, user_id, kind, content, "
                             "content_hash, created_at) VALUES ('m1', 't1', 'user', 'tess', 'fact', :c, :h, 0)"),
                     {"c": f"tess once wrote {MARK}", "h": "a" * 64})
    store.drain_all()
    before = in_tables(store.engine, MARK)
    assert before.get("blobs") and before.get("webhook_deliveries"), before

    report = erase_user(store, "t1", "tess", segments=LocalSegmentStore(archive), vacuum=vacuum,
                        vacuum_full=not sqlite)
    assert report.runs == 2 and report.archived_runs == 1 and report.memory_entries >= 1 and report.blobs > 0
    if sqlite:
        assert report.space == (["VACUUM"] if vacuum else []) + ["wal_checkpoint(TRUNCATE)"], report.space
    else:  # --vacuum-full: VACUUM FULL (PostgreSQL) or OPTIMIZE TABLE (MariaDB) of the tables it touched
        assert len(report.space) == 1 and report.space[0].split(" of ")[0] in ("VACUUM FULL", "OPTIMIZE TABLE")

    cp = publish_checkpoint(SqlAuditReads(store), cpdir)
    exports = tmp_path / "exports"
    exports.mkdir()
    key = current_key(cpdir)
    assert key is not None
    for run_id in (echoed.run_id, parked.run_id):
        exported = export_run(SqlAuditReads(store), run_id, cp)
        (exports / f"{run_id}.json").write_text(json.dumps(exported))
        proven = standalone.verify_export(exported, cp.doc, key)
        assert proven.ok and any("redacted on an erasure request" in n for n in proven.notes), proven.failures
    assert in_tables(store.engine, MARK) == {}
    # calls.jsonl is the test skill's own log of its calls: what a tool did outside harness is not harness's
    assert in_files(tmp_path, MARK.encode()).keys() <= {"calls.jsonl"}
    assert store.get_run(other.run_id).user_id == "bob"
    assert in_tables(store.engine, "bob's own words").get("blobs")
    checked = verify_chain(SqlAuditReads(store), cpdir)
    assert checked.ok, checked.problems[:3]
    assert reconcile(SqlReconcileReads(store)).ok
    segment = sorted(archive.iterdir())
    assert len(segment) == 1 and verify_segment(segment[0].read_bytes(), [key], run_id=old.run_id).ok
