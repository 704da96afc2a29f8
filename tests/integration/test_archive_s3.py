"""Segments on an S3-compatible bucket: moto's standalone server on a loopback port, in a process of its
own, spoken to by the boto3 adapter exactly as a real bucket would be."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.config import archive_rows, open_segment_store, read_location
from harness.drive.state_machine import StateMachine
from harness.ports.segments import SegmentStoreError
from harness.retention.archiver import Archiver
from harness.retention.policy import DAY_S, RetentionPolicy
from tests.integration.bulk_runs import clone, drive
from tests.integration.conftest import wait_for_port

boto3 = pytest.importorskip("boto3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto_server on 127.0.0.1, with credentials it accepts (it checks none), stopped afterwards."""
    port = _free_port()
    server = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    try:
        assert wait_for_port(port, timeout_s=30), "moto_server did not start"
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="runs-archive")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


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
