"""Does an export hold every record of its Run? (SPEC A1, A3b) For the standalone verifier: standard
library only, on the export's proven records.

The Run's RunTrace (kind "run"), written when the Run closed, names every other record the Run had by
then, its closing transaction's included (audit.commitment). An export is complete when its proven
records include the RunTrace and every record it names; records of the Run written after its close (an
audit of a late cancel) are proven but not named, and are reported as such. What cannot be proven is
said: an export with no RunTrace (cut short before the close, or taken before the Run closed), a
RunTrace newer than the checkpoint, or a Run closed by a version that did not commit to its records.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from harness.audit import commitment

#: how many missing records a failure lists by id
_LISTED = 10


@dataclass
class Completeness:
    """What the export proves about its own completeness: `missing` records fail the export, `unproven`
    says why completeness cannot be shown (the export may still be honest), `notes` the rest."""

    missing: list[str] = field(default_factory=list)
    unproven: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when every record of the Run up to its close is in the export."""
        return not self.missing and not self.unproven


def _payload(rec: dict[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(rec["payload"])
    except (TypeError, KeyError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _kinds(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))


def check(records: list[dict[str, Any]], not_covered: list[Any]) -> Completeness:
    """Judge the proven `records` of one Run; `not_covered` are the export's records newer than the
    checkpoint (listed, not proven)."""
    found = Completeness()
    traces = [r for r in records if r.get("kind") == "run"]
    if not traces:
        later = [r for r in not_covered if isinstance(r, dict) and r.get("kind") == "run"]
        found.unproven.append(
            "the Run's RunTrace is newer than the checkpoint: publish a checkpoint and export again" if later else
            "the export holds no RunTrace: it ends before the Run's close (cut short, or taken before the Run "
            "closed), so nothing proves that no record is withheld")
        return found
    trace = traces[-1]
    payload = _payload(trace)
    _transitions(records, payload, found)
    if commitment.RECORDS_KEY not in payload:
        found.unproven.append("this Run was recorded by a version that did not commit to its record count: "
                              "the export's completeness is unproven (its transitions are all present)")
        return found
    try:
        named = commitment.decode(payload[commitment.RECORDS_KEY])
    except commitment.CommitmentError as exc:
        found.missing.append(f"the RunTrace's record commitment is malformed: {exc}")
        return found
    present = {str(r.get("record_id")): str(r.get("kind")) for r in records if r is not trace}
    missing = sorted((rid, kind) for rid, kind in named.items() if rid not in present)
    if missing:
        listed = "; ".join(f"{kind} record {rid}" for rid, kind in missing[:_LISTED])
        more = f" and {len(missing) - _LISTED} more" if len(missing) > _LISTED else ""
        found.missing.append(
            f"records withheld: the RunTrace commits to {len(named)} records of the Run, the export lacks "
            f"{len(missing)} of them ({_kinds(Counter(k for _, k in missing))}): {listed}{more}")
    extra = Counter(kind for rid, kind in present.items() if rid not in named)
    if extra:
        found.notes.append(f"{sum(extra.values())} record(s) of the Run were written after its close and are not "
                           f"named by its RunTrace ({_kinds(extra)})")
    return found


def _transitions(records: list[dict[str, Any]], payload: dict[str, Any], found: Completeness) -> None:
    """The RunTrace lists the Run's path: every transition, the final one included, must be there."""
    listed = payload.get("transitions", [])
    present = [_payload(r).get("to") for r in records if r.get("kind") == "transition"]
    if present != listed:
        found.missing.append(f"the RunTrace lists transitions {listed} but the export holds {present} "
                             "(records withheld)")
