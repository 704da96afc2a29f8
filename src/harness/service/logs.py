"""Structured logs (SPEC U4): one JSON object per line, carrying the run_id of the Run being worked on.

The run_id comes from the log call's `extra`, or else from the context the worker sets while it
drives a Run, so log lines written deep in the pipeline still say which Run they belong to.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: the HTTP clients' loggers: httpx and httpcore, and the renamed copies the model SDKs (openai, anthropic)
#: bring with them. Each writes a line for every request it sends, two or more a Run: kept for DEBUG, as a
#: model call that fails is logged by harness itself (`harness.llm`: the Run, the model, the error and
#: what is done about it)
HTTP_CLIENT_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2")
#: loggers whose INFO lines are routine, kept for DEBUG: the HTTP clients, and the migration tool naming
#: each of its plugins as it loads them (seven lines at every start)
ROUTINE_AT_INFO = (*HTTP_CLIENT_LOGGERS, "alembic.runtime.plugins")

current_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("harness_run_id", default=None)

#: attributes every LogRecord has; anything else on a record came from `extra`
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's ANSI-coloured copy of the message
}


@contextmanager
def run_context(run_id: str) -> Iterator[None]:
    """Tag every log line written inside the block with this run_id."""
    token = current_run_id.set(run_id)
    try:
        yield
    finally:
        current_run_id.reset(token)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call gave besides its message (its `extra`), with the run_id of the Run being
    driven when the call named none."""
    doc = {key: value for key, value in vars(record).items() if key not in _STANDARD}
    run_id = doc.get("run_id") or current_run_id.get()
    if run_id:
        doc["run_id"] = run_id
    return doc


class TextFormatter(logging.Formatter):
    """Formats a record as one line of text: time, level, logger, message, then the extras as key=value
    (`... INFO harness.service request method=GET path=/ui/runs status=200 duration_ms=3.1`)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The record as a line of text."""
        line = super().format(record)
        fields = " ".join(f"{key}={_text(value)}" for key, value in _extras(record).items() if value is not None)
        if not fields:
            return line
        head, sep, tail = line.partition("\n")  # a traceback stays below the line
        return f"{head} {fields}{sep}{tail}"


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(text) if not text or any(c.isspace() or c in '"=' for c in text) else text


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, logger, message, run_id and the extras."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        doc: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(*, json_lines: bool, level: str = "INFO") -> None:
    """Send harness and server logs to stderr, as JSON lines or as plain text."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if json_lines else TextFormatter()
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # the service logs each request itself
    routine_logs_at_debug(root.getEffectiveLevel())


def routine_logs_at_debug(level: int) -> None:
    """At a log level above DEBUG, show only the warnings and errors of the loggers `ROUTINE_AT_INFO`
    names; at DEBUG, everything."""
    for name in ROUTINE_AT_INFO:
        logging.getLogger(name).setLevel(logging.WARNING if level > logging.DEBUG else logging.NOTSET)
