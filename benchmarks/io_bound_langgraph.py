"""The LangGraph contender of bench_io_bound.py (issue 37), in a process of its own.

plan node -> tool node -> answer node: the model nodes call the fake OpenAI-compatible server with
httpx.AsyncClient (no connection limit) and send what harness sends it (the agent's instructions, the skill as a
tool, the results for the answer); the tool node reads the support example's orders, as `orders.lookup` does.
N `graph.ainvoke` at once under `asyncio.gather`, with AsyncPostgresSaver over a psycopg pool (AsyncSqliteSaver
on SQLite). The parent (`run_langgraph`) starts this file, waits for "ready", samples the process while it
drives the Runs after "go", and reads the result from its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vs_langgraph import _fresh_database, _libpq
from fake_openai_server import RESULTS_MARK
from io_bound_common import MODEL, PG_SERVER, Database, Sampler, process, reason, server_stats, task


def langgraph_child(runs: int, origin: str, db_url: str, pool: int) -> None:
    """The LangGraph contender's process: build, say "ready", wait for "go", drive N `ainvoke` at once, print
    the result as one JSON line."""
    asyncio.run(_langgraph(runs, origin, db_url, pool))


def _example_data() -> tuple[str, Path]:
    """The support example's instructions and orders, found without importing harness (so that LangGraph's
    process holds only what it needs)."""
    import importlib.util

    spec = importlib.util.find_spec("harness")
    assert spec is not None and spec.origin is not None
    example = Path(spec.origin).parent / "examples" / "support"
    return (example / "agent.yaml").read_text(encoding="utf-8"), example / "orders.json"


def _graph(origin: str, client: Any) -> Any:
    """plan -> tool -> answer: the model nodes ask the fake server what harness asks it."""
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    system, orders = _example_data()
    tool = {"type": "function", "function": {
        "name": "orders_lookup", "description": "Look up an order by its id (read-only).",
        "parameters": {"type": "object", "required": ["order_id"], "additionalProperties": False,
                       "properties": {"order_id": {"type": "string", "pattern": r"^[A-Z]-\d{4}$"}}}}}

    class State(TypedDict, total=False):
        task: str
        plan: dict[str, Any]
        outputs: dict[str, Any]
        answer: str

    async def chat(messages: list[dict[str, str]], **extra: Any) -> str:
        answer = await client.post("/chat/completions", json={"model": MODEL, "messages": messages,
                                                              "temperature": 0, "max_tokens": 1024, **extra})
        answer.raise_for_status()
        return str(answer.json()["choices"][0]["message"]["content"])

    async def plan(state: State) -> State:
        content = await chat([{"role": "system", "content": system}, {"role": "user", "content": state["task"]}],
                             tools=[tool], tool_choice="none",
                             response_format={"type": "json_schema", "json_schema": {"name": "plan", "schema": {}}})
        return {"plan": json.loads(content)}

    def act(state: State) -> State:  # a plain function: LangGraph runs it on its executor, as harness a skill
        table = json.loads(orders.read_text(encoding="utf-8"))
        return {"outputs": {s["output_key"]: dict(table[s["tool_call"]["arguments"]["order_id"]])
                            for s in state["plan"]["steps"]}}

    async def answer(state: State) -> State:
        results = json.dumps(state["outputs"], sort_keys=True, ensure_ascii=False)
        return {"answer": await chat([{"role": "system", "content": system}, {"role": "user", "content": state["task"]},
                                      {"role": "user", "content": f"{RESULTS_MARK}\n{results}"}])}

    graph = StateGraph(State)
    for name, node in (("plan", plan), ("act", act), ("answer", answer)):
        graph.add_node(name, node)
    for a, b in ((START, "plan"), ("plan", "act"), ("act", "answer"), ("answer", END)):
        graph.add_edge(a, b)
    return graph


@contextlib.asynccontextmanager
async def _checkpointer(db_url: str, pool: int) -> Any:
    if db_url.startswith("postgresql"):
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        async with AsyncConnectionPool(_libpq(db_url), max_size=pool, open=False, kwargs={
                "autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}) as connections:
            saver = AsyncPostgresSaver(connections)  # type: ignore[arg-type]
            await saver.setup()
            yield saver
    else:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(db_url) as saver:
            yield saver


async def _langgraph(runs: int, origin: str, db_url: str, pool: int) -> None:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=f"{origin}/v1", limits=limits, timeout=60, trust_env=False) as client, \
            _checkpointer(db_url, pool) as saver:
        app = _graph(origin, client).compile(checkpointer=saver)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        live, peak, failed = [0], [0], collections.Counter[str]()

        async def one(i: int) -> bool:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            try:
                out = await app.ainvoke({"task": task(i)}, {"configurable": {"thread_id": f"run-{i}"}})
                if not out.get("answer"):
                    failed["no answer"] += 1
                return bool(out.get("answer"))
            except Exception as exc:  # a failed Run is counted by its reason
                failed[reason(f"{type(exc).__name__}: {exc}")] += 1
                return False
            finally:
                live[0] -= 1

        started = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(runs)))
        wall = time.perf_counter() - started
    print(json.dumps({"wall_s": wall, "succeeded": sum(done), "failed_by_reason": dict(failed),
                      "peak_runs_driven": peak[0]}), flush=True)


def run_langgraph(runs: int, origin: str, limit_s: float, backend: str, pool: int) -> dict[str, Any]:
    """The LangGraph contender in a process of its own on a fresh database."""
    with tempfile.TemporaryDirectory(prefix="bench-io-") as tmp, _fresh_database(backend, PG_SERVER) as pg:
        folder = Path(tmp)
        db_url = pg or str(folder / "langgraph.db")
        argv = [sys.executable, __file__, "--runs", str(runs), "--origin", origin, "--db-url", db_url,
                "--pool", str(pool)]
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
        with process(argv, env=env, cwd=tmp, log=folder / "langgraph.log", stdin=subprocess.PIPE) as child:
            assert child.stdin is not None and child.stdout is not None
            if _line(child, time.monotonic() + 120) != "ready":
                raise RuntimeError(f"LangGraph did not start: {(folder / 'langgraph.log').read_text()[-2000:]}")
            db = Database(db_url) if pg else None
            try:
                server_stats(origin, reset=True)
                with Sampler([child.pid], db, time.time()) as sampler:
                    child.stdin.write("go\n")
                    child.stdin.flush()
                    line = _line(child, time.monotonic() + limit_s)
            finally:
                if db is not None:
                    db.close()
            if not line.startswith("{"):
                raise RuntimeError(f"LangGraph gave no result: {(folder / 'langgraph.log').read_text()[-2000:]}")
        raw = json.loads(line)
    stats, used = server_stats(origin), sampler.report()
    return {"contender": "langgraph", "runs": runs, "wall_s": raw["wall_s"], "runs_per_s": runs / raw["wall_s"],
            "succeeded": raw["succeeded"], "failures": runs - raw["succeeded"],
            "failed_by_reason": raw["failed_by_reason"], "all_final": True,
            "peak_model_calls": stats["peak_in_flight"], "model_calls": stats["calls"],
            "peak_runs_driven": raw["peak_runs_driven"], **used, "cpu_s_per_run": used["cpu_s"] / runs,
            "db_cpu_s_per_run": None if used["db_cpu_s"] is None else used["db_cpu_s"] / runs,
            "checkpointer": "AsyncPostgresSaver" if pg else "AsyncSqliteSaver", "pool": pool}


def _line(proc: subprocess.Popen[str], deadline: float) -> str:
    """The child's next line of output, or "" at the deadline (read in a thread, so the wait is bounded)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    return got[0].strip() if got else ""


def main() -> None:
    """The child's command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--origin", required=True, help="the fake model server")
    parser.add_argument("--db-url", required=True, help="PostgreSQL URL, or a SQLite file")
    parser.add_argument("--pool", type=int, default=10, help="the psycopg pool's max size")
    args = parser.parse_args()
    langgraph_child(args.runs, args.origin, args.db_url, args.pool)


if __name__ == "__main__":
    main()
