"""`harness run`, `trace`, `cancel`, `approve`, `reject`, `approvals`: Runs as operators drive them (SPEC U1)."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from harness.cli.startup import kept_until_exit
from harness.cli.support import (
    DbOption,
    JsonOption,
    agent_reference,
    check_agent,
    emit,
    fail,
    screen,
    seconds_up_to,
)
from harness.domain.authority import check_may_cancel
from harness.kernel.states import FINAL, RunState
from harness.kernel.thresholds import MAX_DURATION_S
from harness.timefmt import deadline_reason, human, iso

if TYPE_CHECKING:
    from rich.tree import Tree

    from harness.domain.contracts import RunResult
    from harness.operations import Operations
    from harness.stores import SqlStore

Tenant = Annotated[str, typer.Option("--tenant", help="Tenant of the caller.")]
User = Annotated[str, typer.Option("--user", help="User id of the caller.")]
Session = Annotated[str, typer.Option("--session", help="Conversation session id.")]


def operations(db: str | None) -> Operations:
    """The operator's API for a CLI command, for the agent `harness --agent` or HARNESS_AGENT names
    (imported here: `harness --help` loads none of it)."""
    with kept_until_exit():  # imported and built with the collector paused (harness.cli.startup)
        from harness.operations import Operations
        from harness.settings import Settings

        return Operations.open(Settings.from_env(db=db, agent=agent_reference()))


def read_store(db: str | None) -> SqlStore:
    """The store alone, for a command that only reads it: no pipeline, policy, skills or model load. An
    agent named by `harness --agent` or HARNESS_AGENT is loaded all the same, so that a bad reference is
    named (exit 2) as by every command."""
    check_agent(agent_reference())
    with kept_until_exit():
        from harness.stores import open_store

        return open_store(db)


def result_document(ops: Operations, result: RunResult) -> dict[str, Any]:
    """The JSON a command prints for a Run's result: the Run's document, as `runs show --json` prints it."""
    from harness.cli.documents import run_document

    return run_document(ops.store, result.run_id)


def print_result(result: RunResult) -> None:
    """Human-readable result."""
    console = screen()
    colour = {"SUCCEEDED": "green", "AWAITING_HITL": "yellow"}.get(result.state, "red")
    console.print(f"[bold]run[/] {result.run_id}  [bold {colour}]{result.state}[/]", highlight=False)
    console.print("  path: " + " → ".join(result.path))
    if result.answer:
        console.print(f"  answer: {result.answer}", markup=False, highlight=False)
    if result.error:
        console.print(f"  reason: {result.error}", markup=False, highlight=False)
    if result.approval_request_id:
        console.print(f"  waiting for approval: request [bold]{result.approval_request_id}[/]")
        agent = agent_reference()  # the approving process needs the Run's agent too
        named = f"--agent {agent} " if agent else ""
        console.print(f"  decide with: harness {named}approve {result.approval_request_id} --as <identity>")


def run(
    task: Annotated[str, typer.Argument(help="What the agent should do.")],
    tenant: Tenant = "default",
    user: User = "alice",
    session: Session = "default",
    role: Annotated[list[str] | None, typer.Option(
        "--role", help="Act with only this one of your roles (repeatable). Roles come from the identity "
                       "directory; this can narrow them, never add one.")] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", help="Repeat-safe submit key.")] = None,
    team: Annotated[str | None, typer.Option(
        "--team", help="The collaboration group the Run works for: one of the identity's teams in the "
                       "identity directory.")] = None,
    chain_remaining: Annotated[int | None, typer.Option(
        "--chain-remaining", min=0, help="How many levels of child Runs the Run may start "
                                         "(default: HARNESS_CHAIN_DEPTH).")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="If the Run waits for approval, keep waiting for the decision.")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", help="With --wait: give up waiting after this many seconds.",
        callback=seconds_up_to(MAX_DURATION_S))] = 3600.0,
    start_by: Annotated[str | None, typer.Option(
        "--start-by", help="The latest moment the Run may start, ISO 8601 with its offset "
                           "(2026-12-05T10:00:00Z); later it is closed not_started instead of run.")] = None,
    start_within: Annotated[float | None, typer.Option(
        "--start-within", min=0.001, callback=seconds_up_to(MAX_DURATION_S),
        help="The same as a number of seconds from now (at most 366 days).")] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Run a task in-process until it is final or waits for a human; show the state path live. When too
    many accepted Runs wait to start (HARNESS_MAX_BACKLOG) the Run is refused, nothing written: exit 1."""
    deadline = _start_by(start_by, start_within)
    ops = operations(db)
    ops.warm()  # the vocabulary loads before the Run, not inside its step 2
    roles = caller_roles(ops, tenant, user, role)
    if team is not None and team not in ops.identities.teams_of(tenant, user):
        teams = ", ".join(ops.identities.teams_of(tenant, user)) or "none"
        fail(f"--team {team}: {tenant}/{user} is not a member of it (its teams: {teams})")
    if not json_:
        ops.on_change(lambda run_id, source, target: typer.echo(f"  {source.value:>13} → {target.value}"))
    request = {"task": task, "tenant_id": tenant, "user_id": user, "session_id": session, "roles": list(roles),
               "idempotency_key": idempotency_key, "chain_remaining": chain_remaining, "start_by": deadline,
               "team_id": team}
    result = ops.create_run(request)
    if wait and result.state == RunState.AWAITING_HITL.value:
        result = wait_for_decision(ops, result.run_id, timeout)
    if json_:
        emit(result_document(ops, result))
    else:
        print_result(result)


