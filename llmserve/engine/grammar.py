"""Grammars for structured outputs, on xgrammar: compile, match, mask.

The one module that imports xgrammar. xgrammar was chosen over llguidance by
measured cost on SmolLM2's 49k vocabulary (``benchmarks/structured/README.md``):
a next-token mask in ~5 µs against ~20 µs (p99 ~25 µs against ~150 µs).

The tokenizer info is built once per engine from llmserve's tokenizer wrapper.
Special tokens (``<|im_start|>`` and the like) are given empty text, which
xgrammar reads as "never part of a match": otherwise a JSON string could contain
a control token that the detokenizer then drops, and the text would no longer be
what the grammar accepted. The stop tokens end a match once the grammar is
complete.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Protocol

import numpy as np
import torch

from llmserve.engine.sampling_params import InvalidParameterError, StructuredOutputsParams


class Matcher(Protocol):
    """One sequence's position in its grammar (xgrammar's ``GrammarMatcher``).

    ``accept_token`` returns False, and changes nothing, for a token the grammar
    does not allow here; ``rollback(n)`` undoes the last ``n`` accepted tokens;
    ``is_terminated`` is true once a stop token ended a complete match.
    """

    def accept_token(self, token_id: int) -> bool: ...

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> Any: ...

    def rollback(self, num_tokens: int = 1) -> None: ...

    def is_terminated(self) -> bool: ...


def background_thread() -> None:
    """Run this thread at the lowest CPU priority (Linux: a thread's own nice value): a
    schema compiling beside the engine's step threads must not take a core from them,
    or every running stream's step waits at their barrier."""
    import os

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux, or not allowed: it still works, only greedier
        pass


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set to -inf, in place, the logits of ``rows`` whose bit is 0 in ``bitmask``.

    ``bitmask`` is int32 ``[len(rows), ceil(vocab / 32)]``: bit ``t % 32`` of word
    ``t // 32`` allows token ``t``. numpy unpacks the bits (little-endian words, as
    on every host torch runs on here): 0.9 ms for 16 rows of 49k tokens, where
    xgrammar's CPU kernel takes 4 ms once most tokens are masked (a JSON number)."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")[:, :logits.shape[1]]
    banned = ~torch.from_numpy(bits.view(np.bool_))
    if rows == list(range(logits.shape[0])):
        logits.masked_fill_(banned, float("-inf"))
    else:
        idx = torch.tensor(rows)
        logits[idx] = logits[idx].masked_fill(banned, float("-inf"))


class GrammarError(InvalidParameterError):
    """A schema, regex or grammar that does not compile: the caller's 400."""


class UnsupportedSchema(ValueError):
    """A JSON schema keyword the grammar would not enforce (engine/schema_support.py)."""


