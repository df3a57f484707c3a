"""load_weights: loader choice and the GGUF conversion cache in the model store."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from llmserve.models.hf_loader import HFLoader
from llmserve.models.loader import ModelLoadError
from llmserve.models.model_source import cache_dir, load_weights
from tests.helpers import make_tiny_gguf, make_tiny_llama


@pytest.fixture()
def tiny_gguf(tmp_path):
    hf = make_tiny_llama(tmp_path)
    return hf, make_tiny_gguf(hf, tmp_path / "tiny.gguf", "Q8_0")


def _equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_hf_folder_is_loaded_directly(tmp_path):
    folder = make_tiny_llama(tmp_path)
    cfg, weights = load_weights(folder, tmp_path / "store")
    ref_cfg, ref = HFLoader().load(folder)
    assert cfg == ref_cfg and _equal(weights, ref)
    assert not (tmp_path / "store").exists()  # nothing to cache for a HF folder


def test_gguf_conversion_is_cached_and_reused(tiny_gguf, tmp_path):
    _, gguf = tiny_gguf
    store = tmp_path / "store"
    cfg1, w1 = load_weights(gguf, store)
    folder = cache_dir(gguf, store)
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors"}
    cfg2, w2 = load_weights(gguf, store)
    assert cfg2 == cfg1 and _equal(w1, w2)

    # Prove the second load reads the cache: plant a marker in it.
    cached = load_file(folder / "model.safetensors")
    cached["model.norm.weight"] = torch.full_like(cached["model.norm.weight"], 7.0)
    save_file(cached, folder / "model.safetensors")
    _, w3 = load_weights(gguf, store)
    assert torch.all(w3["model.norm.weight"] == 7.0)

    # A changed source file gets a new key, so stale conversions are never served.
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert cache_dir(gguf, store) != folder
    _, w4 = load_weights(gguf, store)
    assert _equal(w4, w1)


def test_broken_cache_is_rebuilt(tiny_gguf, tmp_path):
    _, gguf = tiny_gguf
    store = tmp_path / "store"
    _, w1 = load_weights(gguf, store)
    f = cache_dir(gguf, store) / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    _, w2 = load_weights(gguf, store)
    assert _equal(w1, w2)
    _, w3 = load_weights(gguf, store)  # and the rebuilt cache is good
    assert _equal(w1, w3)


def test_without_a_store_nothing_is_written(tiny_gguf, tmp_path):
    _, gguf = tiny_gguf
    before = set(tmp_path.rglob("*"))
    load_weights(gguf)
    assert set(tmp_path.rglob("*")) == before


def test_sources_that_are_not_models(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        load_weights(tmp_path / "nope.gguf")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ModelLoadError, match="not a model"):
        load_weights(tmp_path / "weights.bin")


@pytest.mark.real_model
def test_smollm2_second_load_comes_from_the_cache(smollm2_path, tmp_path, capsys):
    t0 = time.perf_counter()
    cfg1, w1 = load_weights(smollm2_path, tmp_path)
    t1 = time.perf_counter()
    cfg2, w2 = load_weights(smollm2_path, tmp_path)
    t2 = time.perf_counter()
    assert cfg1 == cfg2 and _equal(w1, w2)
    del w1, w2
    shutil.rmtree(cache_dir(smollm2_path, tmp_path))  # 540 MB that pytest would otherwise keep
    with capsys.disabled():  # reported, never asserted: wall-clock depends on the machine
        print(f"\nSmolLM2 load: first (dequantize + cache) {t1 - t0:.2f} s, second (cached) {t2 - t1:.2f} s")


def test_the_kv_pool_buffer_is_zero_and_slabs_are_independent():
    """The KV pool is an anonymous mapping (pages mapped on first write): zero, contiguous, one slab per index."""
    from llmserve.models.llama import lazily_zeroed

    t = lazily_zeroed((4, 3, 2, 5), torch.float32)
    assert t.shape == (4, 3, 2, 5) and t.dtype == torch.float32 and t.is_contiguous()
    assert torch.count_nonzero(t) == 0
    t[1].fill_(1.0)
    assert t.sum().item() == 30 and torch.count_nonzero(t[0]) == 0 and torch.count_nonzero(t[2:]) == 0
    assert lazily_zeroed((7,), torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="Linux's /proc/self/smaps reads residency")
def test_a_kv_pool_commits_only_the_pages_written():
    """One block written in each of 30 layer regions of a 64 MB pool commits a few KiB
    each, not a huge page each (numpy's zeros asked for them: 60 MB resident)."""
    import re

    from llmserve.models.llama import lazily_zeroed

    t = lazily_zeroed((30, 4096, 3, 64), torch.float16)  # 30 x 1.5 MB
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * 2

    def resident() -> int:
        total, inside = 0, False
        for line in Path("/proc/self/smaps").read_text().splitlines():
            if m := re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line):
                inside = int(m[1], 16) < end and int(m[2], 16) > start
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
        return total

    t[:, 100:116] = 1.0  # a 16-token block in every layer
    assert resident() < 1 << 20
    assert torch.count_nonzero(t).item() == 30 * 16 * 3 * 64
