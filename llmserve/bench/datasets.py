"""Request sets generated offline, with prompt lengths counted by the model's tokenizer.

Each generator returns a list of :class:`SampleRequest` in send order. Everything is
drawn from a seeded generator so a dataset is reproducible, and ``prompt_len`` is
the exact token count of the text sent on /v1/completions (see ``tokenizer.py``).

- ``random``: filler prompts and output lengths drawn uniformly in
  ``[len·(1−ratio), len·(1+ratio)]``, as vLLM's random dataset.
- ``shared-prefix``: N system prompts of L tokens, each request one of them plus a
  short question, to measure prefix caching.
- ``multi-turn``: conversations that resend their whole history every turn; a turn
  is sent only after the previous turn of its conversation finished.
- ``input-grounded``: rewrite or summarise a given text; the output copies the
  input, which is what n-gram speculation exploits.
- ``jsonl``: one JSON object per line with ``prompt`` or ``messages``, optional
  ``output_len`` (or ``max_tokens``) and ``priority``.
- ``sharegpt``: a ShareGPT JSON file (vLLM's dataset of that name, with its rules): each
  conversation's first turn is the prompt, and its answer's length the output length.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from llmserve.bench.tokenizer import Tokenizer, count_tokens, exact_text

DATASET_STREAM = 2  # sub-stream of the run seed, independent of arrivals
PRIORITY_STREAM = 3
DEFAULT_PRIORITY = "realtime"  # what llmserve's gateway assumes when no priority is sent
BATCH_PRIORITY = "batch"

Message = dict[str, str]


@dataclass(slots=True)
class SampleRequest:
    """One request to send.

    ``prompt`` is the text for /v1/completions; ``messages`` (when set) is what
    /v1/chat/completions sends instead of a single user message holding ``prompt``.
    ``depends_on`` is the index of a request that must finish before this one is sent.
    """

    prompt: str
    prompt_len: int
    output_len: int
    messages: list[Message] | None = None
    priority: str = DEFAULT_PRIORITY
    depends_on: int | None = None
    meta: dict[str, int | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.output_len < 1:
            raise ValueError(f"output length must be >= 1, got {self.output_len}")


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng((seed, DATASET_STREAM))


def _lengths(rng: np.random.Generator, n: int, mean: int, ratio: float) -> np.ndarray:
    if not 0 <= ratio < 1:
        raise ValueError(f"range ratio must be in [0, 1), got {ratio}")
    lo, hi = math.floor(mean * (1 - ratio)), math.ceil(mean * (1 + ratio))
    return rng.integers(lo, hi + 1, size=n)


def random_dataset(
    tok: Tokenizer, n: int, input_len: int, output_len: int, range_ratio: float = 0.0, seed: int = 0
) -> list[SampleRequest]:
    rng = _rng(seed)
    ins = _lengths(rng, n, input_len, range_ratio)
    outs = _lengths(rng, n, output_len, range_ratio)
    out = []
    for i, o in zip(ins.tolist(), outs.tolist()):
        text = exact_text(tok, max(i, 1), rng)
        out.append(SampleRequest(text, count_tokens(tok, text), max(o, 1)))
    return out


def shared_prefix_dataset(
    tok: Tokenizer,
    n: int,
    num_prefixes: int,
    prefix_len: int,
    question_len: int,
    output_len: int,
    seed: int = 0,
) -> list[SampleRequest]:
    """Requests cycle over the prefixes, then are shuffled so equal prefixes interleave."""
    if num_prefixes < 1:
        raise ValueError(f"number of prefixes must be >= 1, got {num_prefixes}")
    rng = _rng(seed)
    prefixes = [exact_text(tok, prefix_len, rng) for _ in range(num_prefixes)]
    out = []
    for i in range(n):
        question = exact_text(tok, question_len, rng)
        text = f"{prefixes[i % num_prefixes]}\n\n{question}"
        msgs = [{"role": "system", "content": prefixes[i % num_prefixes]}, {"role": "user", "content": question}]
        out.append(SampleRequest(text, count_tokens(tok, text), output_len, msgs, meta={"prefix": i % num_prefixes}))
    order = rng.permutation(n)
    return [out[j] for j in order.tolist()]


def render_conversation(messages: list[Message]) -> str:
    """How a conversation is sent to /v1/completions (no chat template there)."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"


def multi_turn_dataset(
    tok: Tokenizer, n: int, turns: int, user_len: int, output_len: int, seed: int = 0
) -> list[SampleRequest]:
    """``ceil(n / turns)`` conversations, listed turn by turn across conversations.

    Assistant turns in the history are synthetic text of ``output_len`` tokens (so
    the history, and its length, do not depend on what the server answered).
    """
    if turns < 1:
        raise ValueError(f"turns must be >= 1, got {turns}")
    rng = _rng(seed)
    n_conv = math.ceil(n / turns) if n else 0
    histories: list[list[Message]] = [[] for _ in range(n_conv)]
    last_index: list[int | None] = [None] * n_conv
    out: list[SampleRequest] = []
    for t in range(turns):
        for c in range(n_conv):
            if len(out) == n:
                break
            if t > 0:
                histories[c].append({"role": "assistant", "content": exact_text(tok, output_len, rng)})
            histories[c].append({"role": "user", "content": exact_text(tok, user_len, rng)})
            msgs = [dict(m) for m in histories[c]]
            text = render_conversation(msgs)
            req = SampleRequest(
                text, count_tokens(tok, text), output_len, msgs,
                depends_on=last_index[c], meta={"conversation": c, "turn": t},
            )
            last_index[c] = len(out)
            out.append(req)
    return out


