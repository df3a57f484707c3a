"""Token counting for datasets: the model's tokenizer when given, else a labelled estimate.

Prompt lengths drive every token throughput figure, so they must be exact. With
``--tokenizer`` the bench loads the model's own tokenizer (a Hugging Face folder or
a ``.gguf`` file) and builds texts that encode to exactly the requested number of
tokens. Without one it falls back to counting whitespace-separated words, and says
so (``exact`` is False and the result is labelled approximate).

Counts exclude special tokens (BOS, chat template), as vLLM's bench does; the
server's own count, from the usage field, is reported beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Tokenizer(Protocol):
    """What the datasets need from a tokenizer.

    ``encode`` never adds special tokens; ``words`` are filler words that each encode
    to one token when preceded by a space, so random text of n words is about n
    tokens before the exact fix-up in :func:`exact_text`.
    """

    exact: bool
    description: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def words(self) -> list[str]: ...


class HFTokenizer:
    """A ``transformers`` tokenizer (loaded from a folder or a GGUF file)."""

    exact = True

    def __init__(self, tok: Any, description: str) -> None:
        self._tok = tok
        self.description = description
        self._words: list[str] | None = None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def words(self) -> list[str]:
        if self._words is None:
            self._words = _single_token_words(self)
        return self._words


def _single_token_words(tok: HFTokenizer, max_candidates: int = 8000) -> list[str]:
    """Alphabetic vocabulary entries that stay one token after a space.

    A fixed sample of ids (seed 0) keeps the word list, and so the datasets,
    independent of the run seed and cheap to build for large vocabularies.
    """
    vocab_size = len(tok._tok)
    ids = np.arange(vocab_size)
    if vocab_size > max_candidates:
        ids = np.sort(np.random.default_rng(0).choice(vocab_size, max_candidates, replace=False))
    special = set(getattr(tok._tok, "all_special_ids", []))
    candidates = sorted(
        {
            w
            for i in ids.tolist()
            if i not in special
            and (w := tok.decode([i]).strip()).isascii()
            and w.isalpha()
            and 2 <= len(w) <= 12
        }
    )
    base = len(tok.encode("x"))
    words = [w for w in candidates if len(tok.encode("x " + w)) == base + 1]
    if not words:
        raise ValueError(f"{tok.description}: no single-token words found in the vocabulary")
    return words


_FALLBACK_WORDS = (
    "time year people way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city "
    "community name president team minute idea kid body information back parent face "
    "others level office door health person art war history party result change "
    "morning reason research girl guy moment air teacher force education river stone "
    "light music garden window table bridge market winter summer forest letter paper"
).split()


class WordCountTokenizer:
    """Approximate counting: one token per whitespace-separated word."""

    exact = False
    description = "approximate: whitespace word count (pass --tokenizer for exact token counts)"

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._words: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for w in text.split():
            if w not in self._ids:
                self._ids[w] = len(self._words)
                self._words.append(w)
            out.append(self._ids[w])
        return out

    def decode(self, ids: list[int]) -> str:
        return " ".join(self._words[i] for i in ids)

    def words(self) -> list[str]:
        return list(_FALLBACK_WORDS)


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The model's tokenizer from a local HF folder or ``.gguf`` file; None gives the estimate.

    Only local files are read (``local_files_only``): the bench never downloads.
    """
    if path is None:
        return WordCountTokenizer()
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"tokenizer path {p} does not exist")
    if p.suffix == ".gguf":
        tok = _gguf_tokenizer(p)
    else:
        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    return HFTokenizer(tok, f"exact: tokenizer {p}")


def _gguf_tokenizer(path: Path) -> Any:
    """A GGUF's tokenizer as the engine serves with it: ``model_source.load_tokenizer`` reads
    the model store's copy, written on first use (converting the file's metadata takes
    transformers 6-7 s of CPU on a 49k vocabulary, reading the copy well under one)."""
    from transformers import PreTrainedTokenizerFast

    from llmserve.models import model_source
    from llmserve.models.store import default_store_dir

    tok = model_source.load_tokenizer(path, default_store_dir())
    return PreTrainedTokenizerFast(tokenizer_object=tok.backend, bos_token=tok.bos_token, eos_token=tok.eos_token)


def count_tokens(tok: Tokenizer, text: str) -> int:
    return len(tok.encode(text))


def exact_text(tok: Tokenizer, n: int, rng: np.random.Generator, max_rounds: int = 32) -> str:
    """Random filler text that encodes to exactly ``n`` tokens (``n`` words for the estimate).

    Words from ``tok.words()`` mostly map one-to-one onto tokens; where a tokenizer
    merges across a boundary, the text is trimmed (decode of the first n ids) or
    extended until the count is exact. Raises rather than return a wrong length.
    """
    if n < 0:
        raise ValueError(f"token count must be >= 0, got {n}")
    if n == 0:
        return ""
    words = tok.words()
    text = " ".join(rng.choice(words, size=n).tolist())
    if not tok.exact:
        return text
    for _ in range(max_rounds):
        ids = tok.encode(text)
        if len(ids) == n:
            return text
        if len(ids) > n:
            text = tok.decode(ids[:n])
        else:
            text = text + " " + " ".join(rng.choice(words, size=n - len(ids)).tolist())
    raise ValueError(f"{tok.description}: could not build a text of exactly {n} tokens")
