"""``python -m llmserve.server``: one engine instance over HTTP (``server/entry.py``)."""

import sys

from llmserve.server.entry import main

sys.exit(main())
