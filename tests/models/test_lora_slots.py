"""The gathered low-rank products: each row gets exactly its own adapter's delta, whatever the
layout of the step's rows (an adapter's rows in several runs, base rows between them, adapters
of different ranks and modules in one product), and base rows are left bit for bit."""

from __future__ import annotations

import pytest
import torch

from llmserve.models.config import ModelConfig
from llmserve.models.lora.adapter import LoraAdapter, model_modules
from llmserve.models.lora.slots import LoraSlots



def _config() -> ModelConfig:  # the tiny llama's shapes (no transformers import: seconds)
    return ModelConfig.from_hf_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 384,
                                     "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                     "num_attention_heads": 4, "num_key_value_heads": 2}, name="tiny")


def _adapter(config, name: str, rank: int, modules: list[str], seed: int) -> LoraAdapter:
    g = torch.Generator().manual_seed(seed)
    spots = model_modules(config)
    deltas = {(layer, m): (torch.randn(rank, spots[m].in_features, generator=g),
                           torch.randn(spots[m].stop - spots[m].start, rank, generator=g))
              for layer in range(config.num_hidden_layers) for m in modules}
    return LoraAdapter(name, name, deltas)


@pytest.mark.parametrize("use_kernels, dtype", [(True, torch.float32), (False, torch.float32),
                                                (True, torch.float16), (False, torch.float16)],
                         ids=["kernel", "torch", "kernel-fp16", "torch-fp16"])
def test_each_row_gets_its_own_adapters_delta_and_base_rows_none(use_kernels, dtype):
    config = _config()
    adapters = [_adapter(config, "a0", 4, ["q_proj", "v_proj"], 1),
                _adapter(config, "a1", 8, sorted(model_modules(config)), 2),
                _adapter(config, "a2", 2, ["k_proj", "gate_proj", "down_proj"], 3)]
    slots = LoraSlots(config, 4, 8, use_kernels=use_kernels, dtype=dtype)
    for i, a in enumerate(adapters):
        slots.write([2, 0, 3][i], a)  # slot 1 stays empty
    slot_of = {2: adapters[0], 0: adapters[1], 3: adapters[2]}
    # runs of 1-3 rows, and one of 6 (more rows than the kernel shares an A row's load over)
    row_slots = [-1, 0, 0, 2, -1, 3, 3, 3, 0, 2, 2, -1, 0, 3, 3, 3, 3, 3, 3]
    spots = model_modules(config)
    g = torch.Generator().manual_seed(0)
    slots.begin_step(row_slots)
    for layer in range(config.num_hidden_layers):
        for kind, st in slots.stacks[layer].items():
            x = torch.randn(len(row_slots), st.a.shape[2], generator=g)
            y0 = torch.randn(len(row_slots), st.groups[-1][1], generator=g)
            y = y0.clone()
            slots.add_delta(y, x, layer, kind)
            want = y0.clone()
            for row, s in enumerate(row_slots):
                for (lay, m), (a, b) in (slot_of[s].deltas.items() if s >= 0 else ()):
                    if lay == layer and spots[m].kind == kind:
                        a, b = a.to(dtype).float(), b.to(dtype).float()  # (fp16: the stored factors)
                        want[row, spots[m].start:spots[m].stop] += b @ (a @ x[row])
            assert torch.allclose(y, want, rtol=1e-5, atol=1e-4), (layer, kind, (y - want).abs().max())
            base = [r for r, s in enumerate(row_slots) if s < 0]
            assert torch.equal(y[base], y0[base])
    slots.end_step()
    y = torch.ones(len(row_slots), 64)
    slots.add_delta(y, torch.ones(len(row_slots), 64), 0, "o")
    assert torch.equal(y, torch.ones_like(y))  # no step: no delta


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_the_kernel_at_sizes_off_its_vector_widths(dtype):
    """Widths that are not multiples of 8 or 32, and segments of 1 to 9 rows: every remainder loop."""
    from llmserve.models import kernels

    k = kernels.load()
    if k is None:
        pytest.skip("no C++ kernels on this CPU")
    g = torch.Generator().manual_seed(5)
    IN, OUT, R = 37, 45, 5
    groups = [(0, 20), (20, 45)]
    a, b = torch.randn(2, 2 * R, IN, generator=g).to(dtype), torch.randn(2, R, OUT, generator=g).to(dtype)
    parts = torch.tensor([[[0, 5, 0, 20], [5, 3, 20, 45]],    # slot 0: both modules, ranks 5 and 3
                          [[0, 0, 0, 20], [0, 4, 20, 45]]])   # slot 1: the second only, rank 4
    segs = torch.tensor([[0, 0, 6], [1, 6, 7], [0, 9, 11], [1, 11, 20]])
    x, y0 = torch.randn(20, IN, generator=g), torch.randn(20, OUT, generator=g)
    y = y0.clone()
    k.lora_sgmv_(y, x, a, b, parts, segs)
    want = y0.clone()
    for slot, lo_row, hi_row in segs.tolist():
        for (lo, r, start, stop), _ in zip(parts[slot].tolist(), groups):
            if r:
                h = x[lo_row:hi_row] @ a[slot, lo:lo + r].float().T
                want[lo_row:hi_row, start:stop] += h @ b[slot, :r, start:stop].float()
    assert torch.allclose(y, want, rtol=1e-5, atol=1e-4), (y - want).abs().max()
    assert torch.equal(y[7:9], y0[7:9])  # rows no segment names


def test_a_slot_reads_back_what_was_written_and_clears():
    config = _config()
    a = _adapter(config, "a", 4, ["q_proj", "up_proj", "o_proj"], 5)
    slots = LoraSlots(config, 2, 8)
    slots.write(1, a)
    back = slots.read(1)
    assert sorted(back) == sorted(a.deltas)
    assert all(torch.equal(back[k][0], a.deltas[k][0]) and torch.equal(back[k][1], a.deltas[k][1]) for k in back)
    slots.clear(1)
    assert slots.read(1) == {} and all(st.a.abs().sum() == 0 and all(b.abs().sum() == 0 for b in st.b)
                                       for layer in slots.stacks for st in layer.values())
