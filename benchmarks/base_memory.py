"""Base memory and start time of each entry point: what a process costs before it does any work.

    python benchmarks/base_memory.py            # a Markdown table
    python benchmarks/base_memory.py --json     # one JSON document
    python benchmarks/base_memory.py --only serve --rounds 5 --top 20

For each entry point: the wall-clock start time (median of --rounds), VmRSS and PSS (from
/proc/<pid>/status and /proc/<pid>/smaps_rollup, medians too) and the modules that cost the most import
time (one extra run under `python -X importtime`, cumulative microseconds).

- `harness --help`, and `harness approvals --json` on a fresh SQLite file (a read-only command that builds
  the whole runtime, migrating the new file first): start time is the whole command; memory is read by
  the process itself as it exits (an atexit hook in a small launcher), so it is the command's memory
  after its work.
- `harness serve` on a fresh SQLite file (it migrates it first), and on one created and migrated
  beforehand (as a restarted deployment finds it): start time is until /health answers; memory is read
  from /proc once it has idled for --idle seconds.
- a Celery worker (`celery -A harness.celery_app:app worker --pool=solo`, broker HARNESS_BROKER_URL or
  redis://127.0.0.1:6379/0): start time is until the worker logs "ready"; memory as for serve. Skipped,
  with the reason, when the broker does not answer (`bash scripts/services.sh` starts Redis).

Linux only (it reads /proc). The machine may be shared: every figure is a median.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

PYTHON = sys.executable
BIN = Path(PYTHON).parent
HARNESS = str(BIN / "harness") if (BIN / "harness").exists() else shutil.which("harness") or "harness"
CELERY = str(BIN / "celery") if (BIN / "celery").exists() else shutil.which("celery") or "celery"

#: creates and migrates the database the environment names
MIGRATE = "from harness.stores import open_store; open_store().close()"
#: run inside the measured process: the harness CLI, then its own memory written where the caller said
LAUNCHER = """
import atexit, os, sys
def _dump():
    with open(os.environ["BASE_MEMORY_OUT"], "w") as out:
        out.write(open("/proc/self/status").read())
        out.write(open("/proc/self/smaps_rollup").read())
atexit.register(_dump)
sys.argv = ["harness", *sys.argv[1:]]
from harness.cli import main
main()
"""


@dataclass
class Result:
    """One entry point's figures (medians), or why it was skipped."""

    name: str
    command: str
    start_s: float | None = None
    rss_mb: float | None = None
    pss_mb: float | None = None
    top_imports: list[tuple[str, float]] = field(default_factory=list)
    skipped: str | None = None


def memory_of(text: str) -> tuple[float, float]:
    """VmRSS and Pss (MB) from the text of /proc/<pid>/status followed by smaps_rollup."""
    rss = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    pss = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return (int(rss.group(1)) / 1024 if rss else 0.0), (int(pss.group(1)) / 1024 if pss else 0.0)


def read_proc(pid: int) -> str:
    """/proc/<pid>/status and smaps_rollup, one after the other."""
    return Path(f"/proc/{pid}/status").read_text() + Path(f"/proc/{pid}/smaps_rollup").read_text()


