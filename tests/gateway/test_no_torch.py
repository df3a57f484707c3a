import subprocess
import sys

MODULES = ["llmserve.load_report", "llmserve.gateway.config", "llmserve.gateway.version_router",
           "llmserve.gateway.canary", "llmserve.gateway.admission", "llmserve.gateway.balancer",
           "llmserve.gateway.circuit", "llmserve.gateway.health", "llmserve.gateway.runtime",
           "llmserve.gateway.app"]


def test_the_gateway_never_imports_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = [m for m in ('torch', 'llmserve.engine', 'llmserve.models') "
              "if m in sys.modules]\nassert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
