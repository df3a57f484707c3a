"""Tiny random Llama models held in memory, with Hugging Face as the oracle."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.models.config import ModelConfig


@dataclass
class TinyModel:
    hf: object
    config: ModelConfig
    weights: dict

    def engine(self, **opts) -> EngineCore:
        return EngineCore(EngineConfig(**opts), self.config, self.weights)

    def hf_greedy(self, ids: list[int], n: int) -> list[int]:
        with torch.no_grad():
            out = self.hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)
        return out[0, len(ids):].tolist()


def make_tiny(seed: int = 0, vocab: int = 384, hidden: int = 64, layers: int = 2, heads: int = 4,
              kv_heads: int = 2, tie: bool = False) -> TinyModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=tie,
                      bos_token_id=None, eos_token_id=None)
    hf = LlamaForCausalLM(cfg).eval()
    weights = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    mc = ModelConfig.from_hf_dict(cfg.to_dict(), name=f"tiny-{seed}")
    mc.eos_token_id = []
    return TinyModel(hf, mc, weights)


@pytest.fixture(scope="session")
def tiny() -> TinyModel:
    return make_tiny()


def run_to_completion(engine: EngineCore, arrivals: dict[int, list[tuple]] | None = None,
                      max_steps: int = 10_000) -> dict[str, list[int]]:
    """Step until done; ``arrivals[step]`` lists add_request argument tuples added before that step."""
    arrivals = arrivals or {}
    done: dict[str, list[int]] = {}
    step = 0
    while engine.has_unfinished() or any(s >= step for s in arrivals):
        for args in arrivals.get(step, []):
            engine.add_request(*args)
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        step += 1
        assert step < max_steps, "engine did not finish"
    return done
