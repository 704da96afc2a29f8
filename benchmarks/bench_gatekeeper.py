"""The gatekeeper (issue 4): policy decisions per second for a 5-call plan, time from an approval to the
Run's EXECUTING, a worker's memory with N parked Runs vs none (it must be flat: a parked Run holds
no per-Run resources in any process), and the budget check's read against the tenant's cost history (it
must be flat too: the Run's costs and two running totals, not a sum over every cost ever recorded).

    python benchmarks/bench_gatekeeper.py --parked 2000 --history 10000,1000000
    python benchmarks/bench_gatekeeper.py --parked 20 --decisions 200 --history 1000,5000 --json     # smoke
    python benchmarks/bench_gatekeeper.py --history 10000,1000000 --history-db postgresql+psycopg://...  # only that
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIVE_CALLS = {"steps": [
    {"id": "a", "tool_call": {"skill": "orders.lookup", "arguments": {"order_id": "A-1001"}}, "output_key": "a"},
    {"id": "b", "tool_call": {"skill": "customers.lookup", "arguments": {"customer_id": {"$ref": "a.customer_id"}}},
     "depends_on": ["a"], "output_key": "b"},
    {"id": "c", "tool_call": {"skill": "refunds.draft", "arguments": {"order": {"$ref": "a"}, "amount": 10}},
     "depends_on": ["a"], "output_key": "c"},
    {"id": "d", "tool_call": {"skill": "notes.add", "arguments": {"order_id": "A-1001", "text": "noted"}},
     "output_key": "d"},
    {"id": "e", "tool_call": {"skill": "refunds.issue", "arguments": {"order_id": "A-1001", "amount": 10}},
     "depends_on": ["c"], "output_key": "e"},
], "budget_estimate": {"cost_usd": 0.001}}


def _runtime(folder: Path) -> Any:
    from harness.config import build_runtime
    from harness.settings import Settings

    os.environ["HARNESS_EXAMPLE_LEDGER"] = str(folder / "ledger.jsonl")
    return build_runtime(Settings(db=str(folder / "gk.db"), llm_rules=HERE / "fixtures" / "bench_rules.yaml",
                                  data_dir=folder / "data"))


def decisions_per_second(folder: Path, count: int) -> dict[str, float]:
    """PolicyEngine.evaluate on a 5-call plan with the example policy set (Cedar, budgets, guardrails)."""
    from harness.domain.contracts import CallerIdentity
    from harness.domain.plans import Plan

    rt = _runtime(folder)
    plan = Plan.model_validate(FIVE_CALLS)
    caller = CallerIdentity(tenant_id="default", user_id="alice", roles=("support_agent",))
    times = []
    for i in range(count):
        started = time.perf_counter()
        evaluation = rt.policy.evaluate(plan, caller, f"run-{i}")
        times.append(time.perf_counter() - started)
    assert evaluation.decision.decision == "await_hitl"
    rt.close()
    median = statistics.median(times)
    return {"median_ms": median * 1000, "decisions_per_s": 1 / median,
            "rules_per_decision": float(len(evaluation.decision.verdicts))}


def approval_to_executing(folder: Path, count: int) -> dict[str, float]:
    """From decide() being called to the Run's EXECUTING committed (decision persisted first, G4)."""
    rt = _runtime(folder)
    times = []
    for i in range(count):
        user = f"approver-test-{i}"
        parked = rt.runs.create_run({"task": "bench-hitl A-1001", "user_id": user, "roles": ["support_agent"]})
        approver = rt.identities.resolve("alice").model_copy(update={"user_id": user})
        started = time.perf_counter()
        verdict, result = rt.runs.decide(parked.approval_request_id or "", approver, "approve", resume=False)
        times.append(time.perf_counter() - started)
        assert verdict.accepted and result.state == "EXECUTING"
    rt.close()
    return {"median_ms": statistics.median(times) * 1000, "p99_ms": sorted(times)[int(0.99 * (len(times) - 1))] * 1000}


#: what the budget check read before the running totals (migration 0008): sums over the tenant's whole history
SUMS_BY_SCOPE = (
    "SELECT COALESCE(SUM(CASE WHEN run_id = :run THEN usd ELSE 0.0 END), 0.0), "
    "COALESCE(SUM(CASE WHEN user_id = :user THEN usd ELSE 0.0 END), 0.0), COALESCE(SUM(usd), 0.0) "
    "FROM costs WHERE tenant_id = :tenant")
HISTORY_REPEATS = 25


