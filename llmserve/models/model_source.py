"""Pick a loader for a model source, and cache GGUF conversions in the model store.

Dequantizing a GGUF file costs seconds of CPU (SmolLM2: ~10 s here) every time an
engine starts, and the autoscaler starts engines often. So the first load writes
the fp32 result as a HF folder (``config.json`` + ``model.safetensors``) under
``<store>/converted/<key>/``; later loads memory-map it. The key hashes the source's
absolute path, size and mtime, so replacing the file invalidates the entry without
reading 100 MB to hash it.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

import torch

from llmserve.models.config import ModelConfig
from llmserve.models.files import atomic_target, atomic_write_json, read_json
from llmserve.models.gguf_loader import GGUFLoader, _open
from llmserve.models.hf_loader import HFLoader
from llmserve.models.loader import ModelLoadError, UnsupportedFamily, WeightLoader
from llmserve.models.tokenizer import CACHE_FORMAT, CACHE_FORMAT_KEY, Tokenizer

log = logging.getLogger(__name__)

LOADERS: tuple[WeightLoader, ...] = (GGUFLoader(), HFLoader())
CONVERTED = "converted"
CACHE_FORMAT = 2  # bump when the converted layout changes, to orphan old entries (2: quantized_source)
SOURCE_INFO = "source.json"


def find_loader(source: Path) -> WeightLoader:
    """The first loader that claims ``source``."""
    if not source.exists():
        raise ModelLoadError(f"{source}: no such file or folder")
    for loader in LOADERS:
        if loader.can_load(source):
            return loader
    raise ModelLoadError(f"{source}: not a model (expected a .gguf file, or a folder with config.json "
                         "and *.safetensors)")


def cache_dir(source: Path, store_dir: Path) -> Path:
    """Where the fp32 conversion of a GGUF ``source`` lives in the store."""
    st = source.stat()
    ident = f"{CACHE_FORMAT}|{source.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return Path(store_dir) / CONVERTED / f"{source.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def prepared_dir(source: Path, store_dir: Path) -> Path:
    """Where prepared forms of ``source``'s weights (int8) are cached: beside a GGUF's
    conversion, or under ``<store>/prepared/`` for a HF folder (keyed like ``cache_dir``)."""
    source = Path(source)
    if isinstance(find_loader(source), GGUFLoader):
        return cache_dir(source, store_dir)
    st = (source / "config.json").stat()
    ident = f"{CACHE_FORMAT}|{source.resolve()}|{st.st_mtime_ns}"
    return Path(store_dir) / "prepared" / f"{source.name}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def refuse_unsupported(source: Path) -> ModelConfig | None:
    """Raise ``UnsupportedFamily`` when ``source`` is of a family the decoder lacks, reading
    its config only (a server checks before it starts); else its config. Other faults are
    left to the load (None)."""
    from llmserve.models.hf_loader import read_hf_config

    try:
        loader = find_loader(Path(source))
        if isinstance(loader, GGUFLoader):
            return loader.read_config(Path(source))
        return read_hf_config(Path(source))
    except UnsupportedFamily:
        raise
    except (ModelLoadError, OSError):
        return None


def check_model(source: Path) -> None:
    """Raise ``ModelLoadError`` (``UnsupportedFamily`` among them) for what would stop an
    engine starting from ``source``, reading headers and configs only, not the weights
    (a truncated file, tensors the config needs missing or misshapen, a bad tokenizer):
    ``llmserve pull`` of a local path answers before anything serves it."""
    source = Path(source)
    loader = find_loader(source)
    try:
        loader.check(source)
        if not isinstance(loader, GGUFLoader):
            Tokenizer.from_folder(source)
    except OSError as e:
        raise ModelLoadError(f"{source}: cannot read ({e})") from e


def load_weights(source: Path, store_dir: Path | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Load ``source`` (a ``.gguf`` file or a HF folder) as config + fp32 HF-named tensors.

    With ``store_dir``, a GGUF conversion is cached there and reused next time.
    """
    source = Path(source)
    loader = find_loader(source)
    if store_dir is None or not isinstance(loader, GGUFLoader):
        return loader.load(source)
    folder = cache_dir(source, store_dir)
    if (folder / "config.json").is_file():
        try:
            config, weights = HFLoader().load(folder)
            config.name = source.stem
            return config, weights
        except ModelLoadError as e:
            log.warning("discarding a broken conversion cache %s: %s", folder, e)
            shutil.rmtree(folder, ignore_errors=True)
    config, weights = loader.load(source)
    try:
        write_converted(folder, source, config, weights)
    except OSError as e:  # a read-only or full store must not stop the engine
        log.warning("could not cache the conversion of %s in %s: %s", source, folder, e)
    return config, weights


def write_converted(folder: Path, source: Path, config: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
    """Write a HF folder atomically file by file; ``config.json`` last marks it complete."""
    from safetensors.torch import save_file

    meta = {"format": "pt", "source": str(source)}
    with atomic_target(folder / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in weights.items()}, tmp, metadata=meta)
    st = source.stat()
    atomic_write_json(folder / SOURCE_INFO, {"source": str(source.resolve()), "size": st.st_size,
                                             "mtime_ns": st.st_mtime_ns, "format": CACHE_FORMAT})
    atomic_write_json(folder / "config.json", config.to_hf_dict())



def _cached_tokenizer_current(folder: Path) -> bool:
    """Whether ``folder`` holds a whole tokenizer cache of this version's format."""
    try:
        return read_json(folder / "tokenizer_config.json").get(CACHE_FORMAT_KEY) == CACHE_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def load_tokenizer(source: Path, store_dir: Path | None = None) -> Tokenizer:
    """The tokenizer of ``source``; with ``store_dir`` a GGUF-derived one is cached beside the weights."""
    source = Path(source)
    loader = find_loader(source)
    if not isinstance(loader, GGUFLoader):
        return Tokenizer.from_folder(source)
    folder = cache_dir(source, store_dir) if store_dir is not None else None
    if folder is not None and _cached_tokenizer_current(folder):
        try:
            tok = Tokenizer.from_folder(folder)
            tok.name = source.stem
            return tok
        except ModelLoadError as e:
            log.warning("rebuilding a broken cached tokenizer in %s: %s", folder, e)
    try:
        tok = Tokenizer.from_gguf(source)
    except ModelLoadError:
        # transformers' reader fails on a truncated file with a bare reshape error: ours says so
        _open(source)
        raise
    if folder is not None:
        try:
            tok.save(folder)
        except OSError as e:
            log.warning("could not cache the tokenizer of %s in %s: %s", source, folder, e)
    return tok
