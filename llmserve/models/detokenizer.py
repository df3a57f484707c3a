"""Streaming detokenization: turn generated ids into text deltas as they arrive.

Decoding one token at a time is wrong in two ways. A character can span tokens
(byte-level BPE splits an emoji into up to four byte tokens), so a lone token
decodes to U+FFFD. And some decoders change a token's text with its neighbours
(SentencePiece drops a leading space at the start of a string). So we decode a
short window: ``ids[prefix_offset:read_offset]`` is text already emitted,
``ids[prefix_offset:]`` the same plus what is new; the new text is the difference,
held back while it ends in U+FFFD (an incomplete character). This is the
technique of vLLM's and TGI's detokenizers.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence


class Decodes(Protocol):
    """What a detokenizer needs of a tokenizer (``models.tokenizer.Tokenizer`` is one)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

REPLACEMENT = "\ufffd"
PROMPT_CONTEXT = 5  # prompt tokens decoded as context for the first output tokens


class IncrementalDetokenizer:
    """Feed ids with ``add``; get the text they complete. ``finish`` flushes the rest."""

    def __init__(self, tokenizer: Decodes, prompt_ids: Sequence[int] = (),
                 skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = list(prompt_ids)
        self._prefix_offset = max(len(self.ids) - PROMPT_CONTEXT, 0)
        self._read_offset = len(self.ids)
        self._num_prompt = len(self.ids)
        self.text = ""  # everything emitted so far

    @property
    def output_ids(self) -> list[int]:
        return self.ids[self._num_prompt:]

    def add(self, new_ids: Iterable[int]) -> str:
        """Append generated ids; return the newly completed text (maybe empty)."""
        self.ids.extend(new_ids)
        return self._advance(final=False)

    def finish(self) -> str:
        """Return what is still held back (an incomplete character decodes as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset == len(self.ids):
            return ""
        decode = self._tok.decode
        prefix = decode(self.ids[self._prefix_offset:self._read_offset], skip_special_tokens=self._skip)
        full = decode(self.ids[self._prefix_offset:], skip_special_tokens=self._skip)
        if not final and (len(full) <= len(prefix) or full.endswith(REPLACEMENT)):
            return ""
        delta = full[len(prefix):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        self.text += delta
        return delta
