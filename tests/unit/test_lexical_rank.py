"""The Python BM25 that ranks memory and knowledge on databases without full-text search (MySQL/MariaDB),
and the term counts it keeps between recalls."""

from __future__ import annotations

import gc
import math
from collections import Counter
from types import SimpleNamespace

from harness.memory.lexical import TermCounts, bm25, stem

TEXTS = ["Refunds for order A-1001 were issued twice", "The order A-1002 shipped on Monday",
         "Customer asked about refund policy", "Nothing here matches at all"]


def _reference(query: list[str], texts: list[str], k: int) -> list[tuple[str, float]]:
    """BM25 written out plainly over the words (k1 1.2, b 0.75), as the ranking was before any counts were
    kept: the same scores, in the same order."""
    import re

    docs = [Counter(stem(w) for w in re.findall(r"[A-Za-z0-9]+", t.lower())) for t in texts]
    terms = list(dict.fromkeys(stem(q) for q in query))
    avg = sum(sum(d.values()) for d in docs) / len(docs)
    scored = []
    for text, doc in zip(texts, docs, strict=True):
        score = 0.0
        for q in terms:
            if doc[q]:
                df = sum(1 for d in docs if q in d)
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                score += idf * doc[q] * 2.2 / (doc[q] + 1.2 * (0.25 + 0.75 * sum(doc.values()) / avg))
        if score > 0:
            scored.append((text, score))
    return sorted(scored, key=lambda pair: -pair[1])[:k]


def test_the_ranking_is_exact_bm25_and_the_same_when_the_counts_are_kept() -> None:
    """Scores equal a plain BM25 over the words, the first time and again from the kept counts."""
    rows = [SimpleNamespace(content=t) for t in TEXTS]
    for _ in range(2):
        got = [(r.content, score) for r, score in bm25(["refunds", "order"], rows, 3)]
        assert got == _reference(["refunds", "order"], TEXTS, 3)
    assert bm25(["zebra"], rows, 3) == []


def test_kept_counts_are_bounded_and_hold_no_text_nor_word() -> None:
    """At most `budget` terms are kept in all, the least recently ranked texts going first; what is kept is
    digests and integers only, so an entry erased from the database leaves none of its words in the process."""
    secret = "Bartholomew Quixote lives at Zanzibar lane"  # 6 distinct terms
    counts = TermCounts(budget=6 + 6)  # TEXTS[1]: "the order a 1002 shipped on monday" has 7
    counts(secret)
    counts(TEXTS[3])  # "nothing here matches at all": 5
    counts(secret)  # ranked again: now the most recent
    counts(TEXTS[1])  # over the budget: TEXTS[3] goes, then the secret too (7 + 6 > 12)
    assert list(counts._kept) and counts.terms <= 12
    assert counts.terms == sum(len(terms) for terms, _ in counts._kept.values()) == 7
    counts(secret)  # back, and TEXTS[1] goes: 7 + 6 is over the budget
    assert counts.terms == 6 and len(counts._kept) == 1
    too_long = TermCounts(budget=3)
    assert too_long(secret)[1] == 6 and too_long.terms == 0  # counted, and not kept: over the budget alone
    gc.collect()
    kept = repr(counts._kept)
    for word in ("bartholomew", "quixote", "zanzibar", "refund"):
        assert word not in kept.lower()
    assert all(isinstance(key, bytes) for key in counts._kept)
    assert all(isinstance(term, int) for terms, _ in counts._kept.values() for term in terms)


def test_a_text_is_counted_once_then_read_from_what_is_kept() -> None:
    """The second ranking of a text reads its counts (the same object), not the text again."""
    counts = TermCounts()
    first = counts(TEXTS[0])
    assert counts(TEXTS[0]) is first and first[1] == 8  # refunds for order a 1001 were issued twice
