"""`harness demo`: the bundled support example's scenarios, planned by the scripted model or by a real small
model on this machine.

With the scripted model every scenario runs against every skill of the example, as the example's rules
plan it. A model of 135 M parameters cannot pick among seven skills (offered all of them, SmolLM2-135M
called `customers.lookup` with junk in every scenario), so `--llm local` offers each scenario only the
skill it needs, says what it expected and what happened, and ends with a total (docs/local-model.md has
what SmolLM2-135M makes of them: 2 of 5).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.runs import print_result, result_document
from harness.cli.support import DbOption, JsonOption, emit, fail

if TYPE_CHECKING:
    from harness.domain.contracts import RunResult
    from harness.operations import Operations
    from harness.settings import Settings

#: the demo's Runs: (what it shows, task, who asks, who decides an approval at once — None: leave it waiting)
DEMO_SCENARIOS = (
    ("success", "Where is order A-1001?", "alice", None),
    ("a chat turn (no tools)", "Hi, what can you do?", "alice", None),
    ("two rounds (look the order up, then decide from what was found)", "Refund order A-1004 if it was delivered",
     "alice", None),
    ("approval (L2, self-confirm)", "Refund 42.50 EUR for order A-1001", "alice", "alice"),
    ("approval (L3, a support lead decides)", "Refund 180 EUR for order A-1003", "alice", None),
    ("policy rejection", "Refund 900 EUR for order A-1002", "alice", None),
    ("skill failure", "Where is order A-9999?", "alice", None),
    ("invalid plan from the model", "Write me a poem about refunds", "alice", None),
)


@dataclass(frozen=True)
class LocalScenario:
    """A scenario a small model can do: the one skill offered, and the state the Run should reach."""

    label: str
    task: str
    skill: str  # the manifest file offered (the example's skills folder)
    expected: str
    decider: str | None = None  # who approves at once, when the Run parks for approval


#: what `--llm local` asks of the model, one skill offered each time
LOCAL_SCENARIOS = (
    LocalScenario("an order looked up", "Where is order A-1001?", "orders_lookup.yaml", "SUCCEEDED"),
    LocalScenario("a customer looked up", "Who is customer C-17?", "customers_lookup.yaml", "SUCCEEDED"),
    LocalScenario("a refund parked for approval (L2), then confirmed", "Refund 42.50 EUR for order A-1001",
                  "refunds_issue.yaml", "SUCCEEDED", decider="alice"),
    LocalScenario("a refund over the cap, rejected by policy", "Refund 900 EUR for order A-1002",
                  "refunds_issue.yaml", "CLOSED_REJECTED"),
    LocalScenario("an order that does not exist: the skill fails", "Where is order A-9999?", "orders_lookup.yaml",
                  "CLOSED_FAILED"),
)

DemoLlm = Annotated[str, typer.Option(
    "--llm", help="Who plans: 'scripted' (the example's rules) or 'local' (SmolLM2 on this machine through "
                  "llama-cpp-python's server, started for the demo unless HARNESS_LLM_BASE_URL names one; "
                  "HARNESS_LOCAL_MODEL_PATH serves another GGUF model). With 'local' each scenario is offered "
                  "only the skill it needs, and the demo prints whether each came out as expected.")]


def demo(db: DbOption = None, json_: JsonOption = False, llm: DemoLlm = "scripted") -> None:
    """Run the bundled support example: a success, a chat turn, a Run that plans in two rounds, two
    approvals (one left waiting for a support lead), a policy rejection and two failures. With
    --llm local: five scenarios a small model can plan, one skill offered each, with a pass/fail line each
    and a total (exit 1 when any scenario did not come out as expected)."""
    if llm not in ("scripted", "local"):
        fail(f"--llm must be scripted or local, not {llm!r}")
    from harness.operations import Operations
    from harness.settings import Settings

    if llm == "scripted":
        # the default database, so `harness serve` afterwards shows these Runs
        _demo(Operations.open(Settings.from_env(db=db)), json_)
        return
    base_url = os.environ.get("HARNESS_LLM_BASE_URL")
    if base_url:
        passed = _local_demo(Settings.from_env(db=db, llm="local", llm_base_url=base_url), json_)
    else:
        from harness.local_model import LocalModelServer

        if not json_:
            typer.echo("starting the local model server (llama-cpp-python) ...")
        with LocalModelServer() as server:
            passed = _local_demo(Settings.from_env(db=db, llm="local", llm_base_url=server.base_url), json_)
    if not passed:
        raise typer.Exit(1)


def _demo(ops: Operations, json_: bool) -> None:
    from harness.examples.support import HANDBOOK_KB, handbook_files

    ops.warm()  # the vocabulary loads before the Run, not inside its step 2
    if ops.knowledge is not None:  # the refund answers cite it (a file already there is not stored again)
        ops.knowledge.add_files(handbook_files(), tenant_id="default", kb=HANDBOOK_KB)
        if not json_:
            typer.echo(f"the policy handbook is in the knowledge base {HANDBOOK_KB!r}: harness kb list --kb "
                       f"{HANDBOOK_KB}")
    out, waiting = [], []
    for label, task, user, decider in DEMO_SCENARIOS:
        if not json_:
            typer.echo(f"\n== {label}: {task!r}")
        result = ops.create_run({"task": task, "user_id": user})  # roles: from the identity directory
        if result.approval_request_id and decider is not None:
            if not json_:
                print_result(result)
                typer.echo(f"  → {decider} confirms the refund: harness approve {result.approval_request_id} "
                           f"--as {decider}")
            _, result = ops.decide(result.approval_request_id, ops.identities.resolve(decider), "approve",
                                   reason="demo")
        elif result.approval_request_id:
            waiting.append(result)
        out.append({"scenario": label, "task": task, **result_document(ops, result)})
        if not json_:
            print_result(result)
    if json_:
        emit({"runs": out, "waiting": [{"run_id": r.run_id, "request_id": r.approval_request_id} for r in waiting]})
        return
    option = f" --db {ops.settings.db}" if ops.settings.db else ""
    for result in waiting:
        typer.echo(f"\nWaiting for a support lead: the refund of run {result.run_id}.\n"
                   "  In the console: `harness serve`, open http://127.0.0.1:8000/, sign in with demo-carol-key, "
                   "open Approvals and press Approve.\n"
                   f"  On the command line: harness approve {result.approval_request_id} --as carol "
                   f"--reason \"parcel lost\"{option}")
    typer.echo(f"\nInspect any Run with: harness runs show <run_id>{option} / harness trace <run_id>{option}\n"
               f"Verify the audit trail with: harness audit verify{option}")
    sys.stdout.flush()


def offering(folder: Path, skill: str) -> Path:
    """A copy of the example's skills folder in `folder` holding only `skill` (and the code and data the
    example's skills share); returns the skills folder to load."""
    from harness.examples.support import EXAMPLE_DIR

    skills = folder / "skills"
    skills.mkdir(parents=True)
    for data in ("orders.json", "customers.json"):
        shutil.copy(EXAMPLE_DIR / data, folder / data)
    for name in (skill, "support_skills.py"):
        shutil.copy(EXAMPLE_DIR / "skills" / name, skills / name)
    return skills


