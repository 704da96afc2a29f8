#!/usr/bin/env bash
# Install harness-kernel with its test extras into the active Python and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -e ".[test]"
bash scripts/services.sh
# The architecture's import contracts (pyproject.toml [tool.importlinter]): a violation fails here.
lint-imports --no-cache
# Three workers on two cores: most of the slow tests wait on subprocesses, servers and leases, not the CPU
# (the slowest tests: 436 s with two workers, 393 s with three, on this two-core machine).
python -m pytest -q -n 3 --durations=25 "$@"
