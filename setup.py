"""Builds llmserve's C++ kernels into the package at install time.

Everything else about the package is in pyproject.toml. The kernels are a
``torch.utils.cpp_extension`` extension, as the field's packages ship theirs, so
an installed llmserve never compiles at run time. They need torch's headers at
build time: ``scripts/setup.sh`` installs with ``--no-build-isolation`` after the
locked torch. Where torch cannot be imported (an isolated build would pull a
CUDA torch from PyPI, so it is not a build requirement), the package installs
without them and :mod:`llmserve.models.kernels` says at run time that it builds
them, and why, before it does.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("_llmserve_kernels_spec", HERE / "llmserve/models/kernels.py")
kernels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernels)  # plain stdlib at import: no torch, no llmserve


def _extension():
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("llmserve: torch is not importable at build time; the C++ kernels will be built "
              "on first use instead (install with --no-build-isolation after torch)", file=sys.stderr)
        return [], {}

    # The library carries the digest of what it was built from: one of other sources is not used.
    flags = kernels.FLAGS.split() + [f"-DLLMSERVE_SOURCES_DIGEST=d{kernels.digest()}"]
    ext = CppExtension(kernels.PACKAGED, [str(p.relative_to(HERE)) for p in kernels.sources()],
                       extra_compile_args=flags, extra_link_args=["-fopenmp"],
                       optional=True)  # no compiler: the package still installs (fallback at run time)
    return [ext], {"build_ext": BuildExtension}


# The picker's score over column scorers (plain C, no torch): the same picks as its Python
# path, which runs where this is not built.
COLUMNS = Extension("llmserve.gateway.balancer._columns", ["llmserve/gateway/balancer/_columns.c"],
                    extra_compile_args=["-O2"], optional=True)

ext_modules, cmdclass = _extension()
setup(ext_modules=[*ext_modules, COLUMNS], cmdclass=cmdclass)