def _local_demo(settings: Settings, json_: bool) -> bool:
    """Each local scenario on a runtime offered its one skill; True when every one came out as expected."""
    from harness.operations import Operations

    out = []
    with tempfile.TemporaryDirectory(prefix="harness-local-demo-") as scratch:
        for number, scenario in enumerate(LOCAL_SCENARIOS, 1):
            skills = offering(Path(scratch) / str(number), scenario.skill)
            ops = Operations.open(settings.model_copy(update={"skills_dirs": (skills,)}))
            try:
                if not json_:
                    typer.echo(f"\n== {scenario.label}: {scenario.task!r} (offered: {scenario.skill[:-5]})")
                result = _run_local(ops, scenario, json_)
                ok = result.state == scenario.expected
                out.append({"scenario": scenario.label, "task": scenario.task, "expected": scenario.expected,
                            "passed": ok, **result_document(ops, result)})
                if not json_:
                    print_result(result)
                    verdict = "PASS" if ok else "FAIL"
                    typer.echo(f"  {verdict}: expected {scenario.expected}, got {result.state}")
            finally:
                ops.close()
    passed = sum(1 for doc in out if doc["passed"])
    if json_:
        emit({"runs": out, "passed": passed, "scenarios": len(out)})
    else:
        typer.echo(f"\n{passed} of {len(out)} scenarios came out as expected with the local model.")
        sys.stdout.flush()
    return passed == len(out)


def _run_local(ops: Operations, scenario: LocalScenario, json_: bool) -> RunResult:
    result = ops.create_run({"task": scenario.task, "user_id": "alice"})
    if result.approval_request_id and scenario.decider is not None:
        if not json_:
            print_result(result)
            typer.echo(f"  → {scenario.decider} confirms: harness approve {result.approval_request_id} "
                       f"--as {scenario.decider}")
        _, result = ops.decide(result.approval_request_id, ops.identities.resolve(scenario.decider), "approve",
                               reason="demo")
    return result