def _start_by(start_by: str | None, start_within: float | None) -> str | None:
    """The request's start_by from --start-by or --start-within (not both), as ISO 8601."""
    if start_by is not None and start_within is not None:
        fail("give --start-by or --start-within, not both")
    if start_within is not None:
        return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=start_within)).isoformat()
    return start_by


def caller_roles(ops: Operations, tenant: str, user: str, narrowed_to: list[str] | None) -> tuple[str, ...]:
    """The roles the identity directory gives tenant/user (none for an identity it does not know, with a
    note on stderr), narrowed to `narrowed_to` when given; claiming a role it does not hold is bad input."""
    held = ops.identities.roles_of(tenant, user)
    if ops.identities.find(tenant, user) is None:
        typer.echo(f"note: {tenant}/{user} is not in the identity directory, so it has no roles", err=True)
    if not narrowed_to:
        return held
    claimed = [r for r in narrowed_to if r not in held]
    if claimed:
        fail(f"--role {claimed[0]}: {tenant}/{user} does not hold it (its roles: {', '.join(held) or 'none'}); "
             "--role can only narrow the roles of the identity directory")
    return tuple(r for r in held if r in narrowed_to)


def wait_for_decision(ops: Operations, run_id: str, timeout: float) -> RunResult:
    """Poll until the Run leaves AWAITING_HITL and settles; approval timeouts are applied meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ops.expire_approvals()
        run = ops.run(run_id)
        if run.state in FINAL:
            break
        time.sleep(0.5)
    return ops.result(run_id)


def trace(run_id: Annotated[str, typer.Argument(help="The Run's id.")], db: DbOption = None,
          json_: JsonOption = False) -> None:
    """Print a Run's trace as a tree: transitions, steps, policy verdicts, approvals, tool calls, costs."""
    store = read_store(db)
    run = store.get_run(run_id)
    store.drain_all()
    records = [{"seq": r.seq, "kind": r.kind, "hash": r.hash, **r.data()} for r in store.trace_of(run_id)]
    if json_:
        emit({"run_id": run_id, "state": run.state.value, "records": records})
        return
    screen().print(trace_tree(run_id, run.state.value, records, store.clock.now()))


def trace_tree(run_id: str, state: str, records: list[dict[str, Any]], now: float | None = None) -> Tree:
    """The trace as a tree under the Run: every record under its step, the steps in the order the Run
    passed them, then the state changes and the audit events (the groups add up to the records)."""
    from rich.tree import Tree

    from harness.pipeline.trace_groups import group_records

    now = time.time() if now is None else now
    root = Tree(f"[bold]Run {run_id}[/] [{state}] · {len(records)} hash-chained records", highlight=False)
    for group in group_records(records, lambda r: (r["kind"], r)):
        title = f"{group.number} {group.label}" if group.number is not None else group.label
        step = group.summary
        if step is not None:
            detail = f" {step['detail']}" if step.get("detail") else ""
            title += f": {step['status']} ({step['duration_ms']} ms){detail}"
        node = root.add(f"{title}  [dim]{len(group.records)} record{'s' if len(group.records) != 1 else ''}[/]")
        for r in group.records:
            for line in _record_lines(r, now):
                node.add(line)
    return root


