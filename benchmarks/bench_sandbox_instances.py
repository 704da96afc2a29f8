"""Start and reuse times of kept sandbox instances (harness.pipeline.sandbox_pool) under bubblewrap.

Measures, on a scratch SQLite database, for a trivial skill (returns its argument):
  * start        SandboxPool.lease of a new (Run, skill): its units taken in one transaction, the holder
                 bwrap started and ready, the row noted (no call yet);
  * first call   the first call inside the new instance (nsenter + runner);
  * reuse        a later call of the same Run: the lease found and renewed, then nsenter + runner;
  * fresh        the same call as a fresh bwrap sandbox per call (what a skill without `persistent` pays);
  * release      ending the instance in the database and stopping its process.

Run:  python benchmarks/bench_sandbox_instances.py [--instances N] [--calls K] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.adapters.sandbox.bwrap import BwrapSandbox, unavailable_reason
from harness.adapters.sandbox.instance import stop
from harness.adapters.sandbox.workdirs import Workdirs
from harness.adapters.sql.store import SqlStore
from harness.domain.sandbox import RELEASED, Holder, PoolSettings, SandboxJob
from harness.pipeline.sandbox_pool import SandboxPool

CODE = "def noop(args, ctx):\n    return {'n': args.get('n', 0)}\n"


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered) * 1000, 2),
            "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000, 2),
            "n": len(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--calls", type=int, default=5, help="calls per instance (the first included)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"bubblewrap unusable here: {reason}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "skill").mkdir()
        entry = root / "skill" / "bench.py"
        entry.write_text(CODE)
        store = SqlStore.open(str(root / "bench.db"))
        pool = SandboxPool(store, PoolSettings(host="bench", host_cap=1000, tenant_cap=1000), owner="bench")
        sandbox, workdirs = BwrapSandbox(), Workdirs(root / "runs")
        times: dict[str, list[float]] = {"start": [], "first call": [], "reuse": [], "fresh": [], "release": []}

        def job(run_id: str) -> SandboxJob:
            return SandboxJob(skill_id="bench.noop", function="noop", arguments={"n": 1},
                              context={"run_id": run_id, "step_id": "a", "idempotency_key": f"{run_id}:a",
                                       "tenant_id": "bench", "user_id": "bench",
                                       "workdir": str(workdirs.ensure(run_id))},
                              workdir=workdirs.ensure(run_id), wall_s=30, entry_file=entry)

        def lease(run_id: str) -> Any:
            return pool.lease(sandbox, job(run_id), tenant_id="bench", user_id="bench", persistent=True, ports=1,
                              deadline=time.monotonic() + 30)

        sandbox.run(job("warm-up"))  # the interpreter's paths are probed once per process
        for n in range(args.instances):
            run_id = f"bench-{n}"
            began = time.perf_counter()
            first = lease(run_id)
            times["start"].append(time.perf_counter() - began)
            began = time.perf_counter()
            assert sandbox.run_in(first.holder, job(run_id)).ok
            times["first call"].append(time.perf_counter() - began)
            for _ in range(args.calls - 1):
                began = time.perf_counter()
                again = lease(run_id)
                assert again.event == "reused" and sandbox.run_in(again.holder, job(run_id)).ok
                times["reuse"].append(time.perf_counter() - began)
            began = time.perf_counter()
            assert sandbox.run(job(run_id)).ok
            times["fresh"].append(time.perf_counter() - began)
            began = time.perf_counter()
            pool.table.end_now(first.row, RELEASED, "benchmark", store.clock.now())
            stop(Holder(first.holder.pid, first.holder.pid_start))
            times["release"].append(time.perf_counter() - began)
        store.close()
    result = {name: summary(samples) for name, samples in times.items()}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, s in result.items():
        print(f"{name:12} median {s['median_ms']:8.2f} ms   p95 {s['p95_ms']:8.2f} ms   n={s['n']}")


if __name__ == "__main__":
    main()
