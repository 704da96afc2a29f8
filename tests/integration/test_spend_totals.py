"""Running spend totals (0008) on SQLite, PostgreSQL and MariaDB: the budget check's numbers (SPEC G1)
read from `spend_totals` equal the sums over `costs` it used to compute; a cost and its totals commit
or roll back together; writers in several processes, and whole Runs in several threads, lose no update
and do not deadlock; reconcile names a total that disagrees with the recorded costs; and a replay's
budget check sees the spend seeded before the Run."""

from __future__ import annotations

import multiprocessing as mp
import random
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from harness.adapters.sql import schema as t
from harness.adapters.sql.erasure import ErasureStore
from harness.adapters.sql.ledger import SHARDS, TENANT_TOTAL, CostLedger, shard_of
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.store import SqlStore
from harness.audit.reconcile import Mismatch, reconcile
from harness.cli import app
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import RunResult
from harness.domain.traces import CostTrace
from harness.replay.runner import replay
from harness.settings import Settings

from ..conftest import FIXTURES

#: what spent_by_scope ran before 0008: sums over the tenant's whole cost history
SUMS_BY_SCOPE = sa.text(
    "SELECT COALESCE(SUM(CASE WHEN run_id = :run THEN usd ELSE 0.0 END), 0.0), "
    "COALESCE(SUM(CASE WHEN user_id = :user THEN usd ELSE 0.0 END), 0.0), COALESCE(SUM(usd), 0.0) "
    "FROM costs WHERE tenant_id = :tenant")
#: every user's and tenant's (user_id '') count and sum of recorded costs
SUMS = sa.text(
    "SELECT tenant_id, user_id, COUNT(*), SUM(usd) FROM costs GROUP BY tenant_id, user_id "
    "UNION ALL SELECT tenant_id, '', COUNT(*), SUM(usd) FROM costs GROUP BY tenant_id")
TENANTS, USERS = ("acme", "ACME", "globex"), ("ana", "bo", "cy", "dee")
WRITERS, COSTS_PER_WRITER = 4, 60


def cost(tenant: str, user: str, run: str, usd: float) -> CostTrace:
    """One LLM call's cost."""
    return CostTrace(run_id=run, source="llm:fake:plan", input_tokens=10, output_tokens=5, usd=usd,
                     tenant_id=tenant, user_id=user)


def totals(store: SqlStore) -> dict[tuple[str, str], tuple[int, float]]:
    """(tenant, user) -> (cost count, USD) of every running total, summed over its rows; user '' is the
    tenant's own."""
    s = t.spend_totals
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(s.c.tenant_id, s.c.user_id, sa.func.sum(s.c.cost_count), sa.func.sum(s.c.usd))
                            .group_by(s.c.tenant_id, s.c.user_id))
        return {(r[0], r[1]): (int(r[2]), float(r[3])) for r in rows}


def sums(store: SqlStore) -> dict[tuple[str, str], tuple[int, float]]:
    """The same, summed over the recorded costs."""
    with store.engine.connect() as conn:
        return {(r[0], r[1]): (int(r[2]), float(r[3])) for r in conn.execute(SUMS)}


def assert_totals_match(store: SqlStore, *, exact: bool) -> None:
    """Every total counts its costs exactly and sums them exactly or to float rounding."""
    found, expected = totals(store), sums(store)
    assert found.keys() == expected.keys()
    for key, (count, usd) in expected.items():
        assert found[key][0] == count, key
        assert found[key][1] == (usd if exact else pytest.approx(usd, rel=1e-12, abs=1e-15)), key


def execute(store: SqlStore, statement: str) -> None:
    """Change the database behind the ledger's back."""
    with store.engine.begin() as conn:
        conn.execute(sa.text(statement))


@pytest.fixture
def store(backend_url: str) -> Iterator[SqlStore]:
    """A migrated store of the backend under test."""
    s = SqlStore.open(backend_url, FakeClock())
    yield s
    s.close()


@pytest.fixture
def history(store: SqlStore) -> dict[str, tuple[str, str]]:
    """Three hundred costs of decimal amounts for three tenants (two differing only in case), four users
    each, a few costs per Run; half recorded on their own, half inside a caller's transaction (as the
    planning step records its cost with its state change). Returns run -> (tenant, user)."""
    ledger, rng, runs = CostLedger(store), random.Random(8), {}
    for i in range(300):
        tenant, user = rng.choice(TENANTS), rng.choice(USERS)
        run = f"run-{tenant}-{user}-{i // 7}"
        runs[run] = (tenant, user)
        spent = cost(tenant, user, run, round(rng.uniform(0, 0.02), 6))
        if i % 2:
            ledger.record(spent)
        else:
            with store.engine.begin() as conn:
                ledger.insert(conn, spent)
    return runs


