"""Where the set-up finds torch's CPU build (``scripts/torch-source.sh``), without a network.

Each case runs pip with an isolated configuration (no config files, none of the
machine's ``PIP_*`` variables) over local stand-ins: "PyPI", an index holding only a
plain ``torch`` (PyPI's is the CUDA build); "PyTorch's CPU index", one holding only
``torch 2.13.0+cpu``; and a local wheel folder. The wheels are tiny fakes, pinned by
their own hashes in a lock of the test's, so the real lock's hash logic is what runs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "torch-source.sh"


def _wheel(folder: Path, version: str) -> Path:
    """A minimal valid wheel of a package named torch."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{version}-py3-none-any.whl"
    files = {"torch/__init__.py": f"__version__ = {version!r}\n",
             f"torch-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
             f"torch-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text)}")
    files[f"torch-{version}.dist-info/RECORD"] = "\n".join(record + [f"torch-{version}.dist-info/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _index(root: Path, wheel: Path) -> str:
    """A PEP 503 simple index holding one wheel; its file:// URL."""
    (root / "torch").mkdir(parents=True, exist_ok=True)
    (root / "torch" / wheel.name).write_bytes(wheel.read_bytes())
    (root / "torch" / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    (root / "index.html").write_text('<a href="torch/">torch</a>\n')
    return root.as_uri()


@pytest.fixture
def world(tmp_path):
    cpu = _wheel(tmp_path / "built" / "cpu", "2.13.0+cpu")
    cuda = _wheel(tmp_path / "built" / "cuda", "2.13.0")  # PyPI's torch: the CUDA build
    lock = tmp_path / "lock.txt"
    lock.write_text(f"torch==2.13.0+cpu \\\n    --hash=sha256:{hashlib.sha256(cpu.read_bytes()).hexdigest()}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", LLMSERVE_LOCK=str(lock),
               PIP_INDEX_URL=_index(tmp_path / "pypi", cuda),
               LLMSERVE_TORCH_INDEX=_index(tmp_path / "torch-cpu", cpu))
    return {"env": env, "lock": lock, "cpu": cpu, "tmp": tmp_path}


def _source(env: dict) -> list[str]:
    out = subprocess.run(["bash", str(SCRIPT), sys.executable], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    return out.stdout.split()


def _install(env: dict, lock: Path, extra: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """What setup.sh runs, as a dry run: the lock, hashes required, nothing resolved."""
    report = tmp / "report.json"
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                           "--require-hashes", "-r", str(lock), "--report", str(report), *extra],
                          env=env, capture_output=True, text=True, timeout=120)


def _installed_version(tmp: Path) -> str:
    items = json.loads((tmp / "report.json").read_text())["install"]
    return next(i["metadata"]["version"] for i in items if i["metadata"]["name"] == "torch")


def test_pypi_only_takes_the_cpu_index_and_gets_the_cpu_build(world):
    extra = _source(world["env"])
    assert extra == ["--extra-index-url", world["env"]["LLMSERVE_TORCH_INDEX"]]
    done = _install(world["env"], world["lock"], extra, world["tmp"])
    assert done.returncode == 0, done.stderr
    assert _installed_version(world["tmp"]) == "2.13.0+cpu"


def test_without_the_cpu_index_the_cuda_build_is_refused_not_pulled(world):
    done = _install(world["env"], world["lock"], [], world["tmp"])
    assert done.returncode != 0
    assert not (world["tmp"] / "report.json").exists()


def test_a_local_wheel_folder_that_has_it_is_used_alone(world):
    env = {**world["env"], "PIP_FIND_LINKS": str(world["cpu"].parent)}
    assert _source(env) == []
    done = _install(env, world["lock"], [], world["tmp"])
    assert done.returncode == 0, done.stderr
    assert _installed_version(world["tmp"]) == "2.13.0+cpu"


def test_the_real_lock_pins_the_cpu_build_by_hash():
    text = (ROOT / "requirements" / "lock.txt").read_text()
    block = text[text.index("\ntorch==") + 1:].split("\n    #", 1)[0]
    assert block.startswith("torch==") and "+cpu" in block.split()[0] and "--hash=sha256:" in block
