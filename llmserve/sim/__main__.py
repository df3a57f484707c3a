"""``python -m llmserve.sim``: the same as ``llmserve simulate``."""

from llmserve.sim.cli import main

raise SystemExit(main())
