"""On PostgreSQL, reads made together and a savepoint's own statements cost no round trips of their own:
they ride in one pipeline with the statements around them (counted on libpq's own trace)."""

from __future__ import annotations

import itertools
from pathlib import Path

import sqlalchemy as sa
from psycopg import pq

from harness.adapters.sql.raw import RawStatements
from tests.integration.test_raw_pipeline import COUNT, INSERT, _notes, engine, probe

BACKENDS = ("postgresql",)
__all__ = ["engine"]  # the fixture, shared with the module that tests what these statements do


def _waits(trace: str) -> int:
    """Round trips in a libpq protocol trace: each time the client, having sent, reads the server."""
    sides = [line.split("\t", 1)[0] for line in trace.splitlines() if line[:2] in ("F\t", "B\t")]
    return sum(1 for a, b in itertools.pairwise(sides) if a == "F" and b == "B")


def test_on_postgresql_reads_together_and_a_savepoint_take_no_round_trips_of_their_own(
        engine: sa.Engine, tmp_path: Path) -> None:
    """Two reads made together are one round trip; a savepoint's SAVEPOINT and RELEASE ride with the
    statements around them (counted on libpq's own trace of the connection)."""
    raw = RawStatements(engine.dialect)
    by_id = sa.select(probe.c.id).where(probe.c.id == sa.bindparam("p_id"))
    path = f"{tmp_path}/pq.trace"
    with engine.begin() as conn, open(path, "w") as handle:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        dbapi.pgconn.trace(handle.fileno())
        dbapi.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        raw.later(conn, INSERT, {"id": 1, "note": "queued"})
        raw.fetch_each(conn, (COUNT, None), (by_id, {"p_id": 1}))  # BEGIN, the write, two reads: 1
        with raw.savepoint(conn, "probe"):
            raw.later(conn, INSERT, {"id": 2, "note": "inside"})
            raw.fetchone(conn, COUNT)  # SAVEPOINT, the write, the read: 1
            raw.later(conn, INSERT, {"id": 3, "note": "inside"})
        # the write and the RELEASE: 1, sent before the block ends
        dbapi.pgconn.untrace()
    assert _waits(Path(path).read_text()) == 3
    assert _notes(engine) == [(1, "queued"), (2, "inside"), (3, "inside")]