class GrammarBackend:
    """Compiles structured-output constraints for one tokenizer; thread-safe.

    Compiling a JSON schema takes milliseconds (more for large ones), so callers
    off the engine thread compile first (``compile``); the result is cached, and
    the engine thread's own call then finds it there.
    """

    CACHE = 64  # compiled grammars kept (each holds a token-mask cache: up to a few MB)

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.info = _tokenizer_info(xgr, tokenizer, vocab_size, stop_token_ids)
        # One compile thread: compiles run beside the engine on a small machine.
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar for ``spec`` (cached); ``GrammarError`` if it does not compile."""
        key = spec.key()
        with self._lock:  # guards the cache only: a long compile never holds up a cache hit
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            compiled = self._compile(*key, spec)
        except UnsupportedSchema as e:
            raise GrammarError(f"structured_outputs.{key[0]}", f"is not supported: {e}") from None
        except (RuntimeError, ValueError, TypeError) as e:
            raise GrammarError(f"structured_outputs.{key[0]}", f"does not compile: {_reason(e)}") from None
        if not self._starts(compiled):  # (``root ::= root``, a regex with an empty class)
            raise GrammarError(f"structured_outputs.{key[0]}", "allows no output at all: no token can begin it")
        with self._lock:
            self._cache[key] = compiled
            if len(self._cache) > self.CACHE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, kind: str, text: str, spec: StructuredOutputsParams) -> Any:
        c = self._compiler
        if kind == "json":
            return c.compile_grammar(schema_ebnf(self._xgr, text))
        if kind == "json_object":
            return c.compile_grammar(schema_ebnf(self._xgr, '{"type": "object"}', strict=False))
        if kind == "regex":
            return c.compile_regex(text)
        if kind == "choice":
            return c.compile_grammar("root ::= " + " | ".join(json.dumps(s) for s in spec.choice or []))
        if kind == "grammar":
            return c.compile_grammar(text)
        return c.compile_structural_tag(json.dumps(_fix_tag(self._xgr, json.loads(text))))

    def _starts(self, compiled: Any) -> bool:
        """Whether some token (a stop token included) may begin the output: one mask, once per compile."""
        mask = self.allocate(1)
        self.matcher(compiled).fill_next_token_bitmask(mask, 0)
        return bool(mask.any())

    def matcher(self, compiled: Any) -> Matcher:
        return self._xgr.GrammarMatcher(compiled)

    def allocate(self, rows: int) -> torch.Tensor:
        return torch.full((rows, bitmask_words(self.vocab_size)), -1, dtype=torch.int32)


# xgrammar 0.2.8 writes a string under minLength / maxLength as characters of this
# class, which lets raw control characters (U+0000-U+001F) through: not JSON, and
# json.loads refuses it. Both its string classes also take UTF-16 surrogates encoded
# as UTF-8 (ED A0-BF xx): invalid UTF-8, decoded as three U+FFFD each, which then
# overrun maxLength. One class for every JSON string character excludes both.
_LOOSE_CHAR = r'[^\"\\\r\n]'
_PLAIN_CHAR = r'[^\0-\x1f\"\\\r\n]'
_JSON_CHAR = r'[^\0-\x1f\"\\\uD800-\uDFFF]'


def schema_ebnf(xgr: Any, schema: str, strict: bool = True) -> str:
    """A JSON schema as xgrammar EBNF: one line, ``", "`` and ``": "`` separators (no runs
    of whitespace for a small model to loop in), no properties beyond the schema's.
    ``ValueError`` for a keyword the grammar would not enforce (engine/schema_support.py)."""
    from llmserve.engine.schema_support import unsupported

    try:
        why = unsupported(json.loads(schema))
    except json.JSONDecodeError:
        why = None  # (xgrammar's own refusal names the syntax error)
    if why is not None:
        raise UnsupportedSchema(why)
    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=strict))
    return ebnf.replace(_LOOSE_CHAR, _JSON_CHAR).replace(_PLAIN_CHAR, _JSON_CHAR)


def _fix_tag(xgr: Any, node: Any) -> Any:
    """A structural tag with each ``json_schema`` part given as ``schema_ebnf`` grammar."""
    if isinstance(node, list):
        return [_fix_tag(xgr, x) for x in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and "json_schema" in node:
        return {"type": "grammar", "grammar": schema_ebnf(xgr, json.dumps(node["json_schema"]))}
    return {k: _fix_tag(xgr, v) for k, v in node.items()}


def _tokenizer_info(xgr: Any, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> Any:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
    # xgrammar reads the vocabulary type (byte-level, byte-fallback, raw) from the tokenizer;
    # the vocabulary itself is rebuilt below with special tokens blanked.
    meta = json.loads(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size,
                                                         stop_token_ids=stop_token_ids).dump_metadata())
    vocab = [""] * vocab_size
    for text, i in tokenizer.backend.get_vocab(with_added_tokens=True).items():
        if i < vocab_size:
            vocab[i] = text
    for i, added in tokenizer.backend.get_added_tokens_decoder().items():
        if added.special and i < vocab_size:
            vocab[i] = ""
    return xgr.TokenizerInfo(vocab, xgr.VocabType(meta["vocab_type"]), vocab_size=vocab_size,
                             stop_token_ids=stop_token_ids, add_prefix_space=meta["add_prefix_space"])


def _reason(e: Exception) -> str:
    msg = str(e).strip()
    # xgrammar prefixes "[time] /path/file.cc:line: "; the rest is the reason.
    if "] " in msg and ".cc:" in msg:
        msg = msg.split(": ", 1)[-1]
    return msg.splitlines()[0][:300] if msg else type(e).__name__
