"""Where a machine's cores go while a command runs: CPU time per kind of process (Celery workers, the
PostgreSQL server, the benchmark driver, anything else by its name), sampled from /proc once a second and
summed over the middle half of the run (start-up and wind-down left out).

    python benchmarks/cpu_share.py python benchmarks/bench_workers.py --runs 1000 --warmup 10 --workers 1

Linux only (it reads /proc). A process is counted from its second sample on, so one that lives less than
a second is missed: the workers, the server's backends and the driver all live through the run.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def _kind(comm: str, cmdline: str) -> str:
    if "celery" in cmdline:
        return "celery workers"
    if "bench_workers" in cmdline:
        return "benchmark driver"
    if comm.startswith("postgres"):  # the server and its backends (a client's URL names it too)
        return "postgresql"
    return comm


def snapshot() -> dict[str, tuple[str, float]]:
    """Every process's kind and CPU seconds so far (user + system)."""
    now = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        now[pid] = (_kind(comm, cmdline), (int(fields[11]) + int(fields[12])) / TICK)
    return now


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last: tuple[float, dict[str, tuple[str, float]]] | None = None
    samples: list[tuple[float, dict[str, float]]] = []
    while proc.poll() is None:
        now, at = snapshot(), time.monotonic()
        if last is not None:
            per: dict[str, float] = collections.defaultdict(float)
            for pid, (kind, cpu) in now.items():
                if pid in last[1]:
                    per[kind] += cpu - last[1][pid][1]
            samples.append((at - last[0], per))
        last = (at, now)
        time.sleep(1.0)
    assert proc.stdout is not None
    print(proc.stdout.read().rstrip())
    middle = samples[len(samples) // 4: len(samples) * 3 // 4]
    wall = sum(w for w, _ in middle)
    if not wall:
        raise SystemExit("the command ended too soon to sample")
    total: dict[str, float] = collections.defaultdict(float)
    for _, per in middle:
        for kind, cpu in per.items():
            total[kind] += cpu
    print(f"the middle {wall:.1f} s of {len(samples)}: {sum(total.values()) / wall:.2f} cores busy")
    for kind, cpu in sorted(total.items(), key=lambda item: -item[1])[:6]:
        print(f"  {kind:20s} {cpu / wall:.2f} cores")
    if proc.returncode:
        raise SystemExit(proc.returncode)


if __name__ == "__main__":
    main()
