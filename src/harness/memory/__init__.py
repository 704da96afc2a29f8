"""Scoped long-term memory: store, lexical and semantic recall, write-back from succeeded Runs (C2, C5)."""