def test_totals_equal_the_sums_and_the_budget_check_reads_what_it_did(
        store: SqlStore, history: dict[str, tuple[str, str]]) -> None:
    """Each user's and tenant's total counts its costs and sums them; spent_by_scope and spent() give
    the numbers the sums over the whole history gave, for every Run, user and tenant."""
    assert_totals_match(store, exact=False)
    assert len(totals(store)) == len(TENANTS) * (len(USERS) + 1)
    ledger = CostLedger(store)
    with store.engine.connect() as conn:
        for run, (tenant, user) in history.items():
            before = conn.execute(SUMS_BY_SCOPE, {"tenant": tenant, "user": user, "run": run}).one()
            now = ledger.spent_by_scope(tenant_id=tenant, user_id=user, run_id=run)
            assert now == pytest.approx(tuple(float(x) for x in before), rel=1e-12, abs=1e-15)
            # the budget check's one read gives the same three numbers, and no unpriced calls here
            spend = ledger.spend(tenant_id=tenant, user_id=user, run_id=run)
            assert (spend.run_usd, spend.user_usd, spend.tenant_usd) == now and spend.unpriced_models == ()
            assert ledger.spent(tenant_id=tenant, run_id=run) == pytest.approx(float(before[0]), rel=1e-12)
            assert ledger.spent(tenant_id=tenant, user_id=user, run_id=run) == pytest.approx(float(before[0]))
            assert ledger.spent(tenant_id=tenant, user_id=user) == pytest.approx(float(before[1]), rel=1e-12)
            assert ledger.spent(tenant_id=tenant) == pytest.approx(float(before[2]), rel=1e-12)
    tenant, user = next(iter(history.values()))
    assert ledger.spent(tenant_id=tenant, user_id=user, run_id="run-of-someone-else") == 0.0
    assert reconcile(SqlReconcileReads(store)).ok


def test_nothing_recorded_reads_zero(store: SqlStore) -> None:
    """A tenant, user or Run with no recorded cost has spent 0 (no total row yet)."""
    ledger = CostLedger(store)
    ledger.record(cost("acme", "ana", "r1", 0.25))
    assert ledger.spent_by_scope(tenant_id="nobody", user_id="ana", run_id="r1") == (0.0, 0.0, 0.0)
    assert ledger.spent_by_scope(tenant_id="acme", user_id="bo", run_id="r2") == (0.0, 0.0, 0.25)
    assert ledger.spent(tenant_id="nobody") == ledger.spent(tenant_id="acme", user_id="bo") == 0.0
    assert ledger.spent_by_scope(tenant_id="acme", user_id="ana", run_id="r1") == (0.25, 0.25, 0.25)
    nothing = ledger.spend(tenant_id="nobody", user_id="ana", run_id="r1")
    assert (nothing.run_usd, nothing.user_usd, nothing.tenant_usd, nothing.unpriced_models) == (0.0, 0.0, 0.0, ())


def test_the_runs_of_a_tenant_add_to_several_rows_of_a_total_and_a_run_always_to_the_same(
        store: SqlStore) -> None:
    """Concurrent Runs of one tenant must not queue on one row lock: each total is spread over rows, a
    Run's costs all go to the row its id picks, and every read (the budget check, `spent`) is their sum.
    With one row per total (shards=1) the same costs give the same numbers."""
    runs = [f"run-{i}" for i in range(40)]
    picked = {run: shard_of(run) for run in runs}
    assert len(set(picked.values())) >= SHARDS // 2  # the ids spread (crc32 of 40 ids over 16 rows)
    ledger = CostLedger(store)
    for i, run in enumerate(runs):
        for _ in range(2):  # two calls of each Run: the same row
            ledger.record(cost("acme", ("ana", "bo")[i % 2], run, 1 / 64))
    s = t.spend_totals
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(s.c.user_id, s.c.shard, s.c.cost_count)
                            .where(s.c.tenant_id == "acme", s.c.user_id == TENANT_TOTAL)).all()
    assert {shard for _, shard, _ in rows} == set(picked.values())
    assert {shard: count for _, shard, count in rows} == {
        shard: 2 * list(picked.values()).count(shard) for shard in set(picked.values())}
    assert ledger.spent_by_scope(tenant_id="acme", user_id="ana", run_id="run-0") == (2 / 64, 40 / 64, 80 / 64)
    assert ledger.spent(tenant_id="acme") == 80 / 64 and ledger.spent(tenant_id="acme", user_id="bo") == 40 / 64
    assert_totals_match(store, exact=True)
    assert spend_mismatches(store) == []
    one_row = CostLedger(store, shards=1)
    one_row.record(cost("acme", "cy", "run-x", 0.5))
    one_row.record(cost("acme", "cy", "run-y", 0.25))
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(s.c.shard, s.c.cost_count).where(s.c.user_id == "cy")).all() == [(0, 2)]
    assert one_row.spent(tenant_id="acme", user_id="cy") == 0.75 and ledger.spent(tenant_id="acme") == 80 / 64 + 0.75
    with pytest.raises(ValueError, match="shards=0"):
        CostLedger(store, shards=0)
    with pytest.raises(ValueError, match=r"1 to 32767 rows .* not shards=32768"):
        CostLedger(store, shards=32_768)  # the shard column is a SMALLINT: refused before any row is written


