"""The C++ kernels for a test, or the reason it cannot have them.

Where the CPU lacks AVX2/FMA/F16C there is nothing to build: the test is skipped.
Where it has them and the build still fails (no compiler, no ninja, a broken
source), the test is skipped on a developer's machine but fails in CI (``CI=true``,
as ``.ci/run`` sets it): a clean install must build the kernels, and a silent skip
would let every kernel test pass without one running.
"""

from __future__ import annotations

import os

import pytest

from llmserve.models import kernels


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require_kernels():
    """The compiled module; skips (fails in CI) where it cannot be had."""
    module = kernels.load()
    if module is not None:
        return module
    if not kernels.cpu_supported():
        pytest.skip("this CPU has no AVX2/FMA/F16C: the kernels cannot run here")
    if in_ci():
        pytest.fail("the C++ kernels did not build on a CPU that supports them (see the warning logged by "
                    "llmserve.models.kernels.load); CI must build them")
    pytest.skip("the C++ kernels did not build here (no compiler or ninja?)")
