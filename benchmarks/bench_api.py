"""Throughput and latency of the HTTP API on the embedded default (SPEC U2, D1), and the harness's own
overhead per Run through the API against the library.

Starts `harness serve` (SQLite file, embedded worker, scripted LLM, support example) on a loopback
port, then drives it from this process with an asyncio httpx load generator:
  * create-run   POST /api/v1/runs (no wait): the id comes back once CREATED is committed; the
                 embedded worker drives every Run to its end meanwhile, competing for the same CPUs;
  * get-run      GET /api/v1/runs/{id} on finished Runs;
  * per Run      one Run end to end, sequentially: POST ?wait=true through the API, against
                 RunManager.create_run in process (the library), on a separate database each.

Run:  python benchmarks/bench_api.py [--creates N] [--gets N] [--concurrency C] [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from harness.config import build_runtime
from harness.settings import Settings

TASK = "Where is order A-1001?"
KEY = {"X-API-Key": "demo-alice-key"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(folder: Path, threads: int) -> tuple[subprocess.Popen[bytes], str]:
    """`harness serve` on a free loopback port; returns the process and its base URL once it answers."""
    port = _free_port()
    env = {
        **os.environ,
        "HARNESS_EXAMPLE_LEDGER": str(folder / "ledger.jsonl"),
        "HARNESS_DATA_DIR": str(folder / "data"),
        "HARNESS_DRIVE_CONCURRENCY": str(threads),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "serve",
            "--port",
            str(port),
            "--db",
            str(folder / "api.db"),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=folder,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", headers=KEY, timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start")


def summary(latencies: list[float], wall: float) -> dict[str, float]:
    """Requests per second and latency percentiles in milliseconds."""
    ordered = sorted(latencies)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "requests": len(ordered),
        "rps": round(len(ordered) / wall, 1),
        "p50_ms": round(pick(0.50), 2),
        "p99_ms": round(pick(0.99), 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


async def load(
    base: str, method: str, paths: list[str], concurrency: int, body: Any = None
) -> dict[str, float]:
    """Send one request per path with `concurrency` in flight; every answer must be a 2xx."""
    latencies: list[float] = []
    queue = list(reversed(paths))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            path = queue.pop()
            started = time.perf_counter()
            response = await client.request(method, path, json=body)
            latencies.append(time.perf_counter() - started)
            if response.status_code >= 300:
                raise SystemExit(f"{method} {path}: {response.status_code} {response.text}")

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, headers=KEY, limits=limits, timeout=60) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return summary(latencies, wall)


def wait_idle(base: str, timeout: float = 300) -> None:
    """Wait until the embedded worker has driven every accepted Run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{base}/health", headers=KEY, timeout=10).json()["worker"]["in_flight"] == 0:
            return
        time.sleep(0.2)


def per_run_api(base: str, runs: int) -> list[float]:
    """Seconds per Run through the API, waiting for each to finish."""
    out = []
    with httpx.Client(base_url=base, headers=KEY, timeout=60) as client:
        for _ in range(runs):
            started = time.perf_counter()
            doc = client.post("/api/v1/runs", json={"task": TASK}, params={"wait": "true"}).json()
            out.append(time.perf_counter() - started)
            assert doc["state"] == "SUCCEEDED", doc
    return out


def per_run_both(base: str, folder: Path, runs: int) -> tuple[list[float], list[float]]:
    """Seconds per Run through the API (wait=true) and through the library in this process (same example,
    its own database), interleaved so that background load on the machine hits both alike."""
    os.environ["HARNESS_EXAMPLE_LEDGER"] = str(folder / "lib-ledger.jsonl")
    rt = build_runtime(Settings(db=str(folder / "lib.db"), data_dir=folder / "lib-data"))
    api: list[float] = []
    library: list[float] = []
    try:
        for i in range(runs + 5):  # the first five of each warm imports and caches
            started = time.perf_counter()
            result = rt.runs.create_run({"task": TASK, "user_id": "alice", "roles": ["support_agent"]})
            if i >= 5:
                library.append(time.perf_counter() - started)
            assert result.state == "SUCCEEDED", result
            took = per_run_api(base, 1)
            if i >= 5:
                api.extend(took)
    finally:
        rt.close()
    return api, library


def main() -> None:
    """Run the measurements and print them."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--creates", type=int, default=300)
    parser.add_argument("--gets", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4, help="the server's worker threads")
    parser.add_argument("--runs", type=int, default=40, help="Runs for the per-Run comparison")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="harness-bench-api-"))
    proc, base = start_server(folder, args.threads)
    try:
        api, library = per_run_both(base, folder, args.runs)
        creates = asyncio.run(
            load(base, "POST", ["/api/v1/runs"] * args.creates, args.concurrency, {"task": TASK})
        )
        wait_idle(base)
        ids = [
            r["run_id"]
            for r in httpx.get(f"{base}/api/v1/runs", headers=KEY, params={"limit": 200}).json()["runs"]
        ]
        gets = asyncio.run(
            load(
                base, "GET", [f"/api/v1/runs/{ids[i % len(ids)]}" for i in range(args.gets)], args.concurrency
            )
        )
    finally:
        proc.terminate()
        proc.wait(30)
    api_ms, lib_ms = statistics.median(api) * 1000, statistics.median(library) * 1000
    result = {
        "create_run": creates,
        "get_run": gets,
        "per_run_median_ms": {
            "api_wait": round(api_ms, 1),
            "library": round(lib_ms, 1),
            "api_overhead": round(api_ms - lib_ms, 1),
        },
        "setup": {
            "concurrency": args.concurrency,
            "worker_concurrency": args.threads,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "database": "SQLite file (WAL)",
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name in ("create_run", "get_run"):
        r = result[name]
        print(
            f"{name:<11} {r['rps']:>7} req/s   p50 {r['p50_ms']:>7} ms   p99 {r['p99_ms']:>7} ms"
            f"  ({r['requests']} requests)"
        )
    p = result["per_run_median_ms"]
    print(
        f"per Run     API (wait) {p['api_wait']} ms   library {p['library']} ms"
        f"   API overhead {p['api_overhead']} ms"
    )


if __name__ == "__main__":
    main()