def test_an_erasure_moves_every_row_of_the_persons_totals_to_their_pseudonym(store: SqlStore) -> None:
    """A person's total spread over several rows is re-keyed whole: no row keeps their id, the pseudonym's
    total counts and sums the same, the tenant's and other users' totals are untouched."""
    ledger = CostLedger(store)
    for i in range(12):
        ledger.record(cost("acme", "ana", f"r{i}", 1 / 64))
    ledger.record(cost("acme", "bo", "rb", 1 / 64))
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).where(t.spend_totals.c.user_id == "ana")).scalar_one() > 1
    ErasureStore(store).erase_live("erase-1", b"salt", "acme", "ana", "subject-1", [])
    assert totals(store) == {("acme", ""): (13, 13 / 64), ("acme", "subject-1"): (12, 12 / 64),
                             ("acme", "bo"): (1, 1 / 64)}
    assert ledger.spent(tenant_id="acme", user_id="ana") == 0.0


def test_a_rolled_back_cost_leaves_the_totals_alone(store: SqlStore) -> None:
    """The totals change in the cost's own transaction: a state change that rolls back takes its cost
    and the totals' increments with it."""
    ledger = CostLedger(store)
    ledger.record(cost("acme", "ana", "r1", 0.5))
    with pytest.raises(RuntimeError), store.engine.begin() as conn:
        ledger.insert(conn, cost("acme", "ana", "r2", 0.25))
        raise RuntimeError("the compare-and-set lost")
    assert totals(store) == {("acme", TENANT_TOTAL): (1, 0.5), ("acme", "ana"): (1, 0.5)}
    assert_totals_match(store, exact=True)


def _writer(url: str, writer: int, start: Any, report: str) -> None:
    """Child process: record COSTS_PER_WRITER costs for one tenant, half for a user every writer shares;
    amounts are multiples of 1/1024, so every order of additions gives the same exact sum."""
    store = SqlStore.open(url, FakeClock(), migrate_schema=False)
    try:
        ledger = CostLedger(store)
        start.wait()
        for i in range(COSTS_PER_WRITER):
            user = "shared" if i % 2 else f"writer-{writer}"
            ledger.record(cost("acme", user, f"run-{writer}-{i // 3}", (writer * COSTS_PER_WRITER + i) / 1024))
    except Exception:
        Path(report).write_text(traceback.format_exc())
        raise
    finally:
        store.close()


