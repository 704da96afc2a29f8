"""Times as the CLI shows them: ISO 8601 (UTC) in JSON, a human form on screens ("17:51 CET (in 59 min)")."""

from __future__ import annotations

import datetime as dt
import re

#: an approval request's recorded reason: "1 approval needed by 2026-12-02T16:51:04Z", or, in records written
#: before that form, "1 approval(s) by 1796197864" (epoch seconds)
DEADLINE_REASON = re.compile(r"^(\d+) approvals?(?:\(s\))?(?: needed)? by (\d{9,11}|\d{4}-\d\d-\d\dT\S+)$")


def iso(seconds: float | None) -> str | None:
    """An epoch time as ISO 8601 in UTC, to the millisecond; None stays None."""
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds")


def span(seconds: float) -> str:
    """A length of time, rounded as people say it: 40 s, 59 min, 3 h 5 min, 2 d 4 h."""
    s = round(abs(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 >= 60 else f"{s // 3600} h"
    return f"{s // 86400} d {s % 86400 // 3600} h" if s % 86400 >= 3600 else f"{s // 86400} d"


def relative(seconds: float, now: float) -> str:
    """"in 59 min" for a time ahead, "3 min ago" for one past."""
    delta = seconds - now
    return f"in {span(delta)}" if delta >= 0 else f"{span(delta)} ago"


def local(seconds: float) -> str:
    """The time in this machine's time zone, e.g. 2026-12-02 17:51 CET."""
    return dt.datetime.fromtimestamp(seconds).astimezone().strftime("%Y-%m-%d %H:%M %Z")


def human(seconds: float, now: float) -> str:
    """A time for a screen: when in local time, and how far off it is ("2026-12-02 17:51 CET (in 59 min)")."""
    return f"{local(seconds)} ({relative(seconds, now)})"


def approvals_needed(count: int, deadline: float) -> str:
    """The reason an approval request records: how many approvals, by when (ISO 8601, UTC)."""
    when = dt.datetime.fromtimestamp(deadline, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{count} approval{'s' if count != 1 else ''} needed by {when}"


def parse_deadline_reason(reason: str) -> tuple[int, float] | None:
    """(approvals needed, deadline in epoch seconds) from an approval request's recorded reason; None for
    any other reason."""
    match = DEADLINE_REASON.match(reason or "")
    if not match:
        return None
    value = match.group(2)
    try:
        deadline = float(value) if value.isdigit() else dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
    return int(match.group(1)), deadline


def deadline_reason(reason: str, now: float) -> str:
    """An approval request's recorded reason with its deadline in the human form; other reasons as they are."""
    parsed = parse_deadline_reason(reason)
    if parsed is None:
        return reason
    count, deadline = parsed
    return f"{count} approval{'s' if count != 1 else ''} needed by {human(deadline, now)}"
