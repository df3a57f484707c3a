#!/usr/bin/env bash
# One entry point for a fresh machine:
#   bash scripts/setup.sh          install everything, fetch the default model, serve it
#   bash scripts/setup.sh test     install everything, fetch the default model, run the test suite
#
# Everything goes into .venv inside the checkout, exactly as requirements/lock.txt
# says (pinned, hashed); the system interpreter is never touched. Afterwards the CLI
# is .venv/bin/llmserve (or `source .venv/bin/activate`). Refresh the lock with
# scripts/lock.sh; try the newest allowed versions with scripts/check-latest.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-serve}"
shift || true

venv="${LLMSERVE_VENV:-.venv}"
py="$venv/bin/python"

if [ ! -x "$py" ] || ! "$py" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  rm -rf "$venv"
  python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
fi
pip() {  # quiet; and without the warnings some machines' file:// index settings print per package
  "$py" -m pip --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
# --no-deps: the lock is the whole set, so pip resolves nothing and fetches nothing else.
# torch's CPU build: from pip's own sources where they have it, else PyTorch's CPU index.
read -r -a torch_source <<< "$(bash scripts/torch-source.sh "$py")"
pip install --quiet --require-hashes --no-deps -r requirements/lock.txt "${torch_source[@]}"
# Builds the C++ kernels into the package (setup.py; about a minute on two cores).
pip install --quiet --no-deps --no-build-isolation -e .
# Fail now, not in the middle of a test, if the venv is not the lock.
"$py" -m pip check >/dev/null || { "$py" -m pip check; exit 1; }

"$venv/bin/llmserve" pull --quiet
# The kernels in use: the installed build (a run-time build or the fallback is said here).
kernels="$("$py" -m llmserve.models.kernels 2>/dev/null || echo "not importable")"
[ "$kernels" = "installed build" ] || echo "setup: C++ kernels: $kernels" >&2

install_system() {
  # System packages the tests drive as real services: headless Chromium (the dashboard
  # test) and redis-server (gateway replicas' shared state; `serve --replicas` too).
  local want=()
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || want+=(chromium)
  command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
  [ "${#want[@]}" -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || { echo "setup: no apt-get; install ${want[*]} by hand" >&2; return 0; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${want[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${want[@]}" >/dev/null 2>&1; } \
    || echo "setup: could not install ${want[*]}; the tests that drive them cannot run" >&2
}

case "$mode" in
  serve)
    exec "$venv/bin/llmserve" serve "$@"
    ;;
  test)
    install_system
    set +e
    "$py" -m pytest -q -p no:cacheprovider "$@"
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
