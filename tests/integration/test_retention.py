"""Archive and prune on SQLite, PostgreSQL and MariaDB: the chain still verifies after a prune, still
catches tampering in what remains, and the append-only guards open only for the audited prune."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.erasure import USER_ERASED
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.retention import RUNS_PRUNED, RetentionStore
from harness.adapters.sql.store import SqlStore
from harness.audit import standalone
from harness.audit.checkpoint import publish_checkpoint
from harness.audit.checkpoint_files import current_key, latest_checkpoint
from harness.audit.export import export_run
from harness.audit.reconcile import reconcile
from harness.audit.segment import verify_segment
from harness.audit.verify import verify_chain
from harness.clock import FakeClock
from harness.domain.errors import UnknownRunError
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState
from harness.retention.archiver import Archiver
from harness.retention.policy import DAY_S, RetentionPolicy
from harness.retention.readback import read_back
from harness.retention.storage import LocalSegmentStore
from harness.wiring.retention import erase_user
from tests.integration.bulk_runs import clone, drive

S = RunState
PARKED = (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL)
N = 60
#: archive then prune this many Runs in one pass on every backend: the issue's 10,000 with
#: HARNESS_TEST_ARCHIVE_RUNS=10000 (about 2 to 4 minutes per backend on the loaded 2-core development
#: machine, over the suite's budget); by default 1,050, which still crosses the read chunks (1,000 Runs)
#: and the prune batches (500) that the 60-Run tests never reach
BIG = int(os.environ.get("HARNESS_TEST_ARCHIVE_RUNS", "1050"))


class World:
    """A database with `n` old final Runs (cloned), an old parked Run, and a Run of today."""

    def __init__(self, url: str, tmp: Path, n: int = 6) -> None:
        self.clock = FakeClock()
        self.store = SqlStore.open(url, self.clock)
        self.machine = StateMachine(self.store)
        self.cpdir, self.archive_dir = tmp / "checkpoints", tmp / "archive"
        self.old = clone(self.store, drive(self.machine), n - 1)
        self.old.insert(0, self.store.list_runs(limit=1000)[-1].run_id)
        self.parked = drive(self.machine, PARKED)
        publish_checkpoint(SqlAuditReads(self.store), self.cpdir)
        self.clock.advance(40 * DAY_S)
        self.today = drive(self.machine)
        self.archiver = Archiver(RetentionStore(self.store), LocalSegmentStore(self.archive_dir), self.cpdir,
                                 policy=RetentionPolicy(days=30))


@pytest.fixture
def world(backend_url: str, tmp_path: Path) -> World:
    """A fresh database of the backend under test, populated with a dozen old Runs."""
    return World(backend_url, tmp_path)


@pytest.fixture
def big_world(backend_url: str, tmp_path: Path) -> World:
    """The same with N old Runs."""
    return World(backend_url, tmp_path, N)


def test_archive_then_prune_keeps_the_chain_verifiable(big_world: World) -> None:
    """After the old final Runs are archived and pruned, the chain verifies (checkpoints included), the
    parked and recent Runs stay, and a new checkpoint and a live Run's export still prove."""
    world = big_world
    store = world.store
    assert verify_chain(SqlAuditReads(store), world.cpdir).ok
    size_before = store.chain_head()[0]
    report = world.archiver.run()
    assert report.runs == report.pruned_runs == N and report.kept == []
    assert report.records == report.pruned_records > N * 5
    after = verify_chain(SqlAuditReads(store), world.cpdir)
    assert after.ok, after.problems[:3]
    assert after.records_pruned == report.records and after.records_checked >= size_before
    assert after.checkpoints_checked >= 2
    for run_id in world.old[:3]:
        with pytest.raises(UnknownRunError):
            store.get_run(run_id)
        assert RetentionStore(store).archived(run_id) is not None
    assert store.get_run(world.parked).state is S.AWAITING_HITL
    assert store.get_run(world.today).state is S.SUCCEEDED
    assert [e.event for e in store.audit_events(event=RUNS_PRUNED)]
    live = drive(world.machine)
    cp = publish_checkpoint(SqlAuditReads(store), world.cpdir)
    assert verify_chain(SqlAuditReads(store), world.cpdir).ok
    key = current_key(world.cpdir)
    assert key is not None
    checked = standalone.verify_export(export_run(SqlAuditReads(store), live, cp), cp.doc, key)
    assert checked.ok and checked.complete, checked.failures
    segment = (world.archive_dir / Path(report.location or "").name).read_bytes()
    assert verify_segment(segment, [key], run_id=world.old[-1]).ok


