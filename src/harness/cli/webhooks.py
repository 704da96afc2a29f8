"""`harness webhooks …` and `harness costs`: the pushes and the cost view from the command line (SPEC U1)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.runs import operations, read_store
from harness.cli.support import (
    EXIT_CHECK_FAILED,
    DbOption,
    JsonOption,
    cli_errors,
    emit,
    fail,
    screen,
    seconds_up_to,
)
from harness.domain.costs import GROUPS
from harness.domain.ids import ordered_id
from harness.domain.webhooks import DEFAULT_SECRET_ENV, MAX_SEND_TIMEOUT_S, STATUSES

if TYPE_CHECKING:
    from harness.domain.costs import GroupBy

webhooks_app = typer.Typer(help="Webhook pushes to callers and approvers: deliver, test, list, redeliver.",
                           no_args_is_help=True)


@webhooks_app.command("deliver")
@cli_errors
def deliver(db: DbOption = None, json_: JsonOption = False) -> None:
    """Send every webhook that is due now, once (what the service and the Celery workers do in a loop)."""
    ops = operations(db)
    dispatcher = ops.dispatcher()
    try:
        report = dispatcher.deliver_all()
    finally:
        dispatcher.close()
    if json_:
        emit(report.to_dict())
    else:
        typer.echo(f"delivered {len(report.delivered)}, retrying later {len(report.retrying)}, dead "
                   f"{len(report.dead)}, taken over by another process {len(report.lost_lease)}")


@webhooks_app.command("test")
@cli_errors
def test(
    url: Annotated[str, typer.Argument(help="The http(s) URL to send a signed ping to.")],
    secret_env: Annotated[str, typer.Option(
        "--secret-env", help="The environment variable holding the Standard Webhooks secret to sign with.")]
    = DEFAULT_SECRET_ENV,
    timeout: Annotated[float, typer.Option(
        "--timeout", help="Seconds to wait for an answer (at most 300).", min=0.1,
        callback=seconds_up_to(MAX_SEND_TIMEOUT_S))] = 10.0,
    json_: JsonOption = False,
) -> None:
    """Send one signed `webhook.ping` event to URL and say how the receiver answered (exit 1 if not 2xx).
    This is the operator's own check: it may reach internal addresses, which a tenant's callbacks may not."""
    from harness.domain.contracts import check_callback_url
    from harness.domain.outbound import OutboundRule
    from harness.webhooks.config import SecretRef, WebhookConfigError
    from harness.webhooks.notifier import iso
    from harness.wiring.webhooks import webhook_sender

    try:
        check_callback_url(url)
    except ValueError as exc:
        fail(f"{url!r}: {exc}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", secret_env):
        fail(f"--secret-env: {secret_env!r} is not an environment variable name")
    try:
        secret = SecretRef(secret_env=secret_env).read()
    except WebhookConfigError as exc:
        fail(str(exc))
    event_id = ordered_id()
    body = json.dumps({"type": "webhook.ping", "event_id": event_id,
                       "timestamp": iso(dt.datetime.now(dt.UTC).timestamp()),
                       "data": {"message": "a signed test event from harness", "host": os.uname().nodename}},
                      sort_keys=True, separators=(",", ":"))
    sender = webhook_sender(timeout)
    try:
        outcome = sender.send(url, event_id, body, secret, rule=OutboundRule(any_internal=True))
    finally:
        sender.close()
    doc = {"url": url, "webhook_id": event_id, "ok": outcome.ok, "status_code": outcome.status_code,
           "error": outcome.error}
    if json_:
        emit(doc)
    else:
        typer.echo(f"{url}: " + (f"accepted (HTTP {outcome.status_code})" if outcome.ok else f"not accepted: "
                                                                                            f"{outcome.error}"))
    if not outcome.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


@webhooks_app.command("list")
@cli_errors
def list_(
    status: Annotated[str | None, typer.Option("--status", help=f"Only deliveries in this status: "
                                                                  f"{', '.join(STATUSES)}.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's deliveries.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 100,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """List webhook deliveries, newest first (`--status dead` for the dead letters)."""
    if status is not None and status not in STATUSES:
        fail(f"--status: {status!r} is not one of {', '.join(STATUSES)}")
    from harness.stores import webhook_outbox
    from harness.webhooks.notifier import iso

    outbox = webhook_outbox(read_store(db))
    rows = outbox.list(tenant_id=tenant, status=status, limit=limit)
    docs = [{"delivery_id": d.delivery_id, "event_id": d.event_id, "event_type": d.event_type, "run_id": d.run_id,
             "tenant_id": d.tenant_id, "endpoint": d.endpoint, "url": d.url, "status": d.status,
             "attempts": d.attempts, "last_status": d.last_status, "last_error": d.last_error,
             "created_at": iso(d.created_at)} for d in rows]
    if json_:
        emit({"deliveries": docs, "counts": outbox.counts(tenant)})
        return
    from rich.table import Table

    table = Table("delivery", "event", "run", "endpoint", "status", "attempts", "last error")
    for d in docs:
        table.add_row(str(d["delivery_id"]), str(d["event_type"]), str(d["run_id"] or ""), str(d["endpoint"]),
                      str(d["status"]), str(d["attempts"]), str(d["last_error"] or ""))
    screen().print(table)


@webhooks_app.command("redeliver")
@cli_errors
def redeliver(
    delivery_id: Annotated[str, typer.Argument(help="The dead delivery's id (its webhook-id).")],
    as_: Annotated[str, typer.Option("--as", help="Who redelivers it (recorded in the audit log).")] = "cli",
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Queue a dead delivery again, with the same webhook-id; `harness webhooks deliver` (or the service)
    sends it."""
    ops = operations(db)
    assert ops.webhook_outbox is not None
    again = ops.webhook_outbox.redeliver(delivery_id, tenant_id=None, actor=as_)
    if again is None:
        fail(f"no dead webhook delivery with id {delivery_id!r}")
    if json_:
        emit({"delivery_id": again.delivery_id, "status": again.status})
    else:
        typer.echo(f"{delivery_id} queued again")


