#!/usr/bin/env bash
# Prints the pip arguments under which the locked torch, the CPU build, is found:
# nothing where pip's own sources have it (a machine's local wheel folder, a mirror),
# else PyTorch's CPU wheel index. PyPI has no "+cpu" build, and its plain torch is the
# multi-GB CUDA one, which the lock's pin and hashes refuse: a CUDA build is never pulled.
#   usage: scripts/torch-source.sh PYTHON
#   LLMSERVE_TORCH_INDEX overrides the index; LLMSERVE_LOCK the lock file (the tests' own)
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:?usage: scripts/torch-source.sh PYTHON}"
index="${LLMSERVE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
torch_pin="$(grep -m1 -o '^torch==[^ ]*' "${LLMSERVE_LOCK:-requirements/lock.txt}")"
if "$py" -m pip install --dry-run --no-deps --ignore-installed --quiet --disable-pip-version-check \
     --retries 0 --timeout 15 "$torch_pin" >/dev/null 2>&1; then
  exit 0
fi
echo "--extra-index-url $index"
