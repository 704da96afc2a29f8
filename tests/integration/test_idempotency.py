"""Idempotency keys are scoped per (tenant, user) and bound to the request body (SPEC K5, G4), on SQLite,
PostgreSQL and MariaDB, with several OS processes submitting the same keys at once."""

from __future__ import annotations

import json
import multiprocessing as mp
import traceback
from pathlib import Path
from typing import Any

import pytest

from harness.adapters.sql.store import SqlStore
from harness.domain.errors import IdempotencyConflictError
from harness.domain.records import NewRun

from .test_races import assert_runs_consistent, start_forked

pytestmark = pytest.mark.slow
KEYS = 12
#: (user, body hash) of each racing process: alice sends two different bodies, bob reuses her keys
SUBMITTERS = [("alice", "a" * 64), ("alice", "a" * 64), ("alice", "b" * 64), ("bob", "a" * 64)]


def _submitter(job: dict[str, Any], start: Any) -> None:
    """One process: submit every key once, as its user with its body, once all are ready."""
    store = SqlStore.open(job["db"], migrate_schema=False)
    outcomes: dict[str, list[Any]] = {}
    errors: list[str] = []
    start.wait()
    for i in range(KEYS):
        key = f"key-{i}"
        try:
            run, created = store.create_run(NewRun("acme", job["user"], "s1", {"task": f"{job['body']} {i}"},
                                                   idempotency_key=key, request_hash=job["body"]))
            outcomes[key] = ["run", run.run_id, created, run.user_id]
        except IdempotencyConflictError as exc:
            outcomes[key] = ["conflict", exc.run_id, str(exc)]
        except Exception:
            errors.append(traceback.format_exc())
    store.close()
    Path(job["out"]).write_text(json.dumps({"outcomes": outcomes, "errors": errors}))


def test_racing_submits_create_one_run_per_user_and_key_and_refuse_other_bodies(backend_url: str,
                                                                                 tmp_path: Path) -> None:
    """For each key: alice gets exactly one Run, which both of her same-body submitters receive; her
    other body gets a conflict naming that Run; bob, reusing the key, gets a Run of his own."""
    store = SqlStore.open(backend_url)
    ctx = mp.get_context("fork")
    start = ctx.Barrier(len(SUBMITTERS))
    outs = [tmp_path / f"submitter-{n}.json" for n in range(len(SUBMITTERS))]
    workers = [ctx.Process(target=_submitter, args=({"db": backend_url, "user": user, "body": body,
                                                     "out": str(out)}, start))
               for (user, body), out in zip(SUBMITTERS, outs, strict=True)]
    start_forked(store, *workers)
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0] * len(workers)
    reports = [json.loads(out.read_text()) for out in outs]
    assert [r["errors"] for r in reports] == [[]] * len(reports), reports
    for i in range(KEYS):
        key = f"key-{i}"
        alice = [r["outcomes"][key] for r in reports[:3]]
        runs = {o[1] for o in alice}
        assert len(runs) == 1, alice  # the conflict names the very Run the key belongs to
        winner = store.find_by_idempotency_key("acme", "alice", key)
        assert winner is not None and winner.run_id in runs
        won_with = "a" * 64 if winner.request["task"].startswith("a") else "b" * 64
        for (_, body), outcome in zip(SUBMITTERS[:3], alice, strict=True):
            assert outcome[0] == ("run" if body == won_with else "conflict"), (key, outcome)
        assert sum(1 for o in alice if o[0] == "run" and o[2]) == 1  # exactly one created it
        bob = reports[3]["outcomes"][key]
        assert bob[0] == "run" and bob[2] is True and bob[3] == "bob" and bob[1] != winner.run_id
    assert len(store.list_runs(tenant_id="acme", limit=10 * KEYS)) == 2 * KEYS
    assert_runs_consistent(store)
    store.close()
