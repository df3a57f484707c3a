"""Test helpers shared across the suite: tiny random Llama models written as HF folders.

``make_tiny_llama`` writes what a real checkpoint folder holds (config.json,
model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json
with a ChatML template), so engine and server tests exercise the real loaders and
can use ``transformers`` on the same folder as the oracle. Deterministic: the same
arguments give the same bytes.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 as in SmolLM2
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. ",
    "Hello world! How are you today? I am fine, thank you. What is the capital of France? Paris.",
    "def main():\n    return 42\n\nfor i in range(10):\n    print(i)\n",
    "Once upon a time there was a little model that served tokens all day long.",
    "中文 日本語 한국어 😀 café naïve façade — “quotes” 1234567890",
)
DEFAULTS: dict[str, Any] = dict(
    vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)


@lru_cache(maxsize=8)
def tiny_tokenizer_json(vocab_size: int) -> str:
    """A byte-level BPE tokenizer with exactly ``vocab_size`` tokens, as tokenizer.json text.

    Byte-level, so any text encodes and multi-byte characters split across tokens
    (what the incremental detokenizer must handle). Merges are trained on a fixed
    corpus; if it runs out of merges, inert filler tokens pad the vocabulary so
    every id the model can sample decodes to something.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"a byte-level tokenizer needs vocab_size >= {256 + len(SPECIAL_TOKENS)}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(_CORPUS) * 4, trainer)
    n = tok.get_vocab_size()
    if n < vocab_size:
        tok.add_tokens([f"<|filler_{i}|>" for i in range(vocab_size - n)])
    assert tok.get_vocab_size() == vocab_size
    return tok.to_str()


def make_tiny_llama(tmp_path: Path, **overrides: Any) -> Path:
    """Write a tiny random Llama HF folder under ``tmp_path`` and return it.

    ``overrides`` are ``LlamaConfig`` fields, plus: ``seed`` (0), ``name``
    (folder name, "tiny-llama"), ``dtype`` (torch.float32; the dtype saved),
    ``chat_template`` (ChatML; None writes none). Norm weights are random around 1
    rather than exactly 1, so a model that ignores or misplaces them is caught.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    seed = overrides.pop("seed", 0)
    name = overrides.pop("name", "tiny-llama")
    dtype = overrides.pop("dtype", torch.float32)
    chat_template = overrides.pop("chat_template", CHATML_TEMPLATE)
    fields = {**DEFAULTS, **overrides}
    folder = Path(tmp_path) / name
    folder.mkdir(parents=True, exist_ok=True)

    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG alone
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**fields)).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.to(dtype).save_pretrained(folder)

    (folder / "tokenizer.json").write_text(tiny_tokenizer_json(fields["vocab_size"]), encoding="utf-8")

    cfg = {"bos_token": SPECIAL_TOKENS[1], "eos_token": SPECIAL_TOKENS[2], "unk_token": SPECIAL_TOKENS[0],
           "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast"}
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return folder


def _llama_cpp_permute(w: Any, n_head: int) -> Any:
    """What llama.cpp's convert_hf_to_gguf.py does to Q/K rows (HF rotate-half → GGML interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def make_tiny_gguf(hf_folder: Path, out: Path, quant: str = "F32") -> Path:
    """Convert a ``make_tiny_llama`` folder to GGUF the way llama.cpp does (names, Q/K permutation,
    reversed shapes, tokenizer metadata). ``quant``: F32, F16 or Q8_0 for the 2-D weights.
    Independent of the loader under test, so loading it back checks the loader.
    """
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((hf_folder / "config.json").read_text())
    tok = json.loads((hf_folder / "tokenizer.json").read_text())
    tok_cfg = json.loads((hf_folder / "tokenizer_config.json").read_text())
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(hf_folder.name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(cfg["hidden_size"] // n_head)
    # Tokenizer: vocabulary in id order, merges, specials marked as control tokens.
    vocab = {**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_bos_token_id(vocab[tok_cfg["bos_token"]])
    w.add_eos_token_id(vocab[tok_cfg["eos_token"]])
    w.add_add_bos_token(False)
    if tok_cfg.get("chat_template"):
        w.add_chat_template(tok_cfg["chat_template"])

    qtype = getattr(gguf.GGMLQuantizationType, quant)
    for name, arr in load_file(str(hf_folder / "model.safetensors")).items():
        arr = arr.astype(np.float32)
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            gname = f"blk.{layer}.{_GGUF_NAMES[rest.removesuffix('.weight')]}.weight"
        if ".self_attn.q_proj." in name:
            arr = _llama_cpp_permute(arr, n_head)
        elif ".self_attn.k_proj." in name:
            arr = _llama_cpp_permute(arr, n_kv)
        if arr.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(gname, arr)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(gname, arr.astype(np.float16))
        else:
            w.add_tensor(gname, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
