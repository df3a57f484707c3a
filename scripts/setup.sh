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
# The int8 weight kernel (C++, AVX2): built once into torch's extension cache.
python3 -m llmserve.models.kernels >/dev/null || true

case "$mode" in
  serve)
    if llmserve serve --help >/dev/null 2>&1; then
      exec llmserve serve "$@"
    fi
    exec llmserve engine --port 8000 "$@"
    ;;
  test)
    # The dashboard test drives headless Chromium; install it once if it is missing.
    if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 \
        && command -v apt-get >/dev/null 2>&1; then
      { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }; } \
        || echo "setup: could not install chromium; the dashboard browser test will be skipped" >&2
    fi
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
