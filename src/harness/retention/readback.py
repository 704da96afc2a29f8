"""Reading an archived Run back from its segment (`harness runs show ID --from-archive`, and
`GET /api/v1/runs/ID?from_archive=true`), checked before anything of it is shown.

The segment is checked as `harness-verify segment` checks it (the signed checkpoint, every record's
hash, the one multiproof to the signed root, the digest its chained manifest fixes, the Run's
completeness, and the Run's rows, which are what a read-back shows, against its proven records as
`harness audit verify` checks a live Run's rows). A segment that fails gives SegmentUnverifiedError
naming the first problem, never a Run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.audit.checkpoint_files import current_key
from harness.audit.formats import FormatError
from harness.audit.segment import decode, verify_segment
from harness.domain.errors import HarnessError
from harness.domain.retention import ArchivedRun
from harness.ports.segments import SegmentLocator, SegmentStoreError
from harness.retention.storage import store_of


class ReadBackError(HarnessError):
    """An archived Run could not be read back from its segment."""


class SegmentUnavailableError(ReadBackError):
    """The segment cannot be read now, or there is no checkpoint to check it against."""


class SegmentUnverifiedError(ReadBackError):
    """The segment, or the Run's rows in it, do not verify: nothing of it is shown."""


def read_back(archived: ArchivedRun, checkpoint_dir: Path, locate: SegmentLocator = store_of) -> dict[str, Any]:
    """The archived Run's line of its segment (`run`, `job`, `tables`, `records`), once the segment and
    the Run's rows in it are checked against the checkpoints of `checkpoint_dir`. `locate` gives the store
    holding the segment (harness.wiring.retention.segment_locator; the default knows local directories only)."""
    try:
        data = locate(archived.location).get(archived.location)
    except SegmentStoreError as exc:
        raise SegmentUnavailableError(str(exc)) from None
    key = current_key(checkpoint_dir)
    if key is None:
        raise SegmentUnavailableError(f"no checkpoint in {checkpoint_dir} to check the segment against")
    try:
        checked = verify_segment(data, [key], run_id=archived.run_id)
        line = next((d for d in decode(data) if d.get("run_id") == archived.run_id), None) if checked.ok else None
    except FormatError as exc:
        raise SegmentUnverifiedError(f"segment {archived.location} does not verify: {exc}") from None
    if not checked.ok:
        raise SegmentUnverifiedError(f"segment {archived.location} does not verify: {checked.failures[0]}")
    if line is None:
        raise SegmentUnverifiedError(f"run {archived.run_id} is not in {archived.location}")
    return line


def summary(line: dict[str, Any]) -> dict[str, Any]:
    """What a read-back shows of the Run: its outcome, owner, result and path (times as epoch seconds)."""
    run = line.get("run") or {}
    result = run.get("result")
    try:
        parsed = json.loads(result) if isinstance(result, str) else result
    except json.JSONDecodeError:
        parsed = result
    transitions = (line.get("tables") or {}).get("transitions", [])
    return {
        "close_reason": run.get("close_reason"), "user_id": run.get("user_id"), "session_id": run.get("session_id"),
        "retry_of": run.get("retry_of"), "result": parsed, "path": [t["to_state"] for t in transitions],
        "transitions": [{"seq": t["seq"], "from_state": t["from_state"], "to_state": t["to_state"], "at": t["at"],
                         "actor": t["actor"], "reason": t["reason"], "forced_by": t.get("forced_by")}
                        for t in transitions],
        "records": len(line.get("records", [])),
    }
