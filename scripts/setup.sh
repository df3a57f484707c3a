#!/usr/bin/env bash
# One entry point for a fresh machine:
#   bash scripts/setup.sh          install everything, fetch the default model, serve it
#   bash scripts/setup.sh test     install everything, fetch the default model, run the test suite
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-serve}"
shift || true

python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
llmserve pull --quiet

case "$mode" in
  serve)
    if llmserve serve --help >/dev/null 2>&1; then
      exec llmserve serve "$@"
    fi
    exec llmserve engine --port 8000 "$@"
    ;;
  test)
    set +e
    python3 -m pytest -q -p no:cacheprovider "$@"
    rc=$?
    if [ "$rc" -eq 5 ]; then
      echo "pytest collected no tests: failing" >&2
      exit 1
    fi
    exit "$rc"
    ;;
  *)
    echo "usage: bash scripts/setup.sh [serve|test] [args...]" >&2
    exit 2
    ;;
esac
