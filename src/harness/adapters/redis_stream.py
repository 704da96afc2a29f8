"""Redis Streams as the trace buffer between the outbox and the hash chain (SPEC A4, D2).

    outbox ──relay──▶ stream ──chainer (consumer group)──▶ trace_records
       ▲                                                       │
       └──── a record's outbox row is deleted in the same transaction that chains it

- The relay XADDs the oldest outbox records. A record id joins the "in flight" set and the stream in
  one Lua script, so a record waits in the stream at most once and is not sent again while it waits.
  The outbox keeps the record until it is chained, so Redis losing data (a restart without
  persistence, an eviction) loses nothing: the set is gone with the stream and the records, still in
  the outbox, are relayed again.
- The chainer takes a batch with XREADGROUP, chains it by record id in one database transaction that
  also deletes the records' outbox rows (SqlStore.chain_records), and only after the commit XACKs,
  XDELs and clears the ids from the in-flight set. A crash between commit and ack re-delivers the
  batch and the records already chained are dropped by record id; entries a dead chainer left
  pending are taken over with XAUTOCLAIM.
- A Redis outage never blocks a Run and never raises: the records wait in the outbox, the outage is
  logged and audited once (trace_buffer_unavailable, then trace_buffer_recovered), and Redis is not
  tried again for `retry_s`, so Runs closing meanwhile pay nothing for it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from harness.domain.errors import InvalidRequestError
from harness.domain.records import PendingRecord
from harness.ports import ChainWriter

log = logging.getLogger("harness.trace_buffer")

UNAVAILABLE, RECOVERED = "trace_buffer_unavailable", "trace_buffer_recovered"

#: KEYS: stream, in-flight set. ARGV: (record_id, run_id, kind, payload) repeated. Returns how many were
#: added. A missing stream with a non-empty set means Redis lost the stream: the set is stale.
_RELAY_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('DEL', KEYS[2]) end
local added = 0
for i = 1, #ARGV, 4 do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[1], '*', 'r', ARGV[i], 'u', ARGV[i + 1], 'k', ARGV[i + 2], 'p', ARGV[i + 3])
    added = added + 1
  end
end
return added
"""

Entry = tuple[str, dict[str, str] | None]


