"""The kernel tests' gate: a kernel that cannot build fails in CI, and only there."""

from __future__ import annotations

import pytest

from llmserve.models import kernels
from tests.kernel_gate import require_kernels


@pytest.mark.parametrize("ci,cpu,outcome", [("true", True, pytest.fail.Exception),
                                            ("", True, pytest.skip.Exception),
                                            ("true", False, pytest.skip.Exception)])
def test_a_failed_build_fails_in_ci_and_skips_elsewhere(monkeypatch, ci, cpu, outcome):
    monkeypatch.setattr(kernels, "load", lambda: None)
    monkeypatch.setattr(kernels, "cpu_supported", lambda: cpu)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome):
        require_kernels()


def test_a_built_kernel_is_handed_over(monkeypatch):
    built = object()
    monkeypatch.setattr(kernels, "load", lambda: built)
    assert require_kernels() is built
