"""The packed-bitmask kernel against a bit-by-bit reference."""

from __future__ import annotations

import torch

from llmserve.engine.grammar import apply_bitmask, bitmask_words


def test_apply_bitmask_matches_the_bits_for_any_rows():
    gen = torch.Generator().manual_seed(0)
    vocab = 1000  # not a multiple of 32: the last word is partly padding
    logits = torch.randn(5, vocab, generator=gen)
    masks = torch.randint(-2**31, 2**31 - 1, (3, bitmask_words(vocab)), dtype=torch.int32, generator=gen)
    rows = [0, 2, 3]
    out = logits.clone()
    apply_bitmask(out, masks, rows)
    for r in range(5):
        for t in range(vocab):
            allowed = r not in rows or (int(masks[rows.index(r), t // 32]) >> (t % 32)) & 1
            assert out[r, t] == (logits[r, t] if allowed else float("-inf"))
    whole = logits[:3].clone()
    apply_bitmask(whole, masks, [0, 1, 2])
    assert torch.equal(torch.isinf(whole[1]), torch.isinf(out[2]))  # mask row 1 on both
