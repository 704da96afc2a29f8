"""The HTTP service: API, console, embedded worker, metrics and spans (SPEC U2-U4)."""
