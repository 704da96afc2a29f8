"""Trace records of step ② (SPEC A1, C1-C5): how the context was built, without its content.

One "context" record per assembled context: tokenizer and tokens used, how many secrets were removed,
what compression did, which memory entries were recalled (ids only) and in which mode, and which
knowledge-base chunks the model was given (id, document, source, content hash, tokens), so a replay and an
auditor can see what the model read. A recall or a search that failed and degraded to nothing adds an
ErrorTrace, so the degradation is never silent.
"""

from __future__ import annotations

from harness.domain.contracts import AssembledContext
from harness.domain.records import TraceRecordIn
from harness.domain.traces import error_trace

RECALL_DEGRADED = "memory_recall_degraded"
KNOWLEDGE_DEGRADED = "knowledge_search_degraded"


def context_records(run_id: str, assembled: AssembledContext) -> list[TraceRecordIn]:
    """The records to write with the PREPARING -> PLANNING transition."""
    records = [TraceRecordIn("context", {
        "run_id": run_id, "tokenizer": assembled.tokenizer, "tokens_used": assembled.tokens_used,
        "token_budget": assembled.token_budget, "filtered_secrets": assembled.filtered_secrets,
        "compression": assembled.compression, "recall_mode": assembled.recall_mode,
        "memory_ids": list(assembled.memory_ids), "recall_degraded": assembled.recall_degraded,
        **({"knowledge_mode": assembled.knowledge_mode,
            "knowledge": [chunk.model_dump(mode="json") for chunk in assembled.knowledge],
            "knowledge_degraded": assembled.knowledge_degraded} if assembled.knowledge_mode != "off" else {}),
    }, run_id)]
    if assembled.recall_degraded is not None:
        message = f"memory recall failed, continuing without memory: {assembled.recall_degraded}"
        records.append(error_trace(run_id, 2, RECALL_DEGRADED, message).to_record())
    if assembled.knowledge_degraded is not None:
        message = f"knowledge-base search failed, continuing without snippets: {assembled.knowledge_degraded}"
        records.append(error_trace(run_id, 2, KNOWLEDGE_DEGRADED, message).to_record())
    return records
