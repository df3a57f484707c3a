"""Engine outputs to OpenAI's response JSON: one ``ChoiceWriter`` per choice, whole
(``final``) or streamed (``chunks``), with tool calls, echo and logprobs as OpenAI
shapes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from llmserve.api.stream_format import IDS_FIELD, attach_ids, head
from llmserve.engine.outputs import RequestOutput, TokenLogprob
from llmserve.server.reasoning_parser import END, Reasoning, ReasoningParser
from llmserve.server.tool_formats import tool_call_parser
from llmserve.server.tool_parser import CallArguments, CallStart, Content, Event


@dataclass
class ResponseMeta:
    id: str
    created: int
    model: str
    chat: bool
    n: int  # choices per prompt
    logprobs: bool
    tool_calls: bool = False  # parse the output for calls (tools offered, tool_choice not "none")
    parallel_tool_calls: bool = True
    token_ids: bool = False  # return_token_ids: each choice carries its (new) token ids
    resumed: list[int] | None = None  # output another instance streamed (server/resume.py)
    tool_parser: str = "hermes"  # tool_formats.TOOL_CALL_PARSERS
    reasoning_parser: str | None = None  # reasoning_parser.REASONING_PARSERS
    prompt_phase: str | None = None  # where the prompt left the reasoning (reasoning_gate.first_phase)
    call_ids: Callable[[], str] | None = None  # ids the model's template takes back (formats.call_ids)
    tool_mode: str = "auto"  # ChatCompletionRequest.tool_mode

    @property
    def forced_calls(self) -> bool:
        """tool_choice required or named: the output is calls only, so text the parser gives back
        (a call cut by max_tokens before its name was read) is markup, never content."""
        return self.tool_mode in ("required", "named")

    def envelope(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**head(self.id, obj, self.created), "model": self.model, "choices": choices, **extra}


class ChoiceWriter:
    """One choice: what the client has been sent of it, and what to send next."""

    def __init__(self, index: int, meta: ResponseMeta, tokenizer: Any, echo: str | None = None) -> None:
        self.index, self.meta, self.tok, self.echo = index, meta, tokenizer, echo
        self.parser = tool_call_parser(meta.tool_parser, meta.parallel_tool_calls) if meta.tool_calls else None
        if self.parser is not None and meta.call_ids is not None:
            self.parser.new_id = meta.call_ids
        self.reasoning = ReasoningParser(meta.reasoning_parser, meta.prompt_phase) \
            if meta.chat and meta.reasoning_parser else None
        self.started = False
        self.reasoning_tokens: int | None = None  # once finished, with a reasoning parser
        self.text_offset = len(echo or "")
        self.unsent_ids: list[int] = []  # token ids of outputs that made no chunk yet
        if meta.resumed:  # the client has the first chunks (the role, the echo) already
            self.started = True
            if meta.logprobs and not meta.chat:
                self.text_offset += sum(len(self._token_text(t)) for t in meta.resumed)

    # ---- whole ------------------------------------------------------------------------
    def final(self, out: RequestOutput) -> dict[str, Any]:
        c = out.outputs[0]
        lp = self.logprobs(_visible(c.logprobs, out)) if self.meta.logprobs else None
        ids = {IDS_FIELD: list(c.token_ids)} if self.meta.token_ids else {}
        if not self.meta.chat:
            return {"index": self.index, "text": (self.echo or "") + c.text, "logprobs": lp,
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason, **ids}
        text = c.text
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.reasoning is not None:  # tool calls are read after the reasoning
            self.reasoning.feed(text)
            self.reasoning.finish()
            text = message["content"] = self.reasoning.content
            self._count_reasoning(out)
            # both names, as vLLM's two generations of clients read them (0.10+ "reasoning")
            message["reasoning"] = message["reasoning_content"] = self.reasoning.reasoning or None
        calls: list[dict[str, Any]] = []
        if self.parser is not None:
            self.parser.feed(text)
            self.parser.finish()
            calls = self.parser.tool_calls()
            content = "" if self.meta.forced_calls else self.parser.content
            message["content"] = content if content.strip() or not (calls or self.meta.forced_calls) else None
            if calls:
                message["tool_calls"] = calls
        if self.reasoning is not None and not message["content"]:
            message["content"] = None  # reasoning only (cut short, or no answer): null, as vLLM's
        return {"index": self.index, "message": message, "logprobs": lp,
                "finish_reason": self._finish_reason(c.finish_reason, bool(calls)), "stop_reason": c.stop_reason,
                **ids}

    # ---- streamed ---------------------------------------------------------------------
    def chunks(self, out: RequestOutput) -> list[dict[str, Any]]:
        """The stream choices this output adds (none when it adds nothing a client sees).

        With ``token_ids``, the first choice carries every token id since the last chunk,
        as its last key: the ids a client has are exactly those of the text it has."""
        choices = self._chunks(out)
        if self.meta.token_ids:
            self.unsent_ids += out.outputs[0].delta_token_ids
            if choices:
                attach_ids(choices[0], self.unsent_ids)
                self.unsent_ids = []
        return choices

    def _chunks(self, out: RequestOutput) -> list[dict[str, Any]]:
        c = out.outputs[0]
        lps = _visible(c.delta_logprobs, out)
        lp = self.logprobs(lps) if self.meta.logprobs and lps else None
        if not self.meta.chat:
            text = c.delta_text
            if not self.started:
                text, self.started = (self.echo or "") + text, True
            elif not (text or out.finished or lp):
                return []
            choice = {"index": self.index, "text": text, "logprobs": lp, "finish_reason": None}
            return self._end([choice], out)
        deltas: list[dict[str, Any]] = []
        text = c.delta_text
        if self.reasoning is not None:
            split = self.reasoning.feed(text) + (self.reasoning.finish() if out.finished else [])
            deltas += [{"reasoning": e.text, "reasoning_content": e.text} for e in split if isinstance(e, Reasoning)]
            text = "".join(e.text for e in split if isinstance(e, Content))
        if self.parser is None:
            if text:
                deltas.append({"content": text})
        else:
            events = self.parser.feed(text) + (self.parser.finish() if out.finished else [])
            deltas += [_delta(e) for e in events if not (self.meta.forced_calls and isinstance(e, Content))]
        if not self.started:
            deltas = deltas or [{"content": ""}]
            deltas[0] = {"role": "assistant", **deltas[0]}
            self.started = True
        if lp is not None and not deltas:
            deltas.append({})
        if out.finished and not deltas:
            deltas.append({})
        choices = [{"index": self.index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas]
        if choices:
            choices[0]["logprobs"] = lp
        return self._end(choices, out)

    def _count_reasoning(self, out: RequestOutput) -> None:
        """Of the output's tokens, those up to the end of the reasoning (its closing tag, else all)."""
        if self.reasoning is None or self.tok is None:
            return
        ids = list(out.outputs[0].token_ids)
        has_end = lambda k: END in self.tok.decode(ids[:k], skip_special_tokens=False)  # noqa: E731
        if not self.reasoning.reasoning or not ids or not has_end(len(ids)):
            self.reasoning_tokens = len(ids) if self.reasoning.reasoning else 0
            return
        lo, hi = 1, len(ids)  # the shortest prefix that holds the tag
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if has_end(mid) else (mid + 1, hi)
        self.reasoning_tokens = lo

    def _end(self, choices: list[dict[str, Any]], out: RequestOutput) -> list[dict[str, Any]]:
        if out.finished:
            self._count_reasoning(out)
        if out.finished and choices:
            c = out.outputs[0]
            calls = self.parser is not None and bool(self.parser.tool_calls())
            choices[-1]["finish_reason"] = self._finish_reason(c.finish_reason, calls)
            choices[-1]["stop_reason"] = c.stop_reason
        return choices

    def _finish_reason(self, reason: str | None, called: bool) -> str | None:
        # a named tool_choice stays "stop", as OpenAI's and vLLM's: the caller chose the call
        return "tool_calls" if called and reason == "stop" and self.meta.tool_mode != "named" else reason

    # ---- logprobs ---------------------------------------------------------------------
    def _token_text(self, token_id: int) -> str:
        return self.tok.token_bytes(token_id).decode("utf-8", errors="replace")

    def logprobs(self, lps: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if lps is None:
            return None
        tb = self.tok.token_bytes
        if self.meta.chat:
            def entry(i: int, v: float) -> dict[str, Any]:
                b = tb(i)
                return {"token": b.decode("utf-8", errors="replace"), "logprob": v, "bytes": list(b)}

            return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(i, v) for i, v in lp.top]}
                                for lp in lps], "refusal": None}
        tokens, token_lps, tops, offsets = [], [], [], []
        for lp in lps:
            s = self._token_text(lp.token_id)
            tokens.append(s)
            token_lps.append(lp.logprob)
            # OpenAI always includes the sampled token: up to logprobs + 1 entries.
            top = {tb(i).decode("utf-8", errors="replace"): v for i, v in lp.top}
            top.setdefault(s, lp.logprob)
            tops.append(top)
            offsets.append(self.text_offset)
            self.text_offset += len(s)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def _visible(lps: list[TokenLogprob] | None, out: RequestOutput) -> list[TokenLogprob] | None:
    """Logprobs of the tokens that are text: a final stop token (EOS, or one of
    ``stop_token_ids``) is not, and OpenAI does not list it."""
    c = out.outputs[0]
    if lps and out.finished and c.finish_reason == "stop" and not isinstance(c.stop_reason, str) and \
            lps[-1].token_id == c.token_ids[-1]:
        return lps[:-1]
    return lps


def _delta(e: Event) -> dict[str, Any]:
    if isinstance(e, Content):
        return {"content": e.text}
    if isinstance(e, CallStart):
        return {"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                "function": {"name": e.name, "arguments": ""}}]}
    assert isinstance(e, CallArguments)
    return {"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]}


def mean_logprob(out: RequestOutput) -> float:
    """best_of's ranking: the highest log probability per token (OpenAI's definition)."""
    lps = out.outputs[0].logprobs or []
    return sum(lp.logprob for lp in lps) / len(lps) if lps else float("-inf")


def usage(prompt: int, completion: int, cached: int, reasoning: int | None = None) -> dict[str, Any]:
    """``reasoning``: the reasoning tokens of the completion (OpenAI's field), None without a parser."""
    u = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
         "prompt_tokens_details": {"cached_tokens": cached}}
    if reasoning is not None:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return u


def reasoning_total(writers: Any) -> int | None:
    counts = [w.reasoning_tokens for w in writers if w.reasoning_tokens is not None]
    return sum(counts) if counts else None


