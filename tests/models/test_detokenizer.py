"""Incremental detokenization equals decoding everything at once, whatever the chunking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmserve.models.detokenizer import REPLACEMENT
from llmserve.models.tokenizer import Tokenizer
from tests.helpers import make_tiny_llama

TEXTS = [
    "plain ascii text, nothing special",
    "😀😀 emoji 👩‍👩‍👧 joined family 🇫🇷",
    "中文字符 日本語 한국어",
    "mixed: café → 😀 中 ok",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_folder(make_tiny_llama(tmp_path_factory.mktemp("detok")))


def _stream(tok: Tokenizer, ids: list[int], chunks: list[int], prompt: list[int] = (), skip: bool = True):
    d = tok.detokenizer(prompt, skip_special_tokens=skip)
    deltas, i, k = [], 0, 0
    while i < len(ids):
        n = chunks[k % len(chunks)] if chunks else 1
        deltas.append(d.add(ids[i:i + n]))
        i, k = i + n, k + 1
    deltas.append(d.finish())
    return deltas, d


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_equals_full_decode(tok, text):
    ids = tok.encode(text)
    assert len(ids) > len(text.encode()) // 4  # byte-level: multi-byte characters span tokens
    deltas, d = _stream(tok, ids, [1])
    assert "".join(deltas) == tok.decode(ids) == text == d.text
    assert not any(REPLACEMENT in x for x in deltas)  # incomplete characters were held back
    assert d.output_ids == ids


def test_a_split_character_is_held_back_until_complete(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1
    d = tok.detokenizer()
    assert [d.add([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert d.add(ids[-1:]) == "😀"


def test_finish_flushes_an_incomplete_tail(tok):
    ids = tok.encode("ok 😀")[:-1]  # generation stopped mid-character
    deltas, _ = _stream(tok, ids, [1])
    assert "".join(deltas) == tok.decode(ids) and deltas[-1].endswith(REPLACEMENT)


def test_prompt_context_and_special_tokens(tok):
    prompt = tok.encode_chat([{"role": "user", "content": "hi 中"}])
    out = tok.encode("答え: 😀 yes") + [tok.eos_token_ids[0]]
    deltas, _ = _stream(tok, out, [2], prompt=prompt)
    assert "".join(deltas) == tok.decode(out) == "答え: 😀 yes"
    deltas, _ = _stream(tok, out, [1], prompt=prompt, skip=False)
    assert "".join(deltas) == tok.decode(out, skip_special_tokens=False)


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=0, max_size=40), chunks=st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_any_text_any_chunking(tok, text, chunks):
    ids = tok.encode(text, add_special_tokens=False)
    deltas, _ = _stream(tok, ids, chunks)
    assert "".join(deltas) == tok.decode(ids)


@pytest.mark.real_model
def test_smollm2_streaming(smollm2_path, model_store):
    from llmserve.models.model_source import load_tokenizer

    tok = load_tokenizer(smollm2_path, model_store)
    prompt = tok.encode_chat([{"role": "user", "content": "Say hi"}])
    for text in TEXTS:
        ids = tok.encode(text)
        for chunks in ([1], [3, 1, 2]):
            deltas, _ = _stream(tok, ids, chunks, prompt=prompt)
            assert "".join(deltas) == tok.decode(ids) == text
