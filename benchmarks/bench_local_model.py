"""Runs planned by a real small model: SmolLM2-135M-Instruct behind llama-cpp-python's OpenAI-compatible
server (the `local-model` extra), on the bundled support example with every skill offered.

Starts the server once (load time measured), then drives N Runs through RunManager.create_run with
HARNESS_LLM=local, cycling through the support tasks below. For each Run it records the wall time, whether
the model's plan passed validation (the Run got past PLANNING; an invalid plan fails the Run there with the
reason traced), and the Run's end. Prints medians and counts; `--json` prints the raw figures too.

Run:  python benchmarks/bench_local_model.py [--runs 50] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.config import build_runtime
from harness.local_model import LocalModelServer
from harness.settings import Settings

TASKS = (
    "Where is order A-1001?",
    "What is the status of order A-1002?",
    "Look up customer C-17.",
    "Refund 42.50 EUR for order A-1001",
    "Add a note to order A-1002: the customer called about the delivery.",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-local-"))
    started = time.perf_counter()
    with LocalModelServer(log=folder / "server.log") as server:
        load_s = time.perf_counter() - started
        rt = build_runtime(Settings(db=str(folder / "bench.db"), llm="local", llm_base_url=server.base_url,
                                    data_dir=folder / "data", memory="off"))
        rows: list[dict[str, Any]] = []
        for i in range(args.runs):
            task = TASKS[i % len(TASKS)]
            t0 = time.perf_counter()
            result = rt.runs.create_run({"task": task, "user_id": "alice"})
            seconds = time.perf_counter() - t0
            validated = "POLICY_CHECK" in result.path
            reason = None if validated else (result.error or "")[:160]
            rows.append({"task": task, "seconds": round(seconds, 3), "validated": validated, "state": result.state,
                         "reason": reason})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # progress, one line per Run
        rt.close()
    times = [r["seconds"] for r in rows]
    valid = sum(r["validated"] for r in rows)
    summary = {
        "runs": len(rows), "server_start_s": round(load_s, 2), "plans_validated": valid,
        "median_run_s": round(statistics.median(times), 3), "p90_run_s": round(sorted(times)[int(len(times) * 0.9)], 3),
        "states": dict(collections.Counter(r["state"] for r in rows)),
        "invalid_reasons": dict(collections.Counter((r["reason"] or "").split(":")[0] for r in rows
                                                    if not r["validated"])),
        "validated_by_task": {t: sum(r["validated"] for r in rows if r["task"] == t) for t in TASKS},
    }
    print(json.dumps({"summary": summary, **({"runs": rows} if args.json else {})}, indent=2))


if __name__ == "__main__":
    main()
