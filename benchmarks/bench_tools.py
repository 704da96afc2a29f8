"""Overhead of the tool controller per call (SPEC T4), against calling the skill's function directly.

Measures, for one trivial skill (returns its argument):
  * direct         the Python function called in process;
  * local          ToolController.call on the local skill (schema validation, breaker, retry loop,
                   thread-pool hop with timeout, ToolTrace with hashed arguments and result);
  * process start  `python -I -c pass` under subprocess (what any isolated call pays at minimum);
  * sandbox/rlimit ToolController.call on the sandboxed skill with the rlimit fallback;
  * sandbox/bwrap  the same under bubblewrap (skipped, and said so, where bwrap is unusable).

Run:  python benchmarks/bench_tools.py [--local N] [--sandboxed N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.adapters.sandbox import select_sandbox
from harness.adapters.sandbox.bwrap import BwrapSandbox, unavailable_reason
from harness.adapters.sandbox.rlimit import RlimitSandbox
from harness.adapters.sandbox.workdirs import Workdirs
from harness.domain.contracts import CallerIdentity
from harness.pipeline.tool_controller import ToolController
from harness.ports import Sandbox
from harness.skills.manifests import SkillContext, SkillRegistry

CALLER = CallerIdentity(tenant_id="bench", user_id="bench", roles=("bench",))
CODE = "def noop(args, ctx):\n    return {'n': args.get('n', 0)}\n"
MANIFEST = """id: {id}
version: 1.0.0
entrypoint: bench.py:noop
input_schema: {{type: object, properties: {{n: {{type: integer}}}}}}
risk: {{access: read}}
timeout_s: 30
sandbox: {sandbox}
"""


def skills(folder: Path) -> SkillRegistry:
    """A registry with the same function as a local and as a sandboxed skill."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.py").write_text(CODE)
    (folder / "local.yaml").write_text(MANIFEST.format(id="bench.local", sandbox="false"))
    (folder / "sandboxed.yaml").write_text(MANIFEST.format(id="bench.sandboxed", sandbox="true"))
    return SkillRegistry.from_dirs(folder)


def timed(fn: Callable[[int], object], n: int, warmup: int) -> dict[str, float]:
    """Median, p95 and mean of `n` calls, in microseconds, after `warmup` untimed calls."""
    for i in range(warmup):
        fn(i)
    samples = []
    for i in range(n):
        started = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - started) * 1e6)
    samples.sort()
    return {"n": n, "median_us": statistics.median(samples), "p95_us": samples[int(0.95 * (n - 1))],
            "mean_us": statistics.fmean(samples)}


def through(tools: ToolController, skill_id: str) -> Callable[[int], object]:
    skill = tools.registry.get(skill_id)
    assert skill is not None

    def call(i: int) -> object:
        result = tools.call(skill, {"n": i}, run_id=f"bench-{i % 8}", step_id=f"s{i}", output_key="out",
                            caller=CALLER)
        if result.exception is not None:
            raise RuntimeError(f"{skill_id} failed: {result.outcome.error}")
        return result.outcome.output
    return call


def run(local_n: int, sandboxed_n: int) -> dict[str, Any]:
    """Every measurement, keyed by name; a skipped one carries its reason."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        registry = skills(Path(tmp) / "skills")
        fn = registry.get("bench.local")
        assert fn is not None
        ctx = SkillContext("r", "s", "r:s", "bench", "bench", Path(tmp))
        out["direct"] = timed(lambda i: fn.fn({"n": i}, ctx), local_n, 100)
        sandboxes: dict[str, Sandbox | str] = {"rlimit": RlimitSandbox(warn=False)}
        reason = unavailable_reason()
        sandboxes["bwrap"] = reason if reason is not None else BwrapSandbox()
        plain = ToolController(registry, workdirs=Workdirs(Path(tmp) / "runs"), choose_sandbox=select_sandbox)
        try:
            out["local"] = timed(through(plain, "bench.local"), local_n, 100)
        finally:
            plain.close()
        out["process start"] = timed(
            lambda i: subprocess.run([sys.executable, "-I", "-c", "pass"], check=True), sandboxed_n, 2)
        for name, sandbox in sandboxes.items():
            if isinstance(sandbox, str):
                out[f"sandbox/{name}"] = {"skipped": sandbox}
                continue
            tools = ToolController(registry, workdirs=Workdirs(Path(tmp) / "runs"), sandbox=sandbox)
            try:
                out[f"sandbox/{name}"] = timed(through(tools, "bench.sandboxed"), sandboxed_n, 2)
            finally:
                tools.close()
    return out


def table(results: dict[str, Any]) -> str:
    """The results as a Markdown table, overhead measured against the direct call."""
    direct = results["direct"]["median_us"]
    lines = ["| call | n | median | p95 | overhead vs direct (median) |", "|---|---:|---:|---:|---:|"]
    for name, r in results.items():
        if "skipped" in r:
            lines.append(f"| {name} | - | skipped: {r['skipped']} | | |")
            continue
        lines.append(f"| {name} | {r['n']} | {_fmt(r['median_us'])} | {_fmt(r['p95_us'])} | "
                     f"{_fmt(r['median_us'] - direct)} |")
    return "\n".join(lines)


def _fmt(us: float) -> str:
    return f"{us / 1000:.1f} ms" if us >= 1000 else f"{us:.1f} µs"


def main() -> None:
    """Parse the options, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--local", type=int, default=2_000, help="local calls to time")
    parser.add_argument("--sandboxed", type=int, default=30, help="sandboxed calls to time")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    options = parser.parse_args()
    results = run(options.local, options.sandboxed)
    print(json.dumps(results, indent=2) if options.json else table(results))


if __name__ == "__main__":
    main()
