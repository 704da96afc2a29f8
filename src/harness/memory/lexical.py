"""Lexical recall's pure half: the query's word terms, a light stemmer, and an exact BM25 in Python.

The database adapter (harness.adapters.sql.memory) searches with SQLite FTS5 or PostgreSQL full-text,
and ranks with `bm25` over the scope's rows on any other database (MySQL/MariaDB). Query text becomes
a bag of plain word terms, so nothing a user types is ever interpreted as query syntax by the database.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections import Counter, OrderedDict
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


#: how many terms (each text's distinct ones, summed) `TermCounts` keeps: 80-100 bytes each, 8-10 MB at
#: most (measured); 5,000 memory entries of ~20 terms, or 250 knowledge chunks of ~400
TERM_BUDGET = 100_000


class TermCounts:
    """Each text's stemmed term counts and its length in terms, kept for the texts ranked last, up to
    `budget` terms in all (a long text costs more of it than a short one).

    A recall on a database without full-text search ranks the scope's newest entries (up to the recall
    window, 1,000 by default) at every Run; stemming them again each time was two thirds of its cost (18 of
    27 ms for 1,000 entries on MariaDB, measured). A text's counts never change. What is kept holds no text
    and no word: a text is known by a digest of it (its BLAKE2 digest; for a memory entry the first 128 bits
    of the content hash stored with it, so a recall needs no text it has counted before), a term by the
    process's salted hash of it. So a memory entry erased from the database leaves no words of it here
    either."""

    def __init__(self, budget: int = TERM_BUDGET) -> None:
        self.budget = budget
        self.terms = 0
        self._kept: OrderedDict[bytes, tuple[Counter[int], int]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, text: str) -> tuple[Counter[int], int]:
        """The counts of `text`'s stemmed terms, each by its salted hash (read only: they are shared), and
        how many terms it has."""
        return self.of(hashlib.blake2b(text.encode(), digest_size=16).digest(), text)

    def kept(self, key: bytes) -> tuple[Counter[int], int] | None:
        """The counts kept under `key` (a digest of the text: the same text, the same key), if they are."""
        return self.kept_all([key])[0]

    def kept_all(self, keys: Sequence[bytes]) -> list[tuple[Counter[int], int] | None]:
        """`kept` for each of `keys`, under one hold of the lock (a recall asks for a window of 1,000)."""
        found: list[tuple[Counter[int], int] | None] = []
        with self._lock:
            for key in keys:
                kept = self._kept.get(key)
                if kept is not None:
                    self._kept.move_to_end(key)
                found.append(kept)
        return found

    def of(self, key: bytes, text: str) -> tuple[Counter[int], int]:
        """`text`'s counts, kept under `key` (a digest that only this text has) unless they already are."""
        kept = self.kept(key)
        if kept is not None:
            return kept
        counts = Counter(hash(stem(w)) for w in _WORD.findall(text.lower()))
        kept = (counts, sum(counts.values()))
        with self._lock:
            if key not in self._kept:
                self._kept[key] = kept
                self.terms += len(counts)
            while self.terms > self.budget and self._kept:
                self.terms -= len(self._kept.popitem(last=False)[1][0])
        return kept


_TERMS = TermCounts()


def bm25(query_terms: Sequence[str], rows: Sequence[Any], k: int, k1: float = 1.2, b: float = 0.75) -> list[
        tuple[Any, float]]:
    """Okapi BM25 over the rows' content, lightly stemmed; the best `k` (row, score) pairs scoring above 0."""
    return [(rows[i], score) for i, score in bm25_of([_TERMS(r.content) for r in rows], query_terms, k, k1, b)]


def bm25_of(docs: Sequence[tuple[Counter[int], int]], query_terms: Sequence[str], k: int, k1: float = 1.2,
            b: float = 0.75) -> list[tuple[int, float]]:
    """`bm25` over documents already counted (`TermCounts`): the best `k` (position in `docs`, score) pairs
    scoring above 0, best first (equal scores in the order of `docs`)."""
    wanted = list(dict.fromkeys(hash(stem(q)) for q in query_terms))
    if not docs or not wanted:
        return []
    avg = sum(length for _, length in docs) / len(docs)
    df = {q: sum(1 for d, _ in docs if q in d) for q in wanted}
    idf = {q: math.log(1 + (len(docs) - df[q] + 0.5) / (df[q] + 0.5)) for q in wanted}
    scored = []
    for position, (doc, length) in enumerate(docs):
        score = 0.0
        for q in wanted:
            tf = doc.get(q)  # not doc[q]: a Counter answers a term it lacks with a Python-level __missing__
            if tf:
                score += idf[q] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / max(avg, 1e-9)))
        if score > 0:
            scored.append((position, score))
    scored.sort(key=lambda pair: -pair[1])
    return scored[:k]


def counted(key: bytes, text: str) -> tuple[Counter[int], int]:
    """The process's kept counts of `text` under `key` (see `TermCounts.of`)."""
    return _TERMS.of(key, text)


def counted_before(keys: Sequence[bytes]) -> list[tuple[Counter[int], int] | None]:
    """The process's counts kept under each of `keys`, where they are: a ranking needs no text for those."""
    return _TERMS.kept_all(keys)
