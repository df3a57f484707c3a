"""The default KV pool: a share of the free memory over the instances, capped; explicit sizes win."""

from __future__ import annotations

import pytest

from llmserve.engine.config import EngineConfig
from llmserve.engine.kv_budget import KV_CAP_BYTES, KV_SHARE, available_memory, default_kv_bytes

GIB = 1 << 30


def test_the_share_of_free_memory_is_split_over_instances_and_capped():
    assert default_kv_bytes(8 * GIB, 1) == min(KV_CAP_BYTES, int(8 * GIB * KV_SHARE))
    assert default_kv_bytes(8 * GIB, 4, share=0.5, cap=4 * GIB) == GIB
    assert default_kv_bytes(8 * GIB, 8, share=0.5, cap=4 * GIB) == GIB // 2
    assert default_kv_bytes(64 * GIB, 1, share=0.5, cap=2 * GIB) == 2 * GIB
    assert default_kv_bytes(None, 4) == KV_CAP_BYTES  # unknown: the cap, as before


def test_available_memory_reads_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24683652 kB\nMemFree:  1000 kB\nMemAvailable:   2048 kB\n")
    assert available_memory(f) == 2048 * 1024
    f.write_text("MemTotal: 1 kB\n")
    assert available_memory(f) is None
    assert available_memory(tmp_path / "missing") is None


def test_the_default_pool_follows_available_memory_and_instances():
    per_token, ctx = 1 << 14, 2048  # 16 KiB a token
    cfg = EngineConfig(max_num_seqs=64, block_size=16)
    want = 64 * ctx // 4 // 16  # blocks for the batch the default aims at
    assert cfg.num_blocks_for(per_token, ctx, available=None) == want  # 512 MiB < the cap
    one = cfg.num_blocks_for(per_token, ctx, available=256 << 20)  # 128 MiB to this pool
    assert one == (128 << 20) // per_token // 16
    four = EngineConfig(max_num_seqs=64, block_size=16, instances=4).num_blocks_for(per_token, ctx, 1 << 30)
    assert four == (128 << 20) // per_token // 16
    # never below one full context
    assert cfg.num_blocks_for(per_token, ctx, available=1 << 20) == ctx // 16


def test_explicit_sizes_win_over_the_memory_share():
    assert EngineConfig(num_kv_blocks=7).num_blocks_for(1 << 14, 2048, available=1 << 20) == 7
    cfg = EngineConfig(kv_cache_memory_bytes=64 << 20, block_size=16)
    assert cfg.num_blocks_for(1 << 14, 2048, available=1 << 20) == (64 << 20) // (1 << 14) // 16


def test_instances_must_be_positive():
    with pytest.raises(ValueError, match="instances"):
        EngineConfig(instances=0)
