"""Archive and erasure over a store: the segment stores (a directory or an S3-compatible bucket), the
archiver as the settings describe it, and a person's erasure from the database and the archive."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.adapters.s3_segments import S3SegmentStore
from harness.adapters.sql.erasure import ErasureStore
from harness.adapters.sql.retention import RetentionStore
from harness.audit.places import checkpoint_dir
from harness.audit.witness import Witness, open_witness
from harness.domain.outbound import OutboundRule
from harness.retention import storage
from harness.retention.archiver import Archiver
from harness.retention.erase import EraseReport
from harness.retention.erase import erase_user as _erase_user
from harness.retention.policy import RetentionPolicy

if TYPE_CHECKING:
    from pathlib import Path

    from harness.adapters.sql.store import SqlStore
    from harness.ports.retention import ArchiveRows, ErasureRows
    from harness.ports.segments import SegmentLocator, SegmentStore
    from harness.ports.signer import Signer
    from harness.retention.scheduled import ArchiverFactory


def archive_rows(store: SqlStore) -> ArchiveRows:
    """The archive's port over a store: what an archive pass reads, and its one prune."""
    return RetentionStore(store)


def erasure_rows(store: SqlStore) -> ErasureRows:
    """The erasure's port over a store."""
    return ErasureStore(store)


def open_segment_store(url: str | None = None, endpoint: str | None = None) -> SegmentStore:
    """The segment store `url` names (default HARNESS_ARCHIVE_URL, else ./harness-archive): a directory,
    or an S3-compatible bucket (s3://bucket/prefix, at `endpoint` or HARNESS_ARCHIVE_S3_ENDPOINT)."""
    return storage.open_segment_store(url, endpoint, s3=S3SegmentStore)


def segment_locator(endpoint: str | None = None) -> SegmentLocator:
    """Finds the store holding a segment from its location (a file:// or s3:// URL)."""
    return lambda location: storage.store_of(location, endpoint, s3=S3SegmentStore)


def read_location(location: str, endpoint: str | None = None) -> bytes:
    """The bytes of the segment at `location`."""
    return segment_locator(endpoint)(location).get(location)



def make_archiver(store: SqlStore, directory: Path | None, witnesses: Sequence[str],
                  policy: RetentionPolicy | None = None, segments: SegmentStore | None = None,
                  signer: Signer | None = None, rule: OutboundRule | None = None) -> Archiver:
    """An archiver as the settings describe it (HARNESS_ARCHIVE_URL, the checkpoint directory, the signer)."""
    ws: list[Witness] = [open_witness(w, rule) for w in witnesses]
    return Archiver(RetentionStore(store), segments or open_segment_store(),
                    directory or checkpoint_dir(None, store.database_id()),
                    policy=policy or RetentionPolicy.from_env(), witnesses=ws, signer=signer)


def archiver_factory(store: SqlStore, directory: Path | None,
                     witnesses: Sequence[str], signer: Signer | None = None,
                     rule: OutboundRule | None = None) -> ArchiverFactory:
    """Makes the archiver of each scheduled pass (the segment store is opened per pass, from the settings)."""
    return lambda policy: make_archiver(store, directory, witnesses, policy, signer=signer, rule=rule)


def erase_user(store: SqlStore, tenant_id: str, user_id: str, *, salt: bytes | None = None,
               endpoint: str | None = None, segments: SegmentStore | None = None, vacuum: bool = True,
               vacuum_full: bool = False) -> EraseReport:
    """Erase a person's data from the database and the archive (harness.retention.erase.erase_user)."""
    return _erase_user(ErasureStore(store), tenant_id, user_id, salt=salt, segments=segments,
                       locate=segment_locator(endpoint), vacuum=vacuum, vacuum_full=vacuum_full)