GROUNDED_INSTRUCTIONS = {
    "rewrite": "Rewrite the following text, keeping every detail and the original order:",
    "summarize": "Summarise the following text:",
}


def input_grounded_dataset(
    tok: Tokenizer,
    n: int,
    input_len: int,
    output_len: int,
    task: str = "rewrite",
    source_text: str | None = None,
    seed: int = 0,
) -> list[SampleRequest]:
    """An instruction and a passage of ``input_len`` tokens; passages come from
    ``source_text`` (consecutive windows, wrapping around) or are random filler."""
    if task not in GROUNDED_INSTRUCTIONS:
        raise ValueError(f"grounded task must be one of {sorted(GROUNDED_INSTRUCTIONS)}, got {task!r}")
    rng = _rng(seed)
    source_ids = tok.encode(source_text) if source_text else []
    if source_text is not None and len(source_ids) < input_len:
        raise ValueError(f"source text has {len(source_ids)} tokens, fewer than --grounded-input-len {input_len}")
    out = []
    for i in range(n):
        if source_ids:
            start = (i * input_len) % (len(source_ids) - input_len + 1)
            passage = tok.decode(source_ids[start : start + input_len])
        else:
            passage = exact_text(tok, input_len, rng)
        text = f"{GROUNDED_INSTRUCTIONS[task]}\n\n{passage}"
        out.append(SampleRequest(text, count_tokens(tok, text), output_len))
    return out


def jsonl_dataset(tok: Tokenizer, path: str | Path, n: int, output_len: int) -> list[SampleRequest]:
    """The file's first ``n`` entries in order, repeated from the top if it has fewer."""
    entries = []
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e})") from None
            entries.append(_jsonl_entry(tok, obj, output_len, f"{path}:{lineno}"))
    if not entries:
        raise ValueError(f"{path}: no prompts")
    return [replace(entries[i % len(entries)]) for i in range(n)]


def _jsonl_entry(tok: Tokenizer, obj: dict, output_len: int, where: str) -> SampleRequest:
    out_len = int(obj.get("output_len", obj.get("max_tokens", output_len)))
    priority = str(obj.get("priority", DEFAULT_PRIORITY))
    if isinstance(obj.get("prompt"), str):
        text, msgs = obj["prompt"], None
    elif isinstance(obj.get("messages"), list):
        msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in obj["messages"]]
        text = render_conversation(msgs)
    else:
        raise ValueError(f"{where}: needs a 'prompt' string or a 'messages' list")
    return SampleRequest(text, count_tokens(tok, text), out_len, msgs, priority=priority)


# vLLM's ShareGPT filter: prompts and answers of at least 4 tokens, prompts of at most 1024,
# both together at most 2048.
SHAREGPT_MIN_LEN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


def sharegpt_dataset(tok: Tokenizer, path: str | Path, n: int, output_len: int | None,
                     seed: int = 0) -> list[SampleRequest]:
    """``n`` conversations drawn (seeded) from a ShareGPT file; fewer valid ones are drawn again."""
    if n == 0:
        return []
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of conversations")
    turns = [d["conversations"] for d in data if isinstance(d, dict) and isinstance(d.get("conversations"), list)
             and len(d["conversations"]) >= 2]
    order = _rng(seed).permutation(len(turns))
    out: list[SampleRequest] = []
    for i in order.tolist():
        if len(out) == n:
            break
        first, answer = (t.get("value") if isinstance(t, dict) else None for t in turns[i][:2])
        if not isinstance(first, str) or not isinstance(answer, str):
            continue
        p_len = count_tokens(tok, first)
        o_len = output_len or count_tokens(tok, answer)
        short = p_len < SHAREGPT_MIN_LEN or (output_len is None and o_len < SHAREGPT_MIN_LEN)
        if short or p_len > SHAREGPT_MAX_PROMPT or p_len + o_len > SHAREGPT_MAX_TOTAL:
            continue
        out.append(SampleRequest(first, p_len, o_len))
    if not out:
        raise ValueError(f"{path}: no conversation a request can be made of (two turns, prompt of 4 to "
                         f"{SHAREGPT_MAX_PROMPT} tokens, at most {SHAREGPT_MAX_TOTAL} with the answer)")
    return [replace(out[i % len(out)]) for i in range(n)]


def assign_batch_share(requests: list[SampleRequest], share: float, seed: int = 0) -> None:
    """Mark exactly ``round(share·n)`` requests, chosen at random, as ``batch`` priority.

    Requests that already carry a priority (from a JSONL file) keep it.
    """
    if not 0 <= share <= 1:
        raise ValueError(f"batch share must be in [0, 1], got {share}")
    k = round(share * len(requests))
    if k == 0:
        return
    rng = np.random.default_rng((seed, PRIORITY_STREAM))
    for i in rng.choice(len(requests), size=k, replace=False).tolist():
        if requests[i].priority == DEFAULT_PRIORITY:
            requests[i].priority = BATCH_PRIORITY
