"""Replay tests (SPEC A5): finished Runs re-executed from their recordings."""
