"""A documented extra installs into a clean virtualenv and its command starts: `pip install ".[scale]"`
gives a `harness worker` that runs with the Redis broker (kombu's Redis transport needs `packaging`,
which only its `redis` extra brings). scripts/check_extras.sh checks every extra; .ci/run runs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.skipif(os.environ.get("HARNESS_EXTRAS_CHECKED") == "1",
                    reason="scripts/check_extras.sh checked every extra earlier in this run (.ci/run)")
def test_the_scale_extra_installs_clean_and_its_worker_starts() -> None:
    """The scale extra, installed alone into a fresh virtualenv, starts a worker that keeps running."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "check_extras.sh"), "scale"], capture_output=True,
                          text=True, timeout=1200, check=False)
    assert done.returncode == 0 and "extra scale: ok" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
