"""Lexical recall's pure half: the query's word terms, a light stemmer, and an exact BM25 in Python.

The database adapter (harness.adapters.sql.memory) searches with SQLite FTS5 or PostgreSQL full-text,
and ranks with `bm25` over the scope's rows on any other database (MySQL/MariaDB). Query text becomes
a bag of plain word terms, so nothing a user types is ever interpreted as query syntax by the database.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

MAX_TERMS = 24
_WORD = re.compile(r"[A-Za-z0-9]+")
_STOP = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "can", "do", "does", "for", "from", "had", "has",
    "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "no", "not", "of", "on", "or",
    "our", "please", "so", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this",
    "to", "was", "we", "were", "what", "when", "where", "which", "who", "why", "will", "with", "you", "your"))


def terms(text: str) -> list[str]:
    """Distinct lower-case word terms of `text`, stop words removed, at most MAX_TERMS."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if word not in _STOP and (len(word) > 1 or word.isdigit()):
            seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def stem(word: str) -> str:
    """A light English suffix stripper (plurals, -ing, -ed, final e, doubled consonants), so "refunds" finds
    "refund" here as it does with FTS5's porter tokenizer and PostgreSQL's english configuration."""
    if word.endswith("ss") or len(word) <= 3:
        return word
    for suffix, keep in (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: len(word) - len(suffix)] + keep
            break
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeioulsz":
        word = word[:-1]
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def bm25(query_terms: Sequence[str], rows: Sequence[Any], k: int, k1: float = 1.2, b: float = 0.75) -> list[
        tuple[Any, float]]:
    """Okapi BM25 over the rows' content, lightly stemmed; the best `k` (row, score) pairs scoring above 0."""
    docs = [Counter(stem(w) for w in _WORD.findall(r.content.lower())) for r in rows]
    query_terms = list(dict.fromkeys(stem(q) for q in query_terms))
    if not docs or not query_terms:
        return []
    avg = sum(sum(d.values()) for d in docs) / len(docs)
    df = {q: sum(1 for d in docs if q in d) for q in query_terms}
    scored = []
    for row, doc in zip(rows, docs, strict=True):
        length = sum(doc.values())
        score = 0.0
        for q in query_terms:
            if doc[q]:
                idf = math.log(1 + (len(docs) - df[q] + 0.5) / (df[q] + 0.5))
                score += idf * doc[q] * (k1 + 1) / (doc[q] + k1 * (1 - b + b * length / max(avg, 1e-9)))
        if score > 0:
            scored.append((row, score))
    scored.sort(key=lambda pair: -pair[1])
    return scored[:k]
