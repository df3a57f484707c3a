"""The gateway's modules import each other without a cycle, counting every import: at
the top, inside functions and under ``if TYPE_CHECKING:`` (a type-only cycle is still
two modules that cannot be understood apart). The runtime imports no HTTP framework."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import llmserve.gateway
from tests.import_graph import assert_acyclic

GATEWAY = Path(llmserve.gateway.__file__).parent


def test_the_gateway_modules_import_without_a_cycle():
    graph = assert_acyclic(GATEWAY, "llmserve.gateway")
    assert "llmserve.gateway.runtime" in graph and "llmserve.gateway.balancer.picker" in graph


def test_the_runtime_loads_no_http_framework():
    """The gateway's runtime (pools, router, canary, monitor) runs without FastAPI or
    Starlette: only ``app`` and the request path speak HTTP."""
    code = ("import sys\nimport llmserve.gateway.runtime\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
