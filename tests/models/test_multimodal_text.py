"""A multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration: Gemma 3 4B and up) loads
as its text decoder: logits on text equal transformers' own model's."""

from __future__ import annotations

import torch

from llmserve.models.hf_loader import HFLoader
from tests.models.test_gguf_families import _logits


def test_gemma3_multimodal_checkpoint_serves_its_text_decoder(tmp_path):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    text = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=12,
                sliding_window_pattern=3, max_position_embeddings=512)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=16)
    config = Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                          image_token_index=383, boi_token_index=381, eoi_token_index=382)
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.1 * torch.randn_like(p))
    hf.save_pretrained(tmp_path / "g3")
    mc, weights = HFLoader().load(tmp_path / "g3")
    assert mc.family == "gemma3" and mc.layer_types == ["sliding_attention", "sliding_attention", "full_attention"]
    assert not any("vision" in n for n in weights)
    ids = torch.randint(0, 380, (30,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(_logits(mc, weights, ids), ref, atol=1e-4, rtol=1e-4)
