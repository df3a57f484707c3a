"""Offline Python API shaped like vLLM's ``LLM``."""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.lora.request import LoRARequest, resolve
from llmserve.engine.outputs import Logprob, RequestOutput, merge_choices
from llmserve.engine.sampling_params import SamplingParams, child_seed

# vLLM's forms too: {"prompt": text} (TextPrompt) and {"prompt_token_ids": ids} (TokensPrompt)
Prompt = str | list[int] | dict[str, Any]


def _prompt(p: Prompt) -> str | list[int]:
    if isinstance(p, dict):
        if set(p) == {"prompt"}:
            return p["prompt"]
        if set(p) == {"prompt_token_ids"}:
            return list(p["prompt_token_ids"])
        raise ValueError(f"a prompt dict has 'prompt' or 'prompt_token_ids' alone; got {sorted(p)}")
    return p


def _source(config: EngineConfig):
    from llmserve.models.store import locate

    return locate(config.model, config.model_store)


def load_engine_tokenizer(config: EngineConfig):
    """The model's tokenizer alone (the API process of a process engine needs no weights)."""
    from llmserve.models.model_source import load_tokenizer

    return load_tokenizer(*_source(config))


def build_engine(config: EngineConfig, tokenizer: Any | None = None) -> EngineCore:
    """Resolve the model (store name, .gguf path or HF folder), load it, build the core."""
    from llmserve.models.model_source import load_tokenizer, load_weights, prepared_dir

    source, store = _source(config)
    model_config, weights = load_weights(source, store)
    if tokenizer is None:
        tokenizer = load_tokenizer(source, store)
    if config.served_model_name:
        model_config.name = config.served_model_name
    core = EngineCore(config, model_config, weights, tokenizer, prepared_dir(source, store))
    del weights  # the fp32 source: what the layers did not keep goes now
    _return_freed_memory()
    return core


def _return_freed_memory() -> None:
    """Hand the heap's free pages back to the OS: glibc keeps what the weight load freed
    (~200 MB for SmolLM2's fp32 source) otherwise, and an instance's RSS is what counts."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


class LLM:
    """``LLM(model, **engine_options)``; ``generate`` runs prompts to completion, batched."""

    def __init__(self, model: str, **engine_options: Any) -> None:
        self.config = EngineConfig(model=str(model), **engine_options)
        self.engine = build_engine(self.config)
        self._ids = itertools.count()
        self._lora_ids: dict[int, str] = {}  # LoRARequest ids seen: vLLM's key, one adapter each

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: what ``generate`` uses when given none; with what the model's
        generation_config.json recommends (``models/generation_defaults.py``)."""
        return SamplingParams(**self.engine.model_config.sampling_defaults)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, priority: int | str | Sequence[int | str] | None = 0, use_tqdm: bool = False,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """``priority`` and ``lora_request``: one for all, or one per prompt (as vLLM's); a
        ``None`` adapter runs the base model. An adapter is read and registered on first use."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = [_prompt(p) for p in prompts]  # type: ignore[union-attr]
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = ([sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != len(prompts):
            raise ValueError("need one SamplingParams or one per prompt")
        prios = list(priority) if isinstance(priority, (list, tuple)) else [priority] * len(prompts)
        if len(prios) != len(prompts):
            raise ValueError("need one priority or one per prompt")
        # read before anything is added: a bad adapter path raises with nothing running
        loras, new_adapters, lora_ids = resolve(self.engine.lora, lora_request, len(prompts), self._lora_ids)
        ids: list[tuple[str, int]] = []
        added: list[str] = []
        try:
            for adapter in new_adapters:
                self.engine.lora.add(adapter)  # type: ignore[union-attr]
                added.append(adapter.name)
            for prompt, sp, prio, lora in zip(prompts, params, prios, loras):
                rid = str(next(self._ids))
                ids.append((rid, sp.n))
                for i, child in enumerate(fan_out(sp)):
                    self.engine.add_request(f"{rid}#{i}", prompt, child, priority=prio, lora_name=lora)
        except BaseException:  # all or nothing: one bad prompt leaves none of the others running
            for rid, n in ids:
                for i in range(n):
                    self.engine.abort_request(f"{rid}#{i}")
            for name in added:  # (nor this call's adapters registered)
                self.engine.lora.remove(name)  # type: ignore[union-attr]
            raise
        self._lora_ids = lora_ids
        finals: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=sum(n for _, n in ids), desc="generate")
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    finals[out.request_id] = out
                    if bar:
                        bar.update(1)
        if bar:
            bar.close()
        outs = [merge_choices([finals[f"{rid}#{i}"] for i in range(n)], rid) for rid, n in ids]
        for out, sp in zip(outs, params):
            self._vllm_logprobs(out, sp.detokenize)
        return outs

    def _vllm_logprobs(self, out: RequestOutput, decode: bool) -> None:
        """vLLM's shape: per position a dict token id -> ``Logprob``, the top ``logprobs``
        tokens ranked from 1 and the sampled one."""
        tok = self.engine.tokenizer if decode else None
        for c in out.outputs:
            if c.logprobs is None:
                continue
            steps = []
            for lp in c.logprobs:
                ranks = {t: r for r, (t, _) in enumerate(lp.top, 1)}
                entries = [(lp.token_id, lp.logprob), *((t, v) for t, v in lp.top if t != lp.token_id)]
                steps.append({t: Logprob(v, ranks.get(t), None if tok is None else tok.decode([t], False))
                              for t, v in entries})
            c.logprobs = steps  # type: ignore[assignment]

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | None = None, *, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list[dict[str, Any]] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None, chat_template: str | None = None,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
             **kw: Any) -> list[RequestOutput]:
        """vLLM's ``LLM.chat``: the model's template with these options; ``lora_request`` (one,
        or one per conversation) and ``kw`` as ``generate``."""
        if chat_template is not None:
            raise ValueError("a chat template per call is not supported: the model's is used "
                             "(llmserve engine --chat-template overrides it for a server)")
        if add_generation_prompt and continue_final_message:
            raise ValueError("continue_final_message needs add_generation_prompt=False (as vLLM)")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        convs = [[_text_parts_joined(m) for m in c] for c in convs]  # type: ignore[union-attr]
        tok = self.engine.tokenizer
        extra = {**(chat_template_kwargs or {}), **({"tools": tools} if tools else {})}
        prompts = [tok.encode_chat(c, add_generation_prompt, continue_final_message, **extra)
                   for c in convs]  # type: ignore[arg-type]
        outs = self.generate(prompts, sampling_params, lora_request=lora_request, **kw)
        for out, c in zip(outs, convs):  # vLLM's: the rendered conversation
            out.prompt = tok.apply_chat_template(c, add_generation_prompt, continue_final_message, **extra)
        return outs


def _text_parts_joined(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's content parts as the text templates read: joined by newlines, as vLLM's
    ``LLM.chat`` (and the chat endpoint) join them; a part that is not text is refused."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    for p in content:
        if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            raise ValueError(f"content part {kind!r} is not supported: the model reads text parts")
    return {**message, "content": "\n".join(p["text"] for p in content)}


def fan_out(sp: SamplingParams) -> list[SamplingParams]:
    """``n`` independent sequences; seeded requests get seeds ``seed, seed+1, ...`` (mod 2**64)."""
    if sp.n == 1:
        return [sp]
    from dataclasses import replace

    return [replace(sp, n=1, best_of=None, seed=None if sp.seed is None else child_seed(sp.seed, i))
            for i in range(sp.n)]
