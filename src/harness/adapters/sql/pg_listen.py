"""Changes pushed across processes on PostgreSQL: NOTIFY in the change's transaction, LISTEN per process.

The store sends `pg_notify('harness_runs', run_id)` with every state change it writes, in the same
transaction: PostgreSQL delivers it at commit, and never for a rolled-back change. `PgChangeFeed` holds one
listening connection per process (opened by the first subscriber, on a thread of its own) and wakes the
waiters of the Run it names. The waiters still read the changes from the `transitions` table: a
notification is only a wake-up, and several for one Run in one transaction arrive as one.

While the listening connection is down (not yet open, the server restarted) the feed says it does not
reach other processes, so waits are bounded by the caller's poll interval; once it is (re)opened every
waiter is woken to read what it may have missed.

A notifying transaction takes a cluster-wide lock for its commit, which serializes the commits of
concurrent notifying writers: cheap for a few processes, measurable with many (HARNESS_EVENTS_PUSH=false
turns NOTIFY off; waits then poll).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import sqlalchemy as sa

from harness.adapters.change_feed import LocalChangeFeed, Waiter

CHANNEL = "harness_runs"
#: the statement the store adds to a change's transaction (its parameter: the Run's id)
NOTIFY = sa.select(sa.func.pg_notify(sa.literal_column(f"'{CHANNEL}'"), sa.bindparam("run_id", type_=sa.String)))
#: how long the listener waits for notifications before checking that it should go on, and how long
#: without any before it pings the server (a connection cut without a reset is found that way)
_TICK_S = 0.25
_PING_S = 10.0
log = logging.getLogger("harness.feed")


class PgChangeFeed(LocalChangeFeed):
    """The in-process feed, plus every process's changes through LISTEN on `engine`'s database."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__()
        self._engine = engine
        self._listening = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def subscribe(self, run_id: str | None = None, *, poll_s: float) -> Waiter:
        """See ChangeFeed.subscribe; the first subscriber opens the listening connection."""
        self._start()
        return super().subscribe(run_id, poll_s=poll_s)

    def reaches_other_processes(self) -> bool:
        """Whether the listening connection is open now."""
        return self._listening.is_set()

    def wait_listening(self, timeout_s: float) -> bool:
        """Wait until the listening connection is open (for tests and start-up checks)."""
        self._start()
        return self._listening.wait(timeout_s)

    def close(self) -> None:
        """Stop listening (the connection closes within a tick); every waiter is woken to read once more."""
        self._stopping.set()
        self.wake_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2 * _TICK_S + 1.0)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="harness-listen", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        backoff = 0.2
        while not self._stopping.is_set():
            try:
                conn = self._connect()
            except Exception as exc:  # the database is down: waits poll meanwhile
                log.warning("cannot listen for changes (%s); retrying in %.1fs", exc, backoff)
            else:
                backoff = 0.2
                try:
                    self._listen(conn)
                except Exception as exc:
                    if not self._stopping.is_set():
                        log.warning("the change listener's connection failed (%s); reconnecting", exc)
                finally:
                    self._listening.clear()
                    self.wake_all()  # what was announced while nobody listened is read again
                    _close_quietly(conn)
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _connect(self) -> Any:
        """A connection of the engine's driver with the engine's arguments, outside its pool."""
        args, kwargs = self._engine.dialect.create_connect_args(self._engine.url)
        conn = self._engine.dialect.loaded_dbapi.connect(*args, **kwargs)
        conn.autocommit = True
        return conn

    def _listen(self, conn: Any) -> None:
        conn.execute(f"LISTEN {CHANNEL}")
        self._listening.set()
        self.wake_all()  # changes made between a waiter's read and this LISTEN were not announced to it
        quiet = 0.0
        while not self._stopping.is_set():
            heard = False
            for note in conn.notifies(timeout=_TICK_S):
                heard = True
                self.changed(note.payload)
            quiet = 0.0 if heard else quiet + _TICK_S
            if quiet >= _PING_S:
                conn.execute("SELECT 1")
                quiet = 0.0


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # closing a broken connection may fail too; nothing is left to release
        log.debug("closing the change listener's connection failed", exc_info=True)


def listens(engine: sa.Engine) -> bool:
    """Whether changes can be pushed across processes on this engine's database (PostgreSQL through
    psycopg 3, whose connections hand over notifications)."""
    return engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