def test_concurrent_writers_in_several_processes_lose_no_update(store: SqlStore, backend_url: str,
                                                                tmp_path: Path) -> None:
    """Processes recording costs for the same tenant and user at once all get through (no deadlock, no
    lost update): each total equals the exact sum of its costs and counts every one."""
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(WRITERS)
    reports = [tmp_path / f"writer-{i}.txt" for i in range(WRITERS)]
    workers = [ctx.Process(target=_writer, args=(backend_url, i, start, str(r))) for i, r in enumerate(reports)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(180)
    assert [r.read_text() for r in reports if r.exists()] == []
    assert [w.exitcode for w in workers] == [0] * WRITERS
    n = WRITERS * COSTS_PER_WRITER
    found = totals(store)
    assert found[("acme", TENANT_TOTAL)] == (n, sum(range(n)) / 1024)
    assert found[("acme", "shared")][0] == n // 2
    assert_totals_match(store, exact=True)
    assert reconcile(SqlReconcileReads(store)).ok


def test_concurrent_runs_of_one_tenant_keep_their_totals(backend_url: str, tmp_path: Path, call_log: Path) -> None:
    """Whole Runs of one tenant in four threads, each recording its plan's cost with its state change
    (the Run's row locked, its blobs written) and checking budgets: none deadlocks or fails, and the
    totals match the costs. Twelve Runs a thread: with one RunContext lock for every drive of the process,
    a drive holding SQLite's write lock waited for it while its holder waited for the write lock, and
    within a few dozen Runs one gave up with "database is locked" after the busy timeout."""
    settings = Settings(db=backend_url, skills_dirs=(FIXTURES / "skills",), policy_file=FIXTURES / "policy.yaml",
                        llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                        data_dir=tmp_path / "data")
    rt = build_runtime(settings, clock=FakeClock())
    try:
        def runs(thread: int) -> list[RunResult]:
            return [rt.runs.create_run({"task": "chatty", "tenant_id": "t1", "roles": ["tester"],
                                        "user_id": "tess" if i % 2 else f"user-{thread}"}) for i in range(12)]

        with ThreadPoolExecutor(4) as pool:
            results = [r for done in pool.map(runs, range(4)) for r in done]
        states = [r.state for r in results]
        # the shared user's cap stops some of its Runs before their model call: failed, and saying so
        stopped = [str(r.error) for r in results if r.state == "CLOSED_FAILED"]
        assert all(e.startswith("budget_exceeded: budget.per_user") for e in stopped), stopped
        assert set(states) <= {"SUCCEEDED", "CLOSED_REJECTED", "CLOSED_FAILED"} and "SUCCEEDED" in states
        assert totals(rt.store)[("t1", TENANT_TOTAL)][0] == len(states) - len(stopped)
        assert_totals_match(rt.store, exact=False)
        assert reconcile(SqlReconcileReads(rt.store)).ok
    finally:
        rt.close()


def spend_mismatches(store: SqlStore) -> list[Mismatch]:
    """What reconcile lists under the spend-totals check (it also counts them)."""
    report = reconcile(SqlReconcileReads(store))
    listed = [m for m in report.mismatches if m.check == "spend_totals"]
    assert report.counts["spend_totals"] == len(listed) and report.ok == (not listed)
    return listed


@pytest.mark.parametrize(("tamper", "named"), [
    ("UPDATE spend_totals SET usd = usd + 0.01 WHERE tenant_id = 'acme' AND user_id = '' AND shard = {shard}",
     "tenant 'acme' total: total 0.76"),
    ("UPDATE spend_totals SET cost_count = cost_count + 1 WHERE user_id = 'ana' AND shard = {shard}",
     "tenant 'acme' user 'ana': total 0.5 USD over 3 cost(s), recorded costs sum to 0.5 USD over 2"),
    ("DELETE FROM spend_totals WHERE user_id = 'bo'",
     "tenant 'acme' user 'bo': no total, recorded costs sum to 0.25 USD over 1"),
    ("INSERT INTO spend_totals (tenant_id, user_id, usd, cost_count) VALUES ('acme', 'cy', 0, 0)",
     "tenant 'acme' user 'cy': total 0.0 USD over 0 cost(s), no recorded cost"),
    ("INSERT INTO spend_totals (tenant_id, user_id, usd, cost_count) VALUES ('initech', '', 1, 1)",
     "tenant 'initech' total: total 1.0 USD over 1 cost(s), no recorded cost"),
])
def test_reconcile_names_a_total_that_disagrees_with_the_costs(store: SqlStore, tamper: str, named: str) -> None:
    """A total changed (one of its rows), miscounted, deleted or made up behind the ledger's back is listed
    with its scope (no Run: run_id None) and fails reconcile; the costs, the source of truth, say what it
    should be."""
    ledger = CostLedger(store)
    for user, run, usd in (("ana", "r1", 0.25), ("ana", "r2", 0.25), ("bo", "r3", 0.25)):
        ledger.record(cost("acme", user, run, usd))
    assert spend_mismatches(store) == []
    execute(store, tamper.format(shard=shard_of("r1")))
    [mismatch] = spend_mismatches(store)
    assert mismatch.run_id is None and mismatch.detail.startswith(named), mismatch.detail


def test_float_rounding_is_not_a_mismatch(store: SqlStore) -> None:
    """Amounts added in another order differ from the sum by a few ulps: within the tolerance; a cent
    on a million dollars is not."""
    ledger = CostLedger(store)
    for i in range(50):
        ledger.record(cost("acme", "ana", f"r{i}", 20_000.1 + i / 3))
    execute(store, "UPDATE spend_totals SET usd = usd * (1 + 1e-14)")
    assert spend_mismatches(store) == []
    execute(store, "UPDATE spend_totals SET usd = usd + 0.01 WHERE user_id = 'ana'")
    assert [m.detail.split(":")[0] for m in spend_mismatches(store)] == ["tenant 'acme' user 'ana'"]


def test_the_cli_lists_a_spend_mismatch_by_scope(tmp_path: Path) -> None:
    """`harness audit reconcile` exits 1 and names the scope, without a Run id."""
    db = str(tmp_path / "cli.db")
    store = SqlStore.open(db, FakeClock())
    try:
        CostLedger(store).record(cost("acme", "ana", "r1", 0.5))
        execute(store, "UPDATE spend_totals SET usd = 2 WHERE user_id = ''")
    finally:
        store.close()
    result = CliRunner().invoke(app, ["audit", "reconcile", "--db", db])
    assert result.exit_code == 1
    assert "spend_totals: 1 mismatch(es)" in result.stdout
    assert "  spend_totals: tenant 'acme' total: total 2.0 USD over 1 cost(s)" in result.stdout


def test_a_replay_sees_the_spend_recorded_before_the_run(test_runtime: Runtime, clock: FakeClock) -> None:
    """Replay copies the tenant's earlier costs into its scratch database and recounts their totals: the
    Run the user's budget rejected is rejected again on replay, not run (memory is left out, so earlier
    Runs change nothing else)."""
    request = {"task": "chatty", "tenant_id": "t1", "user_id": "tess", "roles": ["tester"],
               "memory": {"enabled": False}}
    states: list[str] = []
    while states[-1:] != ["CLOSED_FAILED"] and len(states) < 40:
        clock.advance(1)  # replay seeds the costs recorded before the Run was created
        rejected = test_runtime.runs.create_run(request)
        states.append(rejected.state)
    # the budget stops the user before the model call that could take it past the cap
    assert states[0] == "SUCCEEDED" and states[-1] == "CLOSED_FAILED"
    assert "budget.per_user" in (rejected.error or "")
    report = replay(rejected.run_id, test_runtime.store, test_runtime.settings)
    assert report.ok, report.divergences
    assert report.summary["state"] == "CLOSED_FAILED"


def test_a_run_total_sums_its_tree_at_any_depth_in_one_read(store: SqlStore) -> None:
    """A Run's total (what its RunTrace carries) is its own costs and those of its child Runs at any
    depth, each Run once; Runs of the tree with no cost count as children; `until` leaves later costs
    out; a cycle in bad data ends; an unknown Run has an empty total."""
    from harness.domain.records import NewRun

    def run(parent: str | None = None) -> str:
        made, _ = store.create_run(NewRun("acme", "ana", "s", {"task": "x"}, parent_run_id=parent))
        return made.run_id

    root = run()
    a, b = run(root), run(root)
    grandchild, quiet = run(a), run(b)
    other = run()  # not in the tree
    ledger = CostLedger(store)
    clock = store.clock
    assert isinstance(clock, FakeClock)
    for run_id, usd in ((root, 0.5), (a, 0.25), (grandchild, 0.125), (grandchild, 0.0625), (other, 9.0)):
        ledger.record(cost("acme", "ana", run_id, usd))
        clock.advance(10)
    ledger.record(CostTrace(run_id=b, source="llm:x:plan", input_tokens=1, output_tokens=1, usd=0.0,
                            tenant_id="acme", user_id="ana", priced=False, model="mystery"))
    total = ledger.run_total(root)
    assert (total.usd, total.costs, total.children, total.unpriced) == (0.9375, 5, 4, 1)
    assert (total.input_tokens, total.output_tokens) == (41, 21)
    assert ledger.run_total(a).usd == 0.4375 and ledger.run_total(a).children == 1
    assert ledger.run_total(quiet).costs == 0 and ledger.run_total(quiet).children == 0
    early = ledger.run_total(root, until=clock.now() - 35)  # the first two costs only
    assert (early.usd, early.costs, early.children) == (0.75, 2, 4)
    assert ledger.unpriced_calls(b) == ["mystery"] and ledger.unpriced_calls(root) == []
    spend = ledger.spend(tenant_id="acme", user_id="ana", run_id=b)
    assert spend.unpriced_models == ("mystery",) and spend.run_usd == 0.0 and spend.tenant_usd == 9.9375
    unknown = ledger.run_total("no-such-run")
    assert (unknown.usd, unknown.costs, unknown.children) == (0.0, 0, 0)
    with store.engine.begin() as conn:  # bad data: the root made a child of its own grandchild
        conn.execute(t.runs.update().where(t.runs.c.run_id == root).values(parent_run_id=grandchild))
    cyclic = ledger.run_total(root)
    assert (cyclic.usd, cyclic.costs, cyclic.children) == (0.9375, 5, 4)
