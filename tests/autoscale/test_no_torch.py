import subprocess
import sys

MODULES = ["llmserve.autoscale.controller", "llmserve.serve.serve", "llmserve.serve.admin",
           "llmserve.autoscale.providers.local", "llmserve.autoscale.providers.ray", "llmserve.gateway.dashboard"]


def test_the_controller_never_imports_torch():
    """The controller reaches instances over HTTP only; ``llmserve serve`` stays torch-free."""
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = [m for m in ('torch', 'llmserve.engine', 'llmserve.models', 'ray') if m in sys.modules]\n"
              "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
