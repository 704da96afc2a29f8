"""Child process of the SQLite opening test: only what it needs is imported (processes start faster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.adapters.sql.database import create_engine


def open_and_write(db: str, barrier: Any, out: str) -> None:
    """Open the database through the engine's connect hook once released, and add a row; write "ok" or
    the error to `out`."""
    barrier.wait()
    try:
        engine = create_engine(f"sqlite:///{db}")
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO opened (who) VALUES (?)", (out,))
        engine.dispose()
    except Exception as exc:  # the test reads what went wrong
        Path(out).write_text(repr(exc))
        raise
    Path(out).write_text("ok")
