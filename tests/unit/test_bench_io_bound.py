"""The I/O-bound benchmark (issue 37) still runs: a tiny size end to end, `harness serve` against the fake model."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_io_bound.py"
FIELDS = ("wall_s", "runs_per_s", "peak_model_calls", "model_calls", "peak_runs_driven", "peak_rss_mb", "peak_pss_mb",
          "peak_pg_connections", "cpu_s_per_run", "failures", "failed_by_reason")


def _bench(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(BENCH), "--runs", "5", "--delay", "0.05", "--limit-s", "60", "--json",
                           *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_harness_serve_drives_every_run_through_the_fake_model() -> None:
    """Five Runs POSTed at once to `harness serve` on SQLite all succeed, each with two model calls (plan,
    answer), and the report carries every measure for the contender."""
    report = _bench("--backends", "sqlite", "--no-langgraph")
    (result,) = report["rounds"][0].values()
    assert "error" not in result, result
    assert result["contender"] == "harness-sqlite"
    for field in FIELDS:
        assert field in result, field
    assert result["failures"] == 0 and result["failed_by_reason"] == {} and result["all_final"]
    assert result["succeeded"] == 5 and result["model_calls"] == 10
    assert result["peak_model_calls"] >= 1 and result["peak_runs_driven"] >= 1
    assert result["peak_rss_mb"] > 0 and result["peak_pss_mb"] > 0 and result["cpu_s_per_run"] > 0
    assert report["medians"]["harness-sqlite"]["failures"] == 0


@pytest.mark.skipif(importlib.util.find_spec("langgraph") is None, reason="needs the bench extra (langgraph)")
def test_langgraph_runs_in_the_same_round_and_gives_ratios() -> None:
    """LangGraph (here on AsyncSqliteSaver) drives the same five Runs through the same fake model, and harness's
    wall, memory and CPU are given as ratios to it."""
    report = _bench("--backends", "sqlite", "--langgraph-backend", "sqlite")
    langgraph = report["rounds"][0]["langgraph"]
    assert "error" not in langgraph, langgraph
    assert langgraph["failures"] == 0 and langgraph["model_calls"] == 10 and langgraph["peak_runs_driven"] == 5
    assert set(report["ratios"]["harness-sqlite/langgraph"]) == {"wall_s", "peak_rss_mb", "peak_pss_mb",
                                                                  "cpu_s_per_run"}