def test_archive_then_prune_of_bulk_runs_verifies_before_and_after(backend_url: str, tmp_path: Path) -> None:
    """BIG old final Runs (bulk-seeded; 10,000 and 100,000 records with HARNESS_TEST_ARCHIVE_RUNS=10000) go
    in one pass into one segment and out of the database: the chain verifies before and after (every
    pruned record counted), and the parked and recent Runs stay. (The pass itself checks the segment as
    an auditor would, with the key alone, before it stores it or prunes anything.)"""
    world = World(backend_url, tmp_path, BIG)
    store = world.store
    per_run = len(store.trace_of(world.old[1]))
    before = verify_chain(SqlAuditReads(store), world.cpdir)
    assert before.ok, before.problems[:3]
    report = world.archiver.run()
    assert report.runs == report.pruned_runs == BIG and report.kept == []
    assert report.records == report.pruned_records == BIG * per_run
    after = verify_chain(SqlAuditReads(store), world.cpdir)
    assert after.ok, after.problems[:3]
    assert after.records_pruned == report.records and after.records_checked > before.records_checked
    assert store.get_run(world.parked).state is S.AWAITING_HITL and store.get_run(world.today).state is S.SUCCEEDED
    retention = RetentionStore(store)
    for run_id in (world.old[0], world.old[BIG // 2], world.old[-1]):
        with pytest.raises(UnknownRunError):
            store.get_run(run_id)
        assert retention.archived(run_id) is not None


def test_a_second_pass_archives_nothing_new_and_the_parked_run_never(world: World) -> None:
    """A Run parked for approval is never archived, however old; a second pass finds nothing due."""
    world.archiver.run()
    world.clock.advance(400 * DAY_S)
    report = world.archiver.run()
    assert report.runs == 1  # the Run of "today", now old too; not the parked one
    assert world.store.get_run(world.parked).state is S.AWAITING_HITL
    assert world.archiver.run().runs == 0
    assert verify_chain(SqlAuditReads(world.store), world.cpdir).ok


def test_tampering_in_what_remains_is_caught_after_a_prune(world: World) -> None:
    """After a prune, an edited row of a remaining Run and records deleted through a forged grant (no
    tombstones) are both named by verify."""
    world.archiver.run()
    store = world.store
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET state = 'FAILED' WHERE run_id = :r"), {"r": world.today})
    report = verify_chain(SqlAuditReads(store), world.cpdir)
    assert not report.ok and any(p.run_id == world.today for p in report.problems)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET state = 'SUCCEEDED' WHERE run_id = :r"), {"r": world.today})
        conn.execute(sa.text("INSERT INTO prune_grants (run_id, segment_id) VALUES (:r, 'forged')"),
                     {"r": world.today})
        conn.execute(sa.text("DELETE FROM trace_records WHERE run_id = :r"), {"r": world.today})
        conn.execute(sa.text("DELETE FROM prune_grants"))
    report = verify_chain(SqlAuditReads(store), world.cpdir)
    assert not report.ok and report.first_bad is not None and report.first_bad.kind == "deleted"


def test_the_append_only_guards_open_only_for_granted_runs(world: World) -> None:
    """Without a grant a DELETE is refused on every append-only table; UPDATE is refused even with one;
    tombstones can be neither changed nor deleted."""
    world.archiver.run()
    store, run_id = world.store, world.today
    for table in ("trace_records", "transitions", "audit_events"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), store.engine.begin() as conn:
            conn.execute(sa.text(f"DELETE FROM {table} WHERE run_id = :r"), {"r": run_id})
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), store.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO prune_grants (run_id, segment_id) VALUES (:r, 'x')"), {"r": run_id})
        conn.execute(sa.text("UPDATE trace_records SET kind = kind WHERE run_id = :r"), {"r": run_id})
    for sql in ("DELETE FROM pruned_records", "UPDATE pruned_records SET seq = seq"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), store.engine.begin() as conn:
            conn.execute(sa.text(sql))
    assert verify_chain(SqlAuditReads(store), world.cpdir).ok
    assert latest_checkpoint(world.cpdir) is not None


def test_an_erasure_is_honoured_with_the_chain_still_verifying(world: World) -> None:
    """Erasing a person redacts their live and archived Runs (records replaced by a salted hash, ids by a
    pseudonym), deletes their memory, leaves others' data alone, is audited under the pseudonym, and the
    chain, the checkpoints, reconcile and the rewritten segment all still verify."""
    store = world.store
    world.archiver.run()
    bob = drive(world.machine, user="bob")
    now = store.clock.now()
    with store.engine.begin() as conn:
        for user, text in (("ana", "ana likes tea"), ("bob", "bob likes coffee")):
            conn.execute(sa.text("INSERT INTO memory_entries (entry_id, tenant_id, scope, user_id, kind, content, "
                                 "content_hash, created_at) VALUES (:e, 'acme', 'user', :u, 'fact', :c, :h, :t)"),
                         {"e": f"m-{user}", "u": user, "c": text, "h": user * 8, "t": now})
    report = erase_user(store, "acme", "ana", segments=LocalSegmentStore(world.archive_dir))
    assert report.runs == 1 and report.archived_runs == len(world.old) and report.memory_entries == 1
    assert report.still_running == [world.parked] and len(report.segments_rewritten) == 1
    checked = verify_chain(SqlAuditReads(store), world.cpdir)
    assert checked.ok, checked.problems[:3]
    assert checked.records_redacted == report.records > 5
    assert reconcile(SqlReconcileReads(store)).ok
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT user_id FROM runs WHERE run_id = :r"), {"r": world.today}).scalar_one() \
            == report.subject
        payloads = conn.execute(sa.text("SELECT payload FROM trace_records WHERE run_id = :r"),
                                {"r": world.today}).scalars().all()
        assert payloads and not any("ana" in p for p in payloads)
        details = conn.execute(sa.text("SELECT detail FROM audit_events WHERE run_id = :r"),
                               {"r": world.today}).scalars().all()
        assert details and not any('"ana"' in d for d in details)
        memory = conn.execute(sa.text("SELECT user_id FROM memory_entries")).scalars().all()
        assert memory == ["bob"]
    assert store.get_run(bob).user_id == "bob"
    events = store.audit_events(event=USER_ERASED)
    assert [e.detail["subject"] for e in events] == [report.subject] and "ana" not in str(events[0].detail)
    files = sorted(world.archive_dir.iterdir())
    assert len(files) == 1 and ".erased-" in files[0].name
    data = files[0].read_bytes()
    assert b'"ana"' not in gzip.decompress(data)
    key = current_key(world.cpdir)
    assert key is not None
    proven = verify_segment(data, [key], run_id=world.old[0])
    assert proven.ok, proven.failures[:3]
    assert RetentionStore(store).archived(world.old[0]) is not None


def test_a_run_erased_while_live_is_archived_redacted_when_it_becomes_due(world: World) -> None:
    """A Run erased while still in the database, archived once it ages past the policy: its segment holds
    the redacted records with their original leaf hashes, so the segment, the chain after the prune and a
    read-back all verify, and the person's data is in none of them."""
    store = world.store
    world.archiver.run()
    report = erase_user(store, "acme", "ana", segments=LocalSegmentStore(world.archive_dir))
    assert report.runs == 1 and report.records > 5
    world.clock.advance(40 * DAY_S)
    second = world.archiver.run()
    assert second.runs == 1 and second.pruned_runs == 1 and second.kept == [], second
    checked = verify_chain(SqlAuditReads(store), world.cpdir)
    assert checked.ok, checked.problems[:3]
    assert checked.records_redacted == 0 and checked.records_pruned >= report.records
    assert second.location is not None
    data = LocalSegmentStore(world.archive_dir).get(second.location)
    assert b'"ana"' not in gzip.decompress(data)
    key = current_key(world.cpdir)
    assert key is not None
    proven = verify_segment(data, [key], run_id=world.today)
    assert proven.ok, proven.failures[:3]
    assert any("redacted on an erasure request" in n for n in proven.notes)
    archived = RetentionStore(store).archived(world.today)
    assert archived is not None
    line = read_back(archived, world.cpdir)
    assert line["run"]["user_id"] == report.subject
    assert len(line["records"]) == report.records and all("redacted" in r for r in line["records"])


def test_a_forged_tombstone_is_caught(tmp_path: Path) -> None:
    """Someone who drops the guards and changes a pruned record's leaf hash is caught by the signed roots;
    one who changes the chain hash of the last pruned record before a kept one, by that record's link
    (SQLite: triggers dropped by hand)."""
    world = World(str(tmp_path / "h.db"), tmp_path)
    world.archiver.run()
    store = world.store
    with store.engine.connect() as conn:
        seq = conn.execute(sa.text("SELECT MAX(p.seq) FROM pruned_records p JOIN trace_records r "
                                   "ON r.seq = p.seq + 1")).scalar_one()
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER pruned_records_no_update")
        conn.execute(sa.text("UPDATE pruned_records SET leaf = hash WHERE seq = :s"), {"s": seq})
    report = verify_chain(SqlAuditReads(store), world.cpdir)
    assert not report.ok and any(p.kind.startswith("checkpoint") for p in report.problems), report.problems[:3]
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE pruned_records SET leaf = :l, hash = :h WHERE seq = :s"),
                     {"l": b"\x01" * 32, "h": b"\x02" * 32, "s": seq})
    report = verify_chain(SqlAuditReads(store), world.cpdir)
    assert not report.ok and report.first_bad is not None and report.first_bad.seq == seq, report.problems[:3]
