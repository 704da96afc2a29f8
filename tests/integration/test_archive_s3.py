"""Segments on an S3-compatible bucket: moto's standalone server on a loopback port, in a process of its
own, spoken to by the boto3 adapter exactly as a real bucket would be."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.drive.state_machine import StateMachine
from harness.ports.segments import SegmentStoreError
from harness.retention.archiver import Archiver
from harness.retention.policy import DAY_S, RetentionPolicy
from harness.wiring.retention import archive_rows, open_segment_store, read_location
from tests.integration.bulk_runs import clone, drive

boto3 = pytest.importorskip("boto3")


def test_segments_go_to_the_bucket_and_prove_from_there(s3_endpoint: str, tmp_path: Path) -> None:
    """An archive pass writes its segment as one object; it reads back byte for byte and is never
    overwritten; an unknown bucket is a clear error and prunes nothing."""
    clock = FakeClock()
    store = SqlStore.open(str(tmp_path / "h.db"), clock)
    machine = StateMachine(store)
    clone(store, drive(machine), 9)
    clock.advance(5 * DAY_S)
    segments = open_segment_store("s3://runs-archive/prod/segments", s3_endpoint)
    missing = Archiver(archive_rows(store), open_segment_store("s3://no-such-bucket", s3_endpoint), tmp_path / "cp",
                       policy=RetentionPolicy(days=1))
    with pytest.raises(SegmentStoreError, match="no-such-bucket"):
        missing.run()
    assert len(store.list_runs()) == 10
    report = Archiver(archive_rows(store), segments, tmp_path / "cp", policy=RetentionPolicy(days=1)).run()
    assert report.runs == report.pruned_runs == 10
    assert report.location and report.location.startswith("s3://runs-archive/prod/segments/segment-")
    listed = boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket="runs-archive", Prefix="prod/")
    assert [o["Size"] for o in listed["Contents"]] == [report.bytes]
    data = read_location(report.location, s3_endpoint)
    assert len(data) == report.bytes
    with pytest.raises(SegmentStoreError, match="never replaced"):
        segments.put(Path(report.location).name, b"other bytes")
    assert read_location(report.location, s3_endpoint) == data
