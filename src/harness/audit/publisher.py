"""Checkpoints published on an interval, without a person (SPEC A3b).

`harness serve` (its housekeeping loop) and the Celery beat (task ``harness.checkpoint``) each hold a
CheckpointPublisher. A checkpoint is due when the database's newest one is older than the interval
(the setting `checkpoint_interval_s`, HARNESS_CHECKPOINT_INTERVAL_S, default 300 s; 0 turns it off)
and the chain has grown since. The newest checkpoint's own timestamp decides, so several replicas on
one database publish about once per interval between them; two that publish at the same moment race
for the same file name, and the loser skips (checkpoints are never overwritten).

The service waits one interval of real time after it starts before its first checkpoint (a short-lived
process, a test or a demo, leaves no checkpoint behind), and publishes off its housekeeping thread: building the
tree reads the whole chain.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from harness.audit.checkpoint import publish_checkpoint
from harness.audit.checkpoint_files import Checkpoint, latest_checkpoint
from harness.audit.keys import CheckpointError
from harness.audit.places import checkpoint_dir
from harness.audit.witness import Witness, open_witness
from harness.domain.outbound import OutboundRule
from harness.ports.audit import ChainReads
from harness.ports.signer import Signer

log = logging.getLogger("harness.checkpoints")


class CheckpointPublisher:
    """Publishes this database's checkpoint when one is due."""

    def __init__(self, store: ChainReads, *, interval_s: float, directory: Path | None = None,
                 witnesses: Sequence[Witness] = (), wait_first: bool = False, signer: Signer | None = None) -> None:
        self.store = store
        #: who signs (a signer process, harness.ports.signer); None: this process's key file
        self.signer = signer
        self.interval_s = interval_s
        self.directory = directory
        self.witnesses = list(witnesses)
        #: no look at the checkpoint folder before this time (the housekeeping loop asks every second)
        self._not_before = 0.0
        #: time.monotonic() before which nothing is published: a service waits one interval of its own
        #: lifetime (real time, whatever the injected clock says) before its first checkpoint
        self.first_after = time.monotonic() + interval_s if wait_first else 0.0
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        #: the publication running in the background, if any (tests wait on it)
        self.pending: Future[Checkpoint | None] | None = None

    @classmethod
    def from_settings(cls, store: ChainReads, interval_s: float, directory: Path | None,
                      witnesses: Sequence[str], *, wait_first: bool = False,
                      signer: Signer | None = None, rule: OutboundRule | None = None) -> CheckpointPublisher:
        """A publisher as the settings describe it."""
        return cls(store, interval_s=interval_s, directory=directory,
                   witnesses=[open_witness(w, rule) for w in witnesses], wait_first=wait_first, signer=signer)

    def folder(self) -> Path:
        """Where this database's checkpoints go."""
        return self.directory or checkpoint_dir(None, self.store.database_id())

    def due(self) -> bool:
        """True when the newest checkpoint is older than the interval and the chain has grown since."""
        now = self.store.clock.now()
        if self.interval_s <= 0 or now < self._not_before or time.monotonic() < self.first_after:
            return False
        newest = latest_checkpoint(self.folder())
        # a little early rather than a whole interval late (a beat firing every interval, with jitter)
        if newest is not None and now - float(newest.doc["timestamp"]) < 0.95 * self.interval_s:
            self._not_before = float(newest.doc["timestamp"]) + 0.95 * self.interval_s
            return False
        self._not_before = now + min(self.interval_s, 60.0)  # until the next look, whatever happens now
        self.store.drain_all()
        size = self.store.chain_head()[0]
        return size > 0 and (newest is None or newest.tree_size != size)

    def publish_if_due(self) -> Checkpoint | None:
        """Publish now if a checkpoint is due; None when not due, or another publisher was first."""
        if not self.due():
            return None
        try:
            cp = publish_checkpoint(self.store, self.folder(), witnesses=self.witnesses, signer=self.signer)
        except CheckpointError as exc:
            if "exists" in str(exc):  # another replica published this serial a moment ago
                log.info("checkpoint published by another process first: %s", exc)
                return None
            raise
        log.info("checkpoint published", extra={"path": str(cp.path), "tree_size": cp.tree_size})
        for name, error in cp.witnessed:
            if error is not None:
                log.warning("witness did not keep the checkpoint (offered again next time): %s: %s", name, error)
        return cp

    def start_if_due(self) -> Future[Checkpoint | None] | None:
        """Publish in the background if one is due and none is running; the future, or None."""
        with self._lock:
            if self.interval_s <= 0 or self.store.clock.now() < self._not_before or time.monotonic() < self.first_after:
                return None
            if self.pending is not None and not self.pending.done():
                return None
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harness-checkpoint")
            self.pending = self._pool.submit(self._publish_logged)
            return self.pending

    def _publish_logged(self) -> Checkpoint | None:
        try:
            return self.publish_if_due()
        except Exception:  # a failed publication must not stop the next one; it is logged loudly
            log.exception("publishing a checkpoint failed")
            return None

    def close(self) -> None:
        """Wait for a publication in progress, then release the thread."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