def _record_lines(r: dict[str, Any], now: float) -> list[str]:
    """How one record reads in the tree (a policy record: one line per rule); none for a group's own step."""
    kind = r["kind"]
    if kind == "step":
        return []
    if kind == "transition":
        return [f"{r['from'] or '∅'} → {r['to']}  [dim]{r['actor']}: {r['reason']}[/]"]
    if kind == "audit":
        return [f"{r['event']} by {r['actor']}"]
    if kind == "policy":
        from harness.domain.traces import policy_passed, policy_verdicts

        lines = [f"policy {v['rule_id']}: {v['decision']} — {v['reason']}" for v in policy_verdicts(r)]
        passed = policy_passed(r)
        if passed:
            more = "more " if lines else ""
            lines.append(f"policy: {passed} {more}rule verdict{'s' if passed != 1 else ''} passed")
        return lines
    if kind == "tool":
        return [f"tool {r['step_id']} {r['skill_id']}@{r['skill_version']}: {r['status']} "
                f"attempts={r['attempts']} {r.get('error_code') or ''}".rstrip()]
    if kind == "hitl":
        bg = " [break-glass]" if r.get("break_glass") else ""
        who = f" by {r['approver']}" if r.get("approver") else ""
        event = "refused attempt" if r["event"] == "refused" else r["event"]
        return [f"approval {event} {r['level']}{who}{bg} {deadline_reason(r.get('reason', ''), now)}".rstrip()]
    if kind == "hitl_request":
        return [f"approval request {r['request_id']} ({r['level']}, {r['status']}), "
                f"deadline {human(float(r['deadline_at']), now)}"]
    if kind == "hitl_decision":
        verb = "tried to " + r["decision"] if r["outcome"] == "refused" else r["decision"] + "d"
        refused = f" — refused: {r['refusal']}" if r["outcome"] == "refused" else ""
        return [f"decision: {r['approver']} {verb}{refused}"]
    if kind == "cost":
        return [f"cost {r['source']}: {r['input_tokens']}+{r['output_tokens']} tokens, {r['usd']} USD"]
    if kind == "error":
        return [f"[red]error {r['error_code']}[/]: {r['message']}"]
    if kind == "run":
        return [f"RunTrace: {r['final_state']} ({r['close_reason']}) trace_hash={r['trace_hash'][:16]}…"]
    if kind == "llm":
        return [f"model call {r.get('provider')}/{r.get('model')} ({r.get('purpose')})"]
    if kind == "context":
        return [f"context assembled ({r.get('recall_mode') or 'no'} memory recall, "
                f"{r.get('filtered_secrets', 0)} secret(s) filtered)",
                *(f"knowledge chunk {c['chunk_id']} ({c['source']}) sha256 {c['content_hash'][:16]}…"
                  for c in r.get("knowledge", []))]
    if kind == "memory":
        return [f"memory {r.get('event', '')} ({r.get('scope', '')})"]
    return [kind]


def cancel(run_id: Annotated[str, typer.Argument(help="The Run's id.")],
           as_: Annotated[str, typer.Option("--as", help="Who cancels (tenant/user).")] = "operator",
           reason: Annotated[str, typer.Option("--reason")] = "cancelled by the user",
           db: DbOption = None, json_: JsonOption = False) -> None:
    """Cancel a Run that has not finished."""
    ops = operations(db)
    who = ops.identities.resolve(as_)
    run = ops.run(run_id)
    if run.tenant_id != who.tenant_id:
        fail(f"no run with id {run_id!r} in tenant {who.tenant_id}")
    check_may_cancel(who, run.user_id)  # as over HTTP: its requester or an operator
    result = ops.cancel(run_id, by=f"{who.tenant_id}/{who.user_id}", reason=reason)
    emit(result_document(ops, result)) if json_ else print_result(result)