def budget_check_vs_history(db: str, sizes: list[int]) -> list[dict[str, float]]:
    """Median time of CostLedger.spent_by_scope (the Run's costs, the user's and the tenant's totals) and
    of the sums it replaced, with the tenant's recorded costs grown to each size: 100 users, 4 costs per
    Run. `db` must be empty (a SQLite path or a database URL)."""
    import sqlalchemy as sa

    from harness.adapters.sql import schema as t
    from harness.adapters.sql.ledger import CostLedger, recount_totals
    from harness.adapters.sql.store import SqlStore

    store = SqlStore.open(db)
    ledger, filled, out = CostLedger(store), 0, []
    scope = {"tenant": "acme", "user": "u7", "run": "run-7"}
    for size in sorted(sizes):
        while filled < size:
            chunk = range(filled, min(size, filled + 50_000))
            with store.engine.begin() as conn:
                conn.execute(t.costs.insert(), [
                    {"run_id": f"run-{i // 4}", "tenant_id": "acme", "user_id": f"u{i // 4 % 100}", "source": "llm",
                     "input_tokens": 100, "output_tokens": 20, "usd": 0.0001 + (i % 997) * 1e-7, "at": float(i)}
                    for i in chunk])
            filled = chunk[-1] + 1
        with store.engine.begin() as conn:
            recount_totals(conn, "acme")
        totals, sums = [], []
        for _ in range(HISTORY_REPEATS):
            started = time.perf_counter()
            now = ledger.spent_by_scope(tenant_id="acme", user_id=scope["user"], run_id=scope["run"])
            totals.append(time.perf_counter() - started)
        for _ in range(HISTORY_REPEATS):
            started = time.perf_counter()
            with store.reader.connect() as conn:
                before = conn.execute(sa.text(SUMS_BY_SCOPE), scope).one()
            sums.append(time.perf_counter() - started)
        assert all(abs(a - float(b)) <= 1e-9 * (1 + abs(a)) for a, b in zip(now, before, strict=True)), (now, before)
        out.append({"costs": float(size), "totals_ms": statistics.median(totals) * 1000,
                    "sums_ms": statistics.median(sums) * 1000})
    store.close()
    return out


def park(folder: Path, count: int) -> None:
    """Fill a database with `count` Runs parked in AWAITING_HITL (one requester each: the rate limit)."""
    rt = _runtime(folder)
    for i in range(count):
        result = rt.runs.create_run({"task": "bench-hitl A-1001", "user_id": f"parked-{i}",
                                     "roles": ["support_agent"]})
        assert result.state == "AWAITING_HITL"
    rt.close()


def worker_rss(folder: Path) -> int:
    """A fresh worker process's peak RSS (kB) after it opens the database, reads a page of pending requests,
    applies timeouts, sweeps and approves one Run to completion."""
    code = f"""
import json, sys
sys.path.insert(0, {str(HERE)!r})
from pathlib import Path
from bench_gatekeeper import _runtime
from harness.drive.sweeper import ZombieSweeper
rt = _runtime(Path({str(folder)!r}))
pending = rt.hitl.pending(limit=50)  # a worker pages through requests; it never holds them all
rt.runs.expire_approvals()
ZombieSweeper(rt.store, rt.machine).sweep_once()
if pending:
    r = pending[0]
    who = rt.identities.resolve("alice").model_copy(update={{"user_id": r.requester}})
    rt.runs.decide(r.request_id, who, "approve")
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
print(json.dumps({{"pending": len(pending), "hwm_kb": int(hwm)}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(json.loads(done.stdout.strip().splitlines()[-1])["hwm_kb"])


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parked", type=int, default=2000)
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--approvals", type=int, default=100)
    parser.add_argument("--history", default="10000,100000",
                        help="tenant cost histories to time the budget check on (comma-separated row counts)")
    parser.add_argument("--history-db", help="an empty database (URL) for the history measurement, which then "
                                             "runs alone; default: a temporary SQLite file")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(n) for n in args.history.split(",")]
    if args.history_db:
        _print_history(budget_check_vs_history(args.history_db, sizes), args.json)
        return
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
            tempfile.TemporaryDirectory() as c:
        report["policy"] = decisions_per_second(Path(a), args.decisions)
        report["approval_to_executing"] = approval_to_executing(Path(b), args.approvals)
        empty = worker_rss(Path(c))
        started = time.perf_counter()
        park(Path(c), args.parked)
        report["parking_s"] = time.perf_counter() - started
        full = worker_rss(Path(c))
        report["memory"] = {"parked": args.parked, "rss_mb_with_0": empty / 1024, "rss_mb_with_parked": full / 1024,
                            "growth_mb": (full - empty) / 1024}
        report["budget_check"] = budget_check_vs_history(str(Path(a) / "history.db"), sizes)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    p, h, m = report["policy"], report["approval_to_executing"], report["memory"]
    print(f"policy: {p['decisions_per_s']:.0f} decisions/s for a 5-call plan ({p['median_ms']:.2f} ms median, "
          f"{p['rules_per_decision']:.0f} rule verdicts each)")
    print(f"approval -> EXECUTING: median {h['median_ms']:.2f} ms, p99 {h['p99_ms']:.2f} ms")
    print(f"worker peak RSS: {m['rss_mb_with_0']:.1f} MB with 0 parked, {m['rss_mb_with_parked']:.1f} MB with "
          f"{m['parked']} parked (growth {m['growth_mb']:+.1f} MB)")
    _print_history(report["budget_check"], False)


def _print_history(rows: list[dict[str, float]], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"budget_check": rows}, indent=2))
        return
    for r in rows:
        print(f"budget check with {r['costs']:,.0f} costs in the tenant: {r['totals_ms']:.3f} ms median "
              f"(running totals), {r['sums_ms']:.3f} ms (sums over the history, before 0008)")


if __name__ == "__main__":
    main()
