"""Perplexity of a model on a text, and its teacher-forced top-1 tokens: the quality
checks behind a weight or activation format."""

from __future__ import annotations

import math

import torch

from llmserve.models.attention import AttentionMetadata, build_group
from llmserve.models.llama import LlamaForCausalLM


@torch.inference_mode()
def teacher_forced(model: LlamaForCausalLM, token_ids: list[int], window: int = 512,
                   kv_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Per scored position, the negative log-likelihood of the text's next token and the
    model's top-1 token, over non-overlapping windows, each scored from its own start; the
    keys and values go through a KV pool of ``kv_dtype``, as an engine's would."""
    nlls, tops = [], []
    caches = model.allocate_kv_cache(1, window, kv_dtype, grouped=False)  # one table
    n_rep = model.num_heads // model.num_kv_heads
    for start in range(0, len(token_ids) - 1, window):
        chunk = token_ids[start:start + window + 1]
        if len(chunk) < 2:
            break
        inp = torch.tensor(chunk[:-1])
        t = inp.shape[0]
        meta = AttentionMetadata(torch.arange(t), [build_group(0, t, [t], [[0]], window, n_rep)])
        hidden = model.forward(inp, torch.arange(t), meta, caches)
        logp = torch.log_softmax(model.compute_logits(hidden), dim=-1)
        nlls.append(-logp[torch.arange(t), torch.tensor(chunk[1:])].double())
        tops.append(logp.argmax(dim=-1))
    return torch.cat(nlls), torch.cat(tops)


def perplexity(model: LlamaForCausalLM, token_ids: list[int], window: int = 512,
               kv_dtype: torch.dtype = torch.float32) -> float:
    """exp(mean NLL) of :func:`teacher_forced`."""
    nll, _ = teacher_forced(model, token_ids, window, kv_dtype)
    return math.exp(float(nll.mean()))
