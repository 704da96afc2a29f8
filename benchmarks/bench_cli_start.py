"""CPU time each CLI command costs to start: every commonly scripted `harness` command, on a demo database.

    python benchmarks/bench_cli_start.py                          # a Markdown table
    python benchmarks/bench_cli_start.py --json                   # one JSON document
    python benchmarks/bench_cli_start.py --rounds 7
    python benchmarks/bench_cli_start.py --baseline /tmp/base/src # also another source tree, same run

CPU time, not wall time: the user + system seconds of the command's process (resource.getrusage of
RUSAGE_CHILDREN, before and after each child), so a machine shared with other jobs inflates it far less
than a stopwatch. The median of --rounds runs of each command; the first run of each is discarded (it
fills the page cache and writes the bytecode cache, kept under the temporary folder by PYTHONPYCACHEPREFIX:
a run with PYTHONDONTWRITEBYTECODE would compile every module on every start).

With --baseline SRC the same commands also run with SRC first on PYTHONPATH (a checkout's `src` folder,
e.g. main before a change; it must know the demo database's migrations, or its commands fail: see the
exit codes): each round runs the baseline's command, then this one's, so both see the same load on the
machine; the table gets columns per tree. "this" is whatever `harness` the environment imports
(PYTHONPATH as given).

Set-up, not measured: `harness demo` in a new folder (a database with Runs, one waiting for a support
lead). Then each command on that database. Commands that decide about or act on something name one that
does not exist (`approve`, `reject`, `cancel`): they are refused with exit 2 after the command has built
all it needs to decide, so the figure is its start without the decision's own work. `run --json` and
`replay` are measured whole: a Run of the scripted model, start to end, and the replay of the demo's
first Run. `serve` is measured from its start until it answers /livez (its CPU read from /proc, then it is
stopped).
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
from typing import Any

#: a request or Run id that no database holds
NOBODY = "01a00000-0000-7000-8000-000000000000"


def cpu_of(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    """(user + system CPU seconds, exit code) of one `harness ARGS` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd, env=env, capture_output=True,
                          check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def serve_cpu(cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    """(user + system CPU seconds until it answers /livez, exit code) of one `harness serve`: started on a free
    port, measured as soon as it answers (from /proc), then stopped. Exit code 0 when it answered in 60 s."""
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "serve", "--port", str(port)], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=1):
                    break
            except OSError:
                time.sleep(0.01)
        else:
            return float("nan"), proc.poll() or 1
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 0
    finally:
        proc.terminate()
        proc.wait(30)


def commands_for(run_id: str) -> dict[str, list[str]]:
    """Each measured command line (its name in the table) and its arguments."""
    return {
        "harness --help": ["--help"],
        "harness run TASK --json": ["run", "Where is my order 1001?", "--json"],
        "harness runs show RUN_ID --json": ["runs", "show", run_id, "--json"],
        "harness trace RUN_ID --json": ["trace", run_id, "--json"],
        "harness approve REQUEST --as carol": ["approve", NOBODY, "--as", "carol"],
        "harness reject REQUEST --as carol": ["reject", NOBODY, "--as", "carol"],
        "harness approvals --json": ["approvals", "--json"],
        "harness cancel RUN_ID": ["cancel", NOBODY],
        "harness skills list --json": ["skills", "list", "--json"],
        "harness audit verify --json": ["audit", "verify", "--json"],
        "harness costs --json": ["costs", "--json"],
        "harness webhooks list --json": ["webhooks", "list", "--json"],
        "harness kb list --json": ["kb", "list", "--json"],
        "harness sweep --json": ["sweep", "--json"],
        "harness replay RUN_ID --json": ["replay", run_id, "--json"],
        "harness serve (until /livez answers)": ["serve"],
    }


def summary(samples: list[float], codes: set[int]) -> dict[str, Any]:
    """Median, min and max of the samples after the first (the warm-up), and the exit codes seen."""
    kept = samples[1:]
    return {"median_cpu_s": round(statistics.median(kept), 3), "min_cpu_s": round(min(kept), 3),
            "max_cpu_s": round(max(kept), 3), "exit_codes": sorted(codes)}


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--baseline", type=Path, help="another source tree to measure in the same run")
    parser.add_argument("--only", action="append", default=[], help="only commands whose name contains this")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        # bytecode cached as in any installation (in a folder of its own: the source tree is left alone)
        env = {**{k: v for k, v in os.environ.items()
                  if not k.startswith("HARNESS_") and k != "PYTHONDONTWRITEBYTECODE"},
               "PYTHONPYCACHEPREFIX": str(cwd / "pycache"),
               "HARNESS_DATA_DIR": str(cwd / "data"), "HARNESS_CHECKPOINT_KEY_DIR": str(cwd / "keys")}
        trees = {"this": env}
        if options.baseline is not None:
            path = [str(options.baseline.resolve()), *filter(None, [env.get("PYTHONPATH")])]
            trees = {"baseline": {**env, "PYTHONPATH": os.pathsep.join(path)}, "this": env}
        demo = subprocess.run([sys.executable, "-m", "harness.cli", "demo"], cwd=cwd, env=env, capture_output=True,
                              text=True, check=True)
        run_id = re.findall(r"run ([0-9a-f-]{36})  SUCCEEDED", demo.stdout)[0]
        results: dict[str, dict[str, dict[str, Any]]] = {}
        for name, args in commands_for(run_id).items():
            if options.only and not any(o in name for o in options.only):
                continue
            samples: dict[str, list[float]] = {t: [] for t in trees}
            codes: dict[str, set[int]] = {t: set() for t in trees}
            for _ in range(options.rounds + 1):
                for tree, tree_env in trees.items():
                    cpu, code = serve_cpu(cwd, tree_env) if args == ["serve"] else cpu_of(args, cwd, tree_env)
                    samples[tree].append(cpu)
                    codes[tree].add(code)
            results[name] = {t: summary(samples[t], codes[t]) for t in trees}
    if options.json:
        print(json.dumps({"rounds": options.rounds, "commands": results}, indent=2))
        return
    print_table(results, list(trees), options.rounds)


def print_table(results: dict[str, dict[str, dict[str, Any]]], trees: list[str], rounds: int) -> None:
    """One row per command: each tree's median CPU seconds (min-max) and exit codes."""
    print(f"| command | {' | '.join(f'{t}: CPU s, median of {rounds} (min-max) | exit' for t in trees)} |")
    print(f"| --- | {' | '.join('---: | ---' for _ in trees)} |")
    for name, by_tree in results.items():
        cells = [f"{r['median_cpu_s']:.2f} ({r['min_cpu_s']:.2f}-{r['max_cpu_s']:.2f}) | "
                 f"{','.join(map(str, r['exit_codes']))}" for r in by_tree.values()]
        print(f"| `{name}` | {' | '.join(cells)} |")

if __name__ == "__main__":
    main()
