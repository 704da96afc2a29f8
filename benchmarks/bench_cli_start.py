"""CPU time each CLI command costs to start: `harness --help`, `runs show`, `approve`, `approvals`.

    python benchmarks/bench_cli_start.py               # a Markdown table
    python benchmarks/bench_cli_start.py --json        # one JSON document
    python benchmarks/bench_cli_start.py --rounds 7

CPU time, not wall time: the user + system seconds of the command's process (resource.getrusage of
RUSAGE_CHILDREN, before and after each child), so a machine shared with other jobs inflates it far less
than a stopwatch. The median of --rounds runs of each command; the first run of each is discarded (it
fills the page cache and writes the bytecode cache, kept under the temporary folder by PYTHONPYCACHEPREFIX:
a run with PYTHONDONTWRITEBYTECODE would compile every module on every start).

Set-up, not measured: `harness demo` in a new folder (a database with Runs, one waiting for a support
lead). Then each command on that database: `--help`; `runs show RUN_ID --json` of a succeeded Run;
`approve REQUEST --as carol` of a request that does not exist (refused with exit 2 after the command has
built all it needs to decide: the start without the decision's own work); `approvals --json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def cpu_of(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    """(user + system CPU seconds, exit code) of one `harness ARGS` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd, env=env, capture_output=True,
                          check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        # bytecode cached as in any installation (in a folder of its own: the source tree is left alone)
        env = {**{k: v for k, v in os.environ.items()
                  if not k.startswith("HARNESS_") and k != "PYTHONDONTWRITEBYTECODE"},
               "PYTHONPYCACHEPREFIX": str(cwd / "pycache"),
               "HARNESS_DATA_DIR": str(cwd / "data"), "HARNESS_CHECKPOINT_KEY_DIR": str(cwd / "keys")}
        demo = subprocess.run([sys.executable, "-m", "harness.cli", "demo"], cwd=cwd, env=env, capture_output=True,
                              text=True, check=True)
        run_id = re.findall(r"run ([0-9a-f-]{36})  SUCCEEDED", demo.stdout)[0]
        commands = {
            "harness --help": ["--help"],
            "harness runs show RUN_ID --json": ["runs", "show", run_id, "--json"],
            "harness approve REQUEST --as carol": ["approve", "01a00000-0000-7000-8000-000000000000", "--as", "carol"],
            "harness approvals --json": ["approvals", "--json"],
        }
        results = {}
        for name, args in commands.items():
            samples, codes = [], set()
            for _ in range(options.rounds + 1):
                cpu, code = cpu_of(args, cwd, env)
                samples.append(cpu)
                codes.add(code)
            kept = samples[1:]
            results[name] = {"median_cpu_s": round(statistics.median(kept), 3), "min_cpu_s": round(min(kept), 3),
                             "max_cpu_s": round(max(kept), 3), "exit_codes": sorted(codes)}
    if options.json:
        print(json.dumps({"rounds": options.rounds, "commands": results}, indent=2))
        return
    print(f"| command | CPU s, median of {options.rounds} | min | max | exit |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| `{name}` | {r['median_cpu_s']:.2f} | {r['min_cpu_s']:.2f} | {r['max_cpu_s']:.2f} | "
              f"{','.join(map(str, r['exit_codes']))} |")


if __name__ == "__main__":
    main()