class RedisTraceBuffer:
    """Relay and chainer over one Redis stream and consumer group (see the module docstring)."""

    def __init__(self, client: redis.Redis, *, prefix: str = "harness", group: str = "chainers",
                 claim_idle_s: float = 30.0, retry_s: float = 1.0) -> None:
        self.redis = client
        # one hash tag for both keys: the Lua script touches both, so they must share a cluster slot
        self.stream, self.inflight = f"{{{prefix}}}:trace:stream", f"{{{prefix}}}:trace:inflight"
        self.group = group
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.claim_idle_ms = int(claim_idle_s * 1000)
        self.retry_s = retry_s
        self.last_error: str | None = None
        self._down_until = 0.0
        self._relay_script = client.register_script(_RELAY_LUA)
        # threads of one process share this consumer name: one drains at a time, or they would take
        # each other's pending entries for their own and chain the same batch twice (harmless, wasted)
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisTraceBuffer:
        """A buffer on `redis://host:port/db[?prefix=NAME]`, with short timeouts and no retry loop:
        an unreachable Redis must cost a closing Run milliseconds, not seconds."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise InvalidRequestError(f"trace buffer URL must be redis://…, not {parts.scheme}://")
        query = dict(parse_qsl(parts.query))
        if "prefix" in query:
            options.setdefault("prefix", query.pop("prefix"))
        client = redis.Redis.from_url(
            urlunsplit(parts._replace(query=urlencode(query))), decode_responses=True,
            socket_timeout=2.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 1),
        )
        return cls(client, **options)

    @property
    def available(self) -> bool:
        """False while an outage is recent: Redis is tried again only after `retry_s`."""
        return time.monotonic() >= self._down_until

    def close(self) -> None:
        """Release the connection pool."""
        self.redis.close()

    # ------------------------------------------------------------------ TraceBuffer

    def drain(self, store: ChainWriter, batch_size: int) -> int:
        """Relay one batch and chain one batch; returns how many records were chained."""
        return self._carry(store, batch_size, until_idle=False)

    def drain_all(self, store: ChainWriter, batch_size: int) -> int:
        """Relay and chain until neither moves a record; returns how many records were chained."""
        return self._carry(store, batch_size, until_idle=True)

    def _carry(self, store: ChainWriter, batch_size: int, *, until_idle: bool) -> int:
        if not self.available:
            return 0
        with self._lock:
            return self._carry_locked(store, batch_size, until_idle=until_idle)

    def _carry_locked(self, store: ChainWriter, batch_size: int, *, until_idle: bool) -> int:
        total = 0
        try:
            while True:
                relayed = self.relay(store, batch_size)
                chained, taken = self.chain(store, batch_size)
                total += chained
                if self.last_error is not None:
                    self._recovered(store)  # its audit record is carried by the next round
                    continue
                if not until_idle or (relayed == 0 and taken == 0):
                    return total
        except redis.RedisError as exc:
            self._outage(store, exc)
            return total

    # ------------------------------------------------------------------ relay: outbox → stream

    def relay(self, store: ChainWriter, limit: int) -> int:
        """XADD the oldest outbox records not already waiting in the stream; returns how many."""
        records = store.pending_records(limit)
        if not records:
            return 0
        waiting = self.redis.smismember(self.inflight, [r.record_id for r in records])
        fresh = [r for r, w in zip(records, waiting, strict=True) if not w]
        if not fresh:
            return 0
        args = [v for r in fresh for v in (r.record_id, r.run_id or "", r.kind, r.payload)]
        return int(self._relay_script(keys=[self.stream, self.inflight], args=args))

    # ------------------------------------------------------------------ chainer: stream → chain

    def chain(self, store: ChainWriter, count: int) -> tuple[int, int]:
        """Chain one batch from the stream, then acknowledge it; returns (chained, entries taken)."""
        entries = self._next_batch(count)
        if not entries:
            return 0, 0
        records = [_record(fields) for _, fields in entries if fields]
        chained = store.chain_records(records)
        ids = [entry_id for entry_id, _ in entries]
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.xack(self.stream, self.group, *ids)
            pipe.xdel(self.stream, *ids)
            if records:
                pipe.srem(self.inflight, *[r.record_id for r in records])
            pipe.execute()
        return chained, len(entries)

    def _next_batch(self, count: int) -> list[Entry]:
        """This consumer's own unacknowledged entries first (its last commit may have failed), then
        entries a dead consumer left pending too long, then new ones."""
        try:
            return self._take(count)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        if not self.redis.exists(self.stream):
            # the stream is gone (Redis restarted empty, or lost the key): the in-flight set describes
            # nothing that waits any more, and its records are still in the outbox to be relayed again
            self.redis.delete(self.inflight)
        self._create_group()
        return self._take(count)

    def _take(self, count: int) -> list[Entry]:
        own = self._read("0", count)
        if own:
            return own
        claimed = self.redis.xautoclaim(self.stream, self.group, self.consumer, self.claim_idle_ms,
                                        start_id="0-0", count=count)
        if claimed[1]:
            return [(entry_id, fields) for entry_id, fields in claimed[1]]
        return self._read(">", count)

    def _read(self, start: str, count: int) -> list[Entry]:
        raw = self.redis.xreadgroup(self.group, self.consumer, {self.stream: start}, count=count)
        reply = cast("list[Any] | None", raw)
        return [(entry_id, fields) for _stream, entries in reply or [] for entry_id, fields in entries]

    def _create_group(self) -> None:
        try:
            self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # ------------------------------------------------------------------ outages

    def _outage(self, store: ChainWriter, exc: redis.RedisError) -> None:
        self._down_until = time.monotonic() + self.retry_s
        first = self.last_error is None
        self.last_error = f"{type(exc).__name__}: {exc}"
        if first:
            log.warning("trace buffer unavailable, records wait in the outbox: %s", self.last_error)
            store.audit(None, UNAVAILABLE, "trace_buffer", {"stream": self.stream, "error": self.last_error})

    def _recovered(self, store: ChainWriter) -> None:
        log.warning("trace buffer back after: %s", self.last_error)
        store.audit(None, RECOVERED, "trace_buffer", {"stream": self.stream, "error": self.last_error})
        self.last_error = None


def _record(fields: dict[str, str]) -> PendingRecord:
    return PendingRecord(fields["r"], fields["u"] or None, fields["k"], fields["p"])
