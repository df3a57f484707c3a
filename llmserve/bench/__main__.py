"""``python -m llmserve.bench``: the same as ``llmserve bench``."""

import sys

from llmserve.bench.cli import main

sys.exit(main())