def decide(decision: str, request_id: str, as_: str, reason: str, break_glass: bool, db: str | None,
           json_: bool, resume: bool = True) -> None:
    """approve / reject: judge and persist the decision, then (unless not `resume`) drive the Run in this
    process; an approval this process cannot drive (it lacks the Run's skills) is refused unrecorded."""
    ops = operations(db)
    approver = ops.identities.resolve(as_)
    verdict, result = ops.decide(request_id, approver, decision, break_glass=break_glass, reason=reason,
                                 resume=resume)
    doc = {"request_id": request_id, "decision": decision, "accepted": verdict.accepted, "effect": verdict.effect,
           "refusal": verdict.refusal, "approvals": verdict.approvals,
           "required_approvals": verdict.request.required_approvals, "run": result_document(ops, result)}
    if json_:
        emit(doc)
    elif verdict.accepted:
        typer.echo(f"{decision} accepted ({verdict.effect}; {verdict.approvals}/"
                   f"{verdict.request.required_approvals} approvals)")
        print_result(result)
        if verdict.effect == "approved" and not resume:
            typer.echo("  not driven here (--no-resume): a worker or `harness serve` with the Run's agent drives it")
    else:
        typer.echo(f"{decision} refused: {verdict.refusal}", err=True)
    if not verdict.accepted:
        raise typer.Exit(1)


AsOption = Annotated[str, typer.Option("--as", help="The approver's identity (tenant/user).")]
ReasonOption = Annotated[str, typer.Option("--reason", help="Why.")]
BreakGlass = Annotated[bool, typer.Option("--break-glass", help="Privileged: complete the approval now (traced).")]
Resume = Annotated[bool, typer.Option(
    "--resume/--no-resume",
    help="Drive the approved Run on in this process (it needs the Run's agent: harness --agent module:attr "
         "approve ...), or only record the decision and leave the drive to a worker or `harness serve` "
         "running that agent.")]


def approve(request_id: Annotated[str, typer.Argument()], as_: AsOption, reason: ReasonOption = "",
            break_glass: BreakGlass = False, resume: Resume = True, db: DbOption = None,
            json_: JsonOption = False) -> None:
    """Approve a pending request (exit 1 when the decision is refused, or when this process lacks skills the
    approved steps call: nothing is recorded then)."""
    decide("approve", request_id, as_, reason, break_glass, db, json_, resume)


def reject(request_id: Annotated[str, typer.Argument()], as_: AsOption, reason: ReasonOption = "",
           db: DbOption = None, json_: JsonOption = False) -> None:
    """Reject a pending request; any reject is final."""
    decide("reject", request_id, as_, reason, False, db, json_)


def approvals(tenant: Annotated[str | None, typer.Option("--tenant")] = None, db: DbOption = None,
              json_: JsonOption = False) -> None:
    """List approval requests that are waiting."""
    from harness.domain.approvals import parent_runs_of
    from harness.stores import approval_rows

    store = read_store(db)
    rows = approval_rows(store)
    if rows.due(store.clock.now(), 1):  # a timeout to apply first: that takes the whole runtime
        operations(db).expire_approvals()
    pending = rows.pending(tenant, 200)
    parents = parent_runs_of(pending, rows.parent_runs)
    docs = [{"request_id": r.request_id, "run_id": r.run_id, "tenant_id": r.tenant_id, "requester": r.requester,
             "level": r.level, "required_approvals": r.required_approvals, "approver_roles": list(r.approver_roles),
             "created_at": iso(r.created_at), "deadline_at": iso(r.deadline_at), "actions": r.actions,
             "actions_hash": r.actions_hash, "parent_run_id": parents.get(r.request_id)} for r in pending]
    if json_:
        emit({"pending": docs})
        return
    if not docs:
        typer.echo("no approval requests are waiting")
    now = store.clock.now()
    for d, request in zip(docs, pending, strict=True):
        typer.echo(f"{d['request_id']}  {d['level']}  run {d['run_id']}  by {d['tenant_id']}/{d['requester']}")
        roles = ", ".join(request.approver_roles)
        who = f"approvers: {roles}" if roles else "the requester confirms"
        typer.echo(f"    {who}; {request.required_approvals} approval(s) needed by {human(request.deadline_at, now)}")
        if d["parent_run_id"]:
            typer.echo(f"    a child Run: its parent Run {d['parent_run_id']} waits for it")
        for action in request.actions:
            typer.echo(f"    {action['step_id']}: {action['skill']} {json.dumps(action['arguments'])}")
