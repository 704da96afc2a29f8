"""Property-based testing of the HTTP API against its own OpenAPI document (SPEC U2): whatever a caller
sends, the service answers with a documented status and body, and never with a server error.

Bounded to a few examples per operation so the whole file runs in well under a minute. The event
streams are left out: they are long-lived by design and have their own tests (test_api_events.py).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from harness.config import build_runtime
from harness.service.app import create_app
from harness.service.settings import ServiceSettings
from harness.settings import Settings
from tests.acceptance.api_helpers import key

# schemathesis registers its pytest plugin in every pytest process (the xdist controller included: ~2 s of
# imports); it is turned off in pyproject.toml and loaded here, where its parametrize is used
pytest_plugins = ["schemathesis.pytest.plugin"]

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _app() -> Any:
    """A fresh app over the support example in a temporary folder, removed when the tests end.

    Built at import time because schemathesis reads the OpenAPI document while collecting tests.
    """
    folder = Path(tempfile.mkdtemp(prefix="harness-schemathesis-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ.setdefault("HARNESS_EXAMPLE_LEDGER", str(folder / "ledger.jsonl"))
    runtime = build_runtime(Settings(db=str(folder / "api.db"), data_dir=folder / "data"))
    atexit.register(runtime.close)
    return create_app(
        runtime, ServiceSettings(session_secret="schemathesis-secret-0123", stream_lifetime_s=1.0)
    )


schema = schemathesis.openapi.from_asgi("/openapi.json", _app()).exclude(path_regex=r".*/events$")


@schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_and_never_errors(case: schemathesis.Case[Any]) -> None:
    """Every generated request gets a documented, schema-valid answer, and no 5xx."""
    case.call_and_validate(headers=key("operator"), checks=CHECKS)
