#!/usr/bin/env bash
# Find the next upstream break before a user does: install the newest versions that
# pyproject.toml's ranges allow (not the lock) into a throwaway venv and run the suite.
# Run it before refreshing the lock (scripts/lock.sh) and whenever a dependency ships a
# major release; a failure here is a range to tighten or code to fix.
#   bash scripts/check-latest.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d "${TMPDIR:-/tmp}/llmserve-latest.XXXXXX")"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade -e '.[test]'
"$venv/bin/python" -m pip list --format=freeze > "$venv/versions.txt"
echo "newest allowed versions:"; grep -iE '^(fastapi|starlette|uvicorn|httpx|pydantic|transformers|tokenizers|openai|ray|torch|numpy)==' "$venv/versions.txt"
export TORCH_EXTENSIONS_DIR="$venv/torch_extensions"
"$venv/bin/llmserve" pull --quiet
set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
rc=$?
[ "$rc" -eq 5 ] && { echo "pytest collected no tests" >&2; exit 1; }
exit "$rc"
