#!/usr/bin/env bash
# Install harness-kernel with its test extras into the active Python and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -e ".[test]"
bash scripts/services.sh
# The architecture's import contracts (pyproject.toml [tool.importlinter]): a violation fails here.
lint-imports --no-cache
python -m pytest -q -n 2 --durations=25 "$@"