def top_imports(stderr: str, top: int) -> list[tuple[str, float]]:
    """The modules with the largest cumulative import time (ms) in `python -X importtime` output."""
    rows: list[tuple[str, float]] = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((m.group(4), int(m.group(2)) / 1000))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_env(workdir: Path) -> dict[str, str]:
    """The environment of one measured process: a fresh SQLite file and data directory of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    if "HARNESS_BROKER_URL" in os.environ:
        env["HARNESS_BROKER_URL"] = os.environ["HARNESS_BROKER_URL"]
    env["HARNESS_DATABASE_URL"] = str(workdir / "harness.sqlite")
    env["HARNESS_DATA_DIR"] = str(workdir / "data")
    return env


def short_command(name: str, args: list[str], rounds: int, top: int) -> Result:
    """A command that runs and exits: start time is its whole run, memory what it holds as it exits."""
    starts, rss, pss = [], [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            env = fresh_env(Path(tmp))
            at = time.perf_counter()
            subprocess.run([HARNESS, *args], env=env, cwd=tmp, capture_output=True, check=True)
            starts.append(time.perf_counter() - at)
        with tempfile.TemporaryDirectory() as tmp:
            env = fresh_env(Path(tmp)) | {"BASE_MEMORY_OUT": str(Path(tmp) / "memory.txt")}
            subprocess.run([PYTHON, "-c", LAUNCHER, *args], env=env, cwd=tmp, capture_output=True, check=True)
            r, p = memory_of((Path(tmp) / "memory.txt").read_text())
            rss.append(r)
            pss.append(p)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([PYTHON, "-X", "importtime", "-c", LAUNCHER, *args], env=fresh_env(Path(tmp)),
                              cwd=tmp, capture_output=True, text=True, check=True)
    return Result(name, "harness " + " ".join(args), statistics.median(starts), statistics.median(rss),
                  statistics.median(pss), top_imports(done.stderr, top))


def server(name: str, command: Callable[[Path], list[str]], ready: Callable[[Path, Path], bool], *,
           rounds: int, idle_s: float, top: int, timeout_s: float = 60.0, migrated: bool = False) -> Result:
    """A long-lived process: start time is until `ready` says so, memory is read after `idle_s` of idling
    (`migrated`: on a database created and migrated beforehand, as a restarted deployment finds it)."""
    starts, rss, pss = [], [], []
    imports: list[tuple[str, float]] = []
    for i in range(rounds + 1):  # the last round runs under -X importtime and only gives the imports
        timed = i < rounds
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            argv = command(workdir)
            env = fresh_env(workdir)
            if not timed:
                env["PYTHONPROFILEIMPORTTIME"] = "1"
            log = workdir / "log.txt"
            if migrated:
                subprocess.run([PYTHON, "-c", MIGRATE], env=fresh_env(workdir), cwd=tmp, check=True)
            with log.open("w") as out:
                at = time.perf_counter()
                proc = subprocess.Popen(argv, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT)
                try:
                    while not ready(workdir, log):
                        if proc.poll() is not None:
                            raise RuntimeError(f"{name} exited {proc.returncode}: {log.read_text()[-2000:]}")
                        if time.perf_counter() - at > timeout_s:
                            raise RuntimeError(f"{name} not ready after {timeout_s} s: {log.read_text()[-2000:]}")
                        time.sleep(0.02)
                    started = time.perf_counter() - at
                    time.sleep(idle_s)
                    text = read_proc(proc.pid)
                finally:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            if timed:
                starts.append(started)
                r, p = memory_of(text)
                rss.append(r)
                pss.append(p)
            else:
                imports = top_imports(log.read_text(), top)
    return Result(name, " ".join(Path(a).name if i == 0 else a for i, a in enumerate(command(Path("<tmp>")))),
                  statistics.median(starts), statistics.median(rss), statistics.median(pss), imports)


def measure_serve(rounds: int, idle_s: float, top: int, *, migrated: bool = False) -> Result:
    port = free_port()

    def ready(_workdir: Path, _log: Path) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                return bool(r.status)
        except urllib.error.HTTPError:  # it answers (401 without a token): it has started
            return True
        except OSError:
            return False

    name = "harness serve (idle, migrated DB)" if migrated else "harness serve (idle)"
    return server(name, lambda _w: [HARNESS, "serve", "--port", str(port)], ready,
                  rounds=rounds, idle_s=idle_s, top=top, migrated=migrated)


def broker_down() -> str | None:
    """Why the Celery broker cannot be reached, or None."""
    url = os.environ.get("HARNESS_BROKER_URL", "redis://127.0.0.1:6379/0")
    m = re.match(r"\w+://(?:[^@/]*@)?([^:/]+)(?::(\d+))?", url)
    if m is None:
        return f"cannot read the broker URL {url!r}"
    host, port = m.group(1), int(m.group(2) or 6379)
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError as exc:
        return f"broker {host}:{port} does not answer ({exc}); bash scripts/services.sh starts Redis"
    return None


def measure_celery(rounds: int, idle_s: float, top: int) -> Result:
    command = "celery -A harness.celery_app:app worker --pool=solo"
    reason = broker_down()
    if reason is None:
        try:
            import celery  # noqa: F401  (only whether it is installed)
        except ImportError:
            reason = "celery is not installed (the scale extra)"
    if reason is not None:
        return Result("Celery worker (idle)", command, skipped=reason)

    def argv(workdir: Path) -> list[str]:
        return [CELERY, "-A", "harness.celery_app:app", "worker", "--pool=solo", "--loglevel=INFO",
                "--without-mingle", "--without-gossip", "-n", f"base-memory-{workdir.name}@%h"]

    return server("Celery worker (idle)", argv, lambda _w, log: " ready." in log.read_text(),
                  rounds=rounds, idle_s=idle_s, top=top)


#: what `harness serve` loads, in the order it loads it, one step at a time (VmRSS after each step)
BREAKDOWN = """
import re, sys, json
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
steps, last = [], 0.0
def step(name):
    global last
    now = rss()
    steps.append((name, round(now - last, 1)))
    last = now
