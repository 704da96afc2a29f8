"""Context assembler benchmark (SPEC C1-C4): assembly time, recall quality, tokens saved by compression.

    python benchmarks/bench_context.py                      # lexical memory (the default install)
    python benchmarks/bench_context.py --semantic           # + vector and hybrid (the [semantic] extra)

1. Assembly time: one ContextAssembler.assemble() for a 50-turn history, in a SQLite database holding
   10,000 memory entries per tenant (3 tenants; 20% tenant-wide, 80% spread over 10 users). Measured for
   a new conversation each time (nothing cached) and for the next turn of the same conversation.
2. Recall quality: recall@5 on a small labelled set (30 facts among the distractors; for each a query
   that shares words with it and a paraphrase that shares almost none).
3. Tokens saved: a 50-turn support conversation compressed to several budgets; key items kept.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.adapters.sql.memory import SqlMemoryRows
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.context.compression import compress, cost, key_items
from harness.context.errors import CompressionRefusedError
from harness.context.secrets import SecretFilter
from harness.context.tokenizer import BpeTokenizer
from harness.domain.contracts import Message, RunRequest
from harness.domain.llm import ToolSpec
from harness.memory.scope import MemoryScope, ScopeLevel
from harness.memory.store import MemoryStore, Mode, NewMemory
from harness.pipeline.context_assembler import ContextAssembler

TENANTS, PER_TENANT, USERS = 3, 10_000, 10
TOOLS = [ToolSpec(name=f"skill_{i}", description="A support skill.",
                  parameters={"type": "object", "properties": {"order_id": {"type": "string"}}})
         for i in range(5)]
#: (fact stored for alice, query sharing its words, paraphrase sharing almost none)
LABELLED = (
    ("Refunds for damaged parcels are issued as store credit",
     "refund damaged parcel", "money back for a broken item"),
    ("Orders to Austria ship with DHL and arrive in three days",
     "orders Austria DHL", "delivery time to Vienna"),
    ("Alice moved house; deliveries now go to Graz",
     "Alice deliveries Graz", "new home address for packages"),
    ("Alice prefers to be contacted by email, never by phone",
     "contact email phone", "how to reach the customer"),
    ("The warranty on headphones lasts two years", "headphones warranty", "guarantee period for earphones"),
    ("Express shipping costs 12 EUR extra within the EU", "express shipping cost", "price of fast delivery"),
    ("Gift cards cannot be exchanged for cash", "gift cards cash", "turn a voucher into money"),
    ("Alice's loyalty tier is gold since March", "loyalty tier gold", "membership level of this client"),
    ("Returns are accepted within 30 days of delivery", "returns 30 days", "deadline to send goods back"),
    ("Orders above 50 EUR ship free of charge", "orders ship free", "no postage for large purchases"),
    ("The Berlin warehouse closes for inventory in January",
     "Berlin warehouse inventory", "stock count shutdown"),
    ("Laptop batteries may not be sent by air freight",
     "laptop batteries air freight", "flying lithium cells"),
    ("Alice's invoices must show her company VAT number", "invoices VAT number", "tax id on the bill"),
    ("Size exchanges for shoes are free of charge",
     "size exchanges shoes", "swap sneakers for a bigger pair"),
    ("Customer support is open weekdays from 8 to 18", "support open weekdays", "service desk hours"),
    ("Preorders are charged only when the item ships", "preorders charged ships", "when is payment taken"),
    ("Alice reported a scratched phone screen in October", "scratched phone screen", "mobile display damage"),
    ("Coupons cannot be combined with sale prices", "coupons sale prices", "stacking discounts"),
    ("Parcels to Switzerland need a customs declaration",
     "Switzerland customs declaration", "import paperwork"),
    ("Alice asked to cancel the monthly coffee subscription",
     "cancel coffee subscription", "stop recurring beans"),
    ("Bulky furniture is delivered by a two-person crew", "furniture delivered crew", "sofa home delivery"),
    ("Lost parcels are investigated with the carrier for 10 days", "lost parcels carrier", "missing package"),
    ("Alice's birthday discount is 15 percent", "birthday discount percent", "celebration voucher"),
    ("Refund payouts to credit cards take up to 5 business days",
     "refund credit cards days", "card reimbursement"),
    ("Engraved items are final sale and cannot be returned", "engraved items returned", "personalised goods"),
    ("Alice needs a wheelchair-accessible delivery slot",
     "wheelchair delivery slot", "mobility access drop-off"),
    ("Price matching applies only to identical models", "price matching models", "beat a competitor's offer"),
    ("Digital downloads are not refundable after access",
     "digital downloads refundable", "ebook reimbursement"),
    ("Alice's account was locked after three failed logins", "account locked logins", "cannot sign in"),
    ("Batteries and chargers are recycled at every store",
     "batteries chargers recycled", "dispose of old power"),
)
CARRIERS = ("DHL", "UPS", "GLS", "DPD", "FedEx", "Hermes")
CITIES = ("Berlin", "Munich", "Hamburg", "Vienna", "Zurich", "Lisbon", "Madrid", "Paris", "Milan", "Prague")
PRODUCTS = ("USB-C cable", "phone case", "desk lamp", "office chair", "water bottle", "backpack", "keyboard",
            "monitor", "tea kettle", "running shoes", "yoga mat", "coffee grinder")
TOPICS = ("delivery status", "invoice copy", "refund status", "address change", "payment failure",
          "product question", "discount code", "order cancellation", "warranty claim", "account settings")


def distractor(rng: random.Random, chatter: bool = False) -> str:
    """A plausible support note that shares vocabulary with the labelled facts (chatter: no decisions)."""
    n, c = rng.randint(1000, 99999), rng.randint(1, 5000)
    notes = (
        f"Order A-{n} for customer C-{c} shipped with {rng.choice(CARRIERS)} to {rng.choice(CITIES)}; "
        f"items: {rng.choice(PRODUCTS)}, {rng.choice(PRODUCTS)}.",
        f"Customer C-{c} asked about {rng.choice(TOPICS)} for order A-{n}.",
        f"Refund of {rng.randint(5, 400)} EUR for order A-{n} approved; reason: {rng.choice(TOPICS)}.",
        f"Ticket T-{n}: {rng.choice(PRODUCTS)} came late to {rng.choice(CITIES)}, customer C-{c} informed.",
    )
    return rng.choice([note for note in notes if not (chatter and "approved" in note)])


def seed(memory: MemoryStore, rng: random.Random, tenants: int) -> float:
    """10,000 entries per tenant plus the labelled facts (for user1 of t0); returns seconds spent."""
    started = time.perf_counter()
    for tenant in range(tenants):
        entries = []
        for i in range(PER_TENANT):
            scope_user = None if i % 5 == 0 else f"user{i % USERS}"
            scope: ScopeLevel = "tenant" if scope_user is None else "user"
            entries.append(NewMemory(f"t{tenant}", scope, distractor(rng), user_id=scope_user))
        for start in range(0, len(entries), 1_000):
            memory.add(entries[start:start + 1_000])
    memory.add([NewMemory("t0", "user", fact, user_id="user1", entry_id=f"fact-{i}")
                for i, (fact, _, _) in enumerate(LABELLED)])
    return time.perf_counter() - started


def conversation(turns: int, salt: str) -> list[dict[str, str]]:
    """A 50-turn support conversation with a goal, constraints, tool results and an approval."""
    rng = random.Random(salt)
    order = rng.randint(1000, 9999)
    out = [{"role": "user", "content": f"Goal: sort out the refund for order A-{order} ({salt})."}]
    for i in range(1, turns):
        if i % 10 == 3:
            result = {"order_id": f"A-{i}", "status": "delivered", "carrier": rng.choice(CARRIERS),
                      "total": 42.5}
            out.append({"role": "tool", "content": json.dumps(result)})
        elif i % 17 == 5:
            out.append({"role": "user", "content": "The refund must not exceed the order total."})
        elif i == 33:
            out.append({"role": "system", "content": "Refund draft R-7 approved by lee (L3)."})
        else:
            role = "user" if i % 2 else "assistant"
            text = " ".join(distractor(rng, chatter=True) for _ in range(3))
            out.append({"role": role, "content": f"{salt} turn {i}: {text}"})
    return out


def time_assembly(assembler: ContextAssembler, repeats: int) -> dict[str, float]:
    """Median and p95 milliseconds of one assembly: new conversation each time, then the same one."""
    def run(history_salt: str, task: str) -> float:
        history = tuple(Message.model_validate(m) for m in conversation(50, history_salt))
        request = RunRequest(task=task, tenant_id="t0", user_id="user1", history=history)
        started = time.perf_counter()
        assembler.assemble(request, TOOLS)
        return (time.perf_counter() - started) * 1000

    cold = [run(f"conv{i}", LABELLED[i % len(LABELLED)][1]) for i in range(repeats)]
    warm = [run("same", LABELLED[i % len(LABELLED)][1]) for i in range(repeats)]
    return {"new_conversation_median_ms": statistics.median(cold), "new_conversation_p95_ms": _p95(cold),
            "next_turn_median_ms": statistics.median(warm), "next_turn_p95_ms": _p95(warm)}


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


def recall_at_5(memory: MemoryStore, mode: Mode) -> dict[str, float]:
    """Share of labelled queries whose fact is among the top 5, for word-sharing and paraphrase queries."""
    scope = MemoryScope("t0", "user1", "default")
    result = {}
    for kind, column in (("lexical_queries", 1), ("paraphrase_queries", 2)):
        hits = sum(f"fact-{i}" in {r.entry_id for r in memory.recall(scope, row[column], 5, mode=mode)}
                   for i, row in enumerate(LABELLED))
        result[kind] = hits / len(LABELLED)
    return result


def compression_savings() -> list[dict[str, Any]]:
    """Tokens of a 50-turn conversation before and after compression at several budgets."""
    count = BpeTokenizer("cl100k_base").count
    history = [Message.model_validate(m) for m in conversation(50, "compression")]
    total = sum(cost(m, count) for m in history)
    rows: list[dict[str, Any]] = []
    for share in (1.0, 0.5, 0.25, 0.1, 0.05):
        budget = int(total * share)
        try:
            out = compress(history, budget, count)
        except CompressionRefusedError as exc:
            rows.append({"budget": budget, "tokens_in": total, "refused": str(exc)[:80]})
            continue
        kept = sum(1 for i in key_items(history) if any(m is history[i] for m in out.messages))
        rows.append({"budget": budget, "tokens_in": out.tokens_in, "tokens_out": out.tokens_out,
                     "saved_pct": round(100 * out.saved / out.tokens_in, 1),
                     "messages_out": len(out.messages), "key_items_kept": f"{kept}/{out.key_items}"})
    return rows


def main() -> None:
    """Run the three measurements and print them as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--semantic", action="store_true", help="also measure vector and hybrid recall")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--tenants", type=int, default=TENANTS, help="tenants of 10,000 entries each")
    parser.add_argument("--db", help="an empty database URL to measure on (PostgreSQL, MySQL/MariaDB); "
                                     "default: a new SQLite file")
    args = parser.parse_args()
    embedder = None
    if args.semantic:
        from harness.memory.semantic import MiniLMEmbedder

        embedder = MiniLMEmbedder()
    with tempfile.TemporaryDirectory() as folder:
        store = SqlStore.open(args.db or str(Path(folder) / "bench.db"), FakeClock())
        memory = MemoryStore(SqlMemoryRows(store.engine), store.clock, SecretFilter(), embedder)
        report: dict[str, Any] = {"python": sys.version.split()[0], "backend": store.engine.dialect.name,
                                  "entries": args.tenants * PER_TENANT + len(LABELLED),
                                  "seed_s": round(seed(memory, random.Random(7), args.tenants), 1)}
        assembler = ContextAssembler(BpeTokenizer("cl100k_base"), memory=memory)
        timings = time_assembly(assembler, args.repeats)
        report["assembly_" + memory.mode] = {k: round(v, 1) for k, v in timings.items()}
        modes: list[Mode] = ["lexical", "vector", "hybrid"] if embedder else ["lexical"]
        report["recall_at_5"] = {mode: recall_at_5(memory, mode) for mode in modes}
        report["compression"] = compression_savings()
        store.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
