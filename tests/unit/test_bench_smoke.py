"""The kernel benchmark still runs, and its plain-sqlite3 baseline still writes what the harness writes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernel.py"


def test_kernel_benchmark_runs_and_its_baseline_does_the_same_writes() -> None:
    """The benchmark CLI finishes on a tiny size, and both sides leave the same rows in every table."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--runs", "5", "--repeats", "1", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    counts = result["row_counts"]
    assert counts["harness"] == counts["baseline"], "the baseline no longer does the harness's row writes"
    assert counts["harness"]["runs"] == 5
    assert counts["harness"]["outbox"] == 0
    assert result["transitions_per_run"] == 7  # CREATED … TRACING, SUCCEEDED
    assert result["chain_records"] == counts["harness"]["trace_records"]
    for name in ("harness_tps", "baseline_tps", "plain_walk_rps", "recompute_rps"):
        assert result["medians"][name] > 0
    assert math.isfinite(result["transition_ratio"]) and result["transition_ratio"] > 0


def test_langgraph_comparison_runs_every_contender() -> None:
    """The side-by-side benchmark (issue 9) finishes on a tiny size with every contender and every ratio."""
    bench = BENCH.parent / "bench_vs_langgraph.py"
    done = subprocess.run([sys.executable, str(bench), "--runs", "3", "--warmup", "1", "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for name in ("harness", "harness-hitl", "langgraph", "langgraph-hitl", "langgraph-sync", "floor", "plain"):
        result = report["results"][name]
        assert "error" not in result, (name, result)
        assert result["median_ms"] > 0 and result["bytes_per_run"] > 0 and result["peak_rss_mb"] > 0
    assert set(report["ratios"]) == {"harness/langgraph", "harness/langgraph-sync", "harness-hitl/langgraph-hitl",
                                     "harness/floor"}
    # like for like: every SQLite contender really ran with the same durability
    assert report["synchronous"] == "NORMAL"
    assert {report["results"][n]["synchronous"] for n in ("harness", "langgraph", "langgraph-sync", "floor")} == {
        "NORMAL"}
    assert report["harness_overhead_ms_per_run"] > 0
    assert report["warmup"] == 1


def test_langgraph_comparison_rounds_give_medians_and_ranges_at_full_durability() -> None:
    """--repeats runs every contender in several rounds: each number is the median over the rounds,
    each ratio the median of the ratios within a round, with its range; and --synchronous FULL reaches
    every contender's connection, harness's engine included (one invocation checks both: each bench
    child is a fresh interpreter, and they are most of this file's time)."""
    bench = BENCH.parent / "bench_vs_langgraph.py"
    done = subprocess.run([sys.executable, str(bench), "--runs", "2", "--warmup", "0", "--repeats", "2", "--json",
                           "--synchronous", "FULL", "--only", "harness", "langgraph", "floor"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["repeats"] == 2
    low, high = report["results"]["harness"]["median_ms_range"]
    assert 0 < low <= report["results"]["harness"]["median_ms"] <= high
    ratio = report["ratios"]["harness/floor"]
    assert ratio["median_ms_range"][0] <= ratio["median_ms"] <= ratio["median_ms_range"][1]
    assert set(report["results"]) == {"harness", "langgraph", "floor"}
    assert {r["synchronous"] for r in report["results"].values()} == {"FULL"}


def test_gatekeeper_benchmark_runs() -> None:
    """The gatekeeper benchmark (issue 4) finishes on a tiny size and reports all four measurements."""
    bench = BENCH.parent / "bench_gatekeeper.py"
    done = subprocess.run([sys.executable, str(bench), "--parked", "5", "--decisions", "20", "--approvals", "3",
                           "--history", "500,1000", "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["policy"]["decisions_per_s"] > 0 and report["policy"]["rules_per_decision"] >= 5
    assert report["approval_to_executing"]["median_ms"] > 0
    assert report["memory"]["parked"] == 5 and report["memory"]["rss_mb_with_parked"] > 0
    # the budget check timed on two cost histories (the tool checks both answers agree at each size)
    assert [row["costs"] for row in report["budget_check"]] == [500, 1000]
    assert all(row["totals_ms"] > 0 and row["sums_ms"] > 0 for row in report["budget_check"])


def test_spend_totals_benchmark_runs_both_setups_and_loses_no_update() -> None:
    """The spend-totals benchmark finishes on a tiny size with a total on one row and spread over rows
    (it refuses to report when a tenant's total does not count every cost its writers recorded)."""
    bench = BENCH.parent / "bench_spend_totals.py"
    done = subprocess.run([sys.executable, str(bench), "--backends", "sqlite", "--writers", "2", "--costs", "5",
                           "--rounds", "1", "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["sqlite"]
    assert report["shards=1"]["costs_per_s"] > 0 and report["shards=16"]["costs_per_s"] > 0
    assert report["wall_ratio"] > 0


def test_sweeper_benchmark_runs() -> None:
    """The sweeper scan benchmark (issue 8) finishes on a tiny size and finds every live Run healthy."""
    bench = BENCH.parent / "bench_sweeper.py"
    done = subprocess.run([sys.executable, str(bench), "--final", "500", "--small", "50", "--repeats", "2",
                           "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["large"]["final_runs"] == 500 and report["large"]["scan_ms"] > 0


def test_the_profiling_tool_runs_in_every_mode() -> None:
    """profile_run.py (issue 9's profiling pass) finishes on a tiny size: timing, self time by package, WAL
    pages per transaction."""
    tool = BENCH.parent / "profile_run.py"
    for mode, expect in (([], "median wall"), (["--by-module"], "inside SQLite"), (["--wal"], "by table or index"),
                         (["--components"], "the whole Run")):
        done = subprocess.run([sys.executable, str(tool), "--runs", "2", "--warmup", "1", *mode],
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        assert expect in done.stdout


def test_langgraph_comparison_runs_on_postgresql_and_counts_round_trips() -> None:
    """--backend postgresql: harness and LangGraph + PostgresSaver each in a fresh database of the loopback
    server, with their commits, statements and round trips counted from the wire, and one harness Run's
    transactions profiled."""
    from tests.integration.conftest import require_service

    require_service("postgresql")
    bench = BENCH.parent / "bench_vs_langgraph.py"
    done = subprocess.run([sys.executable, str(bench), "--backend", "postgresql", "--runs", "1", "--warmup", "0",
                           "--count", "1", "--json", "--only", "harness", "langgraph-sync", "floor"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "postgresql"
    harness, langgraph = report["results"]["harness"], report["results"]["langgraph-sync"]
    for result in (harness, langgraph, report["results"]["floor"]):
        assert "error" not in result, result
        assert result["median_ms"] > 0 and result["bytes_per_run"] > 0
        assert result["synchronous"].startswith("synchronous_commit=")
    for counts in (harness["counts"], langgraph["counts"]):
        assert counts["write_commits"] >= 1 and counts["round_trips"] >= counts["write_commits"]
        assert counts["statements"] >= counts["commits"] and counts["wire_bytes"] > 0
    profile = harness["profile"]
    # the context is assembled (a memory read) before the Run is accepted; its acceptance commits first
    first = next(t for t in profile if t["end"] == "COMMIT")
    assert "run_manager.create_run" in first["caller"] and "INSERT runs" in first["what"]
    assert sum(t["end"] == "COMMIT" for t in profile) >= 4  # acceptance, model, tools, close at the least
    assert "harness/langgraph-sync" in report["ratios"]


def test_the_cpu_share_tool_names_what_kept_the_cores_busy() -> None:
    """cpu_share.py runs a command, passes its output through, and puts a busy process's CPU under its
    name: a child spinning for three seconds keeps about one core busy."""
    spin = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass\nprint('spun')"
    done = subprocess.run([sys.executable, str(BENCH.parent / "cpu_share.py"), sys.executable, "-c", spin],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "spun" and "cores busy" in lines[1]
    kind, cores = lines[2].split()[0], float(lines[2].split()[1])
    assert kind.startswith("python") and cores > 0.3, done.stdout


def test_the_start_benchmark_measures_serve_until_it_answers() -> None:
    """bench_cli_start.py measures `harness serve` from its start until /livez answers: a CPU figure of a
    process that came up (exit code 0), not of one that failed to start."""
    done = subprocess.run([sys.executable, str(BENCH.parent / "bench_cli_start.py"), "--rounds", "1", "--only",
                           "serve", "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    (name, result), = json.loads(done.stdout)["commands"].items()
    assert name.startswith("harness serve")
    assert result["this"]["exit_codes"] == [0] and 0.1 < result["this"]["median_cpu_s"] < 30, result
