"""Opening a SQLite database while other processes use it waits for them: the connect hook's switch to
WAL never fails with "database is locked" (SQLite answers that at once, without waiting on the busy
timeout, while another connection's write transaction holds the lock the switch needs)."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time
from pathlib import Path

from . import sqlite_opener

OPENERS = 6


def test_processes_opening_a_database_another_is_writing_to_all_get_in(tmp_path: Path) -> None:
    """Six processes open a database (not yet in WAL mode) at once while another process holds a write
    transaction on it for a second: each waits, opens and writes, and the database ends in WAL mode."""
    db = tmp_path / "busy.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE opened (who TEXT)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO opened (who) VALUES ('holder')")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(OPENERS + 1)
    outs = [tmp_path / f"opener-{i}.txt" for i in range(OPENERS)]
    procs = [ctx.Process(target=sqlite_opener.open_and_write, args=(str(db), barrier, str(out))) for out in outs]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=120)
        time.sleep(1.0)  # the openers are at the lock by now
        holder.execute("COMMIT")
    finally:
        for p in procs:
            p.join(120)
    answers = [o.read_text() if o.exists() else "no answer" for o in outs]
    assert [p.exitcode for p in procs] == [0] * OPENERS and answers == ["ok"] * OPENERS, answers
    assert holder.execute("SELECT count(*) FROM opened").fetchone()[0] == OPENERS + 1
    assert holder.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    holder.close()
