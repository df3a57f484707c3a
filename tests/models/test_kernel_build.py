"""The C++ kernels come from the install, not from a build at run time (issue 28)."""

from __future__ import annotations

import logging
import os

import pytest

from llmserve.models import kernels


def test_the_installed_build_is_the_one_loaded():
    module, why = kernels.packaged()
    if module is None and not os.environ.get("CI"):
        pytest.skip(f"this checkout's kernels are not the installed build ({why}); "
                    "`pip install -e . --no-build-isolation` builds them")
    assert module is not None, why  # CI installs with setup.sh: the package must carry them
    assert module.sources_digest == f"d{kernels.digest()}"
    kernels.load.cache_clear()
    try:
        assert kernels.origin() == "installed build"
    finally:
        kernels.load.cache_clear()


def test_a_build_at_run_time_says_why_before_it_starts(monkeypatch, tmp_path, caplog):
    """Sources changed since the install: the log says so, and where it builds, before the build runs."""
    import torch.utils.cpp_extension as cpp

    order: list[str] = []
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "digest", lambda: "0123456789abcdef")  # as if csrc had changed

    def build(**kw):
        order.append("build")
        raise RuntimeError("not building in this test")

    monkeypatch.setattr(cpp, "load", build)
    kernels.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=kernels.__name__):
            caplog.handler.emit = (lambda emit: lambda record: (order.append("log"), emit(record)))(caplog.handler.emit)
            if kernels.cpu_supported():
                assert kernels.load() is None  # the build failed: the fp32 fallback
    finally:
        kernels.load.cache_clear()
    if not kernels.cpu_supported():
        pytest.skip("no AVX2/FMA/F16C: the kernels are never built here")
    assert order[:2] == ["log", "build"]
    said = caplog.records[0].getMessage()
    assert "other sources" in said or "installed without" in said
    assert str(tmp_path) in said