_SINCE = re.compile(r"^(\d+)([dhm])$")


def parse_since(value: str, now: dt.datetime) -> dt.datetime:
    """`7d`, `12h`, `30m`, or an ISO 8601 date or date-time; BadInput otherwise."""
    found = _SINCE.match(value.strip())
    if found:
        amount, unit = int(found.group(1)), found.group(2)
        try:
            return now - dt.timedelta(**{{"d": "days", "h": "hours", "m": "minutes"}[unit]: amount})
        except OverflowError:
            fail(f"--since: {value!r} reaches back before the year 1")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        fail(f"--since: {value!r} is neither a period like 7d, 12h or 30m nor an ISO 8601 date")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def costs(
    by: Annotated[str, typer.Option("--by", help=f"Group by {', '.join(GROUPS)}.")] = "user",
    since: Annotated[str | None, typer.Option("--since", help="Only costs since: 7d, 12h, 30m or an ISO date.")]
    = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's costs.")] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Recorded spend grouped by tenant, user, skill or UTC day: USD, tokens, API calls, sandbox seconds."""
    if by not in GROUPS:
        fail(f"--by: {by!r} is not one of {', '.join(GROUPS)}")
    from harness.stores import cost_ledger

    store = read_store(db)
    now = dt.datetime.fromtimestamp(store.clock.now(), dt.UTC)
    start = parse_since(since, now) if since else None
    group: GroupBy = by
    groups = cost_ledger(store).by_group(group, tenant_id=tenant, since=start.timestamp() if start else None)
    total = round(sum(g.usd for g in groups), 8)
    if json_:
        emit({"group_by": by, "since": start.isoformat() if start else None, "tenant": tenant, "total_usd": total,
              "groups": [g.to_dict() for g in groups]})
        return
    from rich.table import Table

    table = Table(by, "USD", "runs", "tokens in", "tokens out", "API calls", "sandbox s", "unpriced",
                  title=f"spend by {by}" + (f" since {start:%Y-%m-%d %H:%M} UTC" if start else ""))
    for g in groups:
        table.add_row(g.key, f"{g.usd:.6f}", str(g.runs), str(g.input_tokens), str(g.output_tokens),
                      str(g.api_calls), f"{g.sandbox_s:.2f}", str(g.unpriced or ""))
    table.add_row("total", f"{total:.6f}", "", "", "", "", "", "")
    screen().print(table)