step("the interpreter")
import typer, rich.console; step("typer, rich, click (the CLI's framework)")
import harness.cli; step("harness.cli (the commands, the domain models: pydantic, yaml)")
import uvicorn; step("uvicorn")
import sqlalchemy, sqlalchemy.orm; step("sqlalchemy")
import cryptography.hazmat.primitives.serialization; step("cryptography (checkpoint signatures)")
import cedarpy; step("cedarpy (the policy)")
import jsonschema; step("jsonschema (skill arguments)")
import harness.config; step("harness.config (the rest of the composition root)")
import fastapi; step("fastapi, starlette")
import prometheus_client, jinja2, opentelemetry.sdk.trace; step("prometheus_client, jinja2, opentelemetry sdk")
import harness.service.app; step("harness.service (the rest)")
from harness.config import Settings, build_runtime
rt = build_runtime(Settings.from_env()); step("build_runtime (skills, policy, store, pools)")
from bpe_openai import _bindings; step("bpe_openai import (the tokenizer's vocabularies)")
rt.runs.assembler.warm(); step("the cl100k encoding, loaded by warm()")
from harness.service.app import create_app
from harness.service.settings import ServiceSettings
create_app(rt, ServiceSettings.from_env()); step("create_app")
print(json.dumps({"steps": steps, "total": round(last, 1), "modules": len(sys.modules)}))
"""


def breakdown() -> dict[str, object]:
    """Where the memory of `harness serve` goes, step by step, on a migrated database (one run)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = fresh_env(Path(tmp))
        subprocess.run([PYTHON, "-c", MIGRATE], env=env, cwd=tmp, check=True)
        done = subprocess.run([PYTHON, "-c", BREAKDOWN], env=env, cwd=tmp, capture_output=True, text=True,
                              check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


ENTRIES: dict[str, Callable[[argparse.Namespace], Result]] = {
    "help": lambda a: short_command("harness --help", ["--help"], a.rounds, a.top),
    "approvals": lambda a: short_command("harness approvals --json", ["approvals", "--json"], a.rounds, a.top),
    "serve": lambda a: measure_serve(a.rounds, a.idle, a.top),
    "serve-migrated": lambda a: measure_serve(a.rounds, a.idle, a.top, migrated=True),
    "celery": lambda a: measure_celery(a.rounds, a.idle, a.top),
}


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(results: list[Result]) -> str:
    lines = ["| entry point | start (s) | VmRSS (MB) | PSS (MB) |", "|---|---:|---:|---:|"]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.name} | skipped: {r.skipped} | | |")
        else:
            lines.append(f"| {r.name} | {fmt(r.start_s, '.2f')} | {fmt(r.rss_mb, '.0f')} | {fmt(r.pss_mb, '.0f')} |")
    for r in results:
        if r.top_imports:
            lines += ["", f"Top imports of `{r.name}` (cumulative ms, one run under -X importtime):", ""]
            lines.append(", ".join(f"{name} {ms:.0f}" for name, ms in r.top_imports))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--rounds", type=int, default=3, help="runs per entry point (the median is reported)")
    parser.add_argument("--idle", type=float, default=2.0, help="seconds a server idles before it is measured")
    parser.add_argument("--top", type=int, default=12, help="how many modules to list by import time")
    parser.add_argument("--only", action="append", choices=sorted(ENTRIES), help="measure only these (repeatable)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also show where the memory of harness serve goes, one import step at a time")
    args = parser.parse_args()
    results = [ENTRIES[name](args) for name in (args.only or list(ENTRIES))]
    steps = breakdown() if args.breakdown else None
    if args.json:
        print(json.dumps({"results": [asdict(r) for r in results], "breakdown": steps}, indent=2))
        return
    print(markdown(results))
    if steps is not None:
        print("\nWhere the memory of `harness serve` goes (VmRSS added by each step, one run, migrated DB):\n")
        print("| step | MB |\n|---|---:|")
        for name, mb in steps["steps"]:  # type: ignore[attr-defined]
            print(f"| {name} | {mb:.1f} |")
        print(f"| **total** | **{steps['total']:.0f}** |")


if __name__ == "__main__":
    main()
