"""The support example's skills. Orders and customers are read from bundled JSON; notes and refunds
are appended to a ledger, `support-ledger.jsonl` in the database's folder of the data directory
(HARNESS_DATA_DIR/<database id>, the data directory defaulting to ~/.local/share/harness;
HARNESS_EXAMPLE_LEDGER names another file), so their side effects are visible — and countable — after a
Run, and two databases never share one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from harness.paths import default_data_dir
from harness.skills.manifests import SkillContext

DATA = Path(__file__).resolve().parents[1]


class NotFoundError(Exception):
    """The record asked for does not exist."""


def _ledger(ctx: SkillContext) -> Path:
    named = os.environ.get("HARNESS_EXAMPLE_LEDGER")
    path = Path(named) if named else (ctx.data_dir or default_data_dir()) / "support-ledger.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _append(ctx: SkillContext, entry: dict[str, Any]) -> None:
    with _ledger(ctx).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")


def _table(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text(encoding="utf-8"))
    return loaded


def lookup_order(args: dict[str, Any], ctx: SkillContext) -> dict[str, Any]:
    """The order with this id."""
    order = _table("orders.json").get(args["order_id"])
    if order is None:
        raise NotFoundError(f"order {args['order_id']} does not exist")
    return dict(order)


def lookup_customer(args: dict[str, Any], ctx: SkillContext) -> dict[str, Any]:
    """The customer with this id."""
    customer = _table("customers.json").get(args["customer_id"])
    if customer is None:
        raise NotFoundError(f"customer {args['customer_id']} does not exist")
    return dict(customer)


def draft_refund(args: dict[str, Any], ctx: SkillContext) -> dict[str, Any]:
    """A refund proposal for an order, checked against what the customer paid."""
    order, amount = args["order"], float(args["amount"])
    if order["status"] not in ("shipped", "delivered"):
        raise ValueError(f"order {order['order_id']} is {order['status']}; cancel it instead of refunding")
    if amount > order["total"]:
        raise ValueError(f"refund {amount:.2f} exceeds the order total {order['total']:.2f}")
    name = args.get("customer", {}).get("name", "customer")
    return {
        "order_id": order["order_id"],
        "amount": amount,
        "currency": order["currency"],
        "message": f"Dear {name}, we have refunded {amount:.2f} {order['currency']} for order {order['order_id']}.",
    }


def issue_refund(args: dict[str, Any], ctx: SkillContext) -> dict[str, Any]:
    """Issue the refund: one ledger entry per idempotency key, so a repeated call pays once."""
    ledger = _ledger(ctx)
    if ledger.exists():
        for line in ledger.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if entry.get("idempotency_key") == ctx.idempotency_key:
                return {"refund_id": entry["refund_id"], "status": "issued", "duplicate": True}
    # the end of the run id: its start is the creation time, shared by every Run of the same minute
    refund_id = f"R-{ctx.run_id.replace('-', '')[-8:]}-{ctx.step_id}"
    _append(ctx, {"kind": "refund", "refund_id": refund_id, "order_id": args["order_id"], "amount": args["amount"],
             "run_id": ctx.run_id, "idempotency_key": ctx.idempotency_key, "at": time.time()})
    return {"refund_id": refund_id, "status": "issued", "amount": args["amount"]}


def add_note(args: dict[str, Any], ctx: SkillContext) -> dict[str, Any]:
    """Add a note to the support ticket."""
    _append(ctx, {"kind": "note", "order_id": args["order_id"], "text": args["text"], "run_id": ctx.run_id,
             "idempotency_key": ctx.idempotency_key, "at": time.time()})
    return {"noted": True}
