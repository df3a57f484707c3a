"""Datasets: exact token counts with a real (tiny, byte-level BPE) tokenizer, reproducibility."""

from __future__ import annotations

import json

import pytest

from llmserve.bench import datasets
from llmserve.bench.tokenizer import HFTokenizer, WordCountTokenizer, exact_text, load_tokenizer


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    return load_tokenizer(tiny_tokenizer_dir)


def n_tokens(tok, text):
    return len(tok.encode(text))


def test_exact_text_has_exactly_n_tokens(tok):
    import numpy as np

    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 64, 513):
        assert n_tokens(tok, exact_text(tok, n, rng)) == n
    assert tok.exact


def test_random_dataset_lengths_are_exact_and_in_range(tok):
    reqs = datasets.random_dataset(tok, 40, input_len=100, output_len=20, range_ratio=0.5, seed=5)
    assert len(reqs) == 40
    for r in reqs:
        assert r.prompt_len == n_tokens(tok, r.prompt)
        assert 50 <= r.prompt_len <= 150 and 10 <= r.output_len <= 30
    assert len({r.prompt_len for r in reqs}) > 5
    fixed = datasets.random_dataset(tok, 10, input_len=33, output_len=7, seed=5)
    assert {r.prompt_len for r in fixed} == {33} and {r.output_len for r in fixed} == {7}


def test_datasets_are_reproducible_per_seed(tok):
    a = datasets.random_dataset(tok, 5, 30, 5, seed=1)
    b = datasets.random_dataset(tok, 5, 30, 5, seed=1)
    c = datasets.random_dataset(tok, 5, 30, 5, seed=2)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.prompt for r in a] != [r.prompt for r in c]


def test_shared_prefix(tok):
    reqs = datasets.shared_prefix_dataset(tok, 12, num_prefixes=3, prefix_len=40, question_len=8, output_len=4, seed=0)
    systems = {r.messages[0]["content"] for r in reqs}
    assert len(systems) == 3
    assert all(n_tokens(tok, s) == 40 for s in systems)
    for r in reqs:
        assert r.prompt_len == n_tokens(tok, r.prompt)
        assert r.prompt.startswith(r.messages[0]["content"])
        assert n_tokens(tok, r.messages[1]["content"]) == 8
    assert [r.meta["prefix"] for r in reqs] != sorted(r.meta["prefix"] for r in reqs)  # interleaved


def test_multi_turn_resends_history_and_chains_turns(tok):
    reqs = datasets.multi_turn_dataset(tok, 7, turns=3, user_len=10, output_len=6, seed=0)
    assert len(reqs) == 7  # 3 conversations, the last one cut short
    by_conv: dict[int, list] = {}
    for i, r in enumerate(reqs):
        by_conv.setdefault(r.meta["conversation"], []).append((i, r))
        assert r.prompt_len == n_tokens(tok, r.prompt)
    for turns in by_conv.values():
        prev = None
        for t, (i, r) in enumerate(turns):
            assert r.meta["turn"] == t and len(r.messages) == 2 * t + 1
            assert r.depends_on == (None if prev is None else prev[0])
            if prev is not None:
                assert r.messages[: len(prev[1].messages)] == prev[1].messages  # history resent
                assert n_tokens(tok, r.messages[-2]["content"]) == 6  # assistant turn
                assert r.prompt_len > prev[1].prompt_len
            prev = (i, r)
    # turn-major order: all first turns come before any second turn
    assert [r.meta["turn"] for r in reqs] == [0, 0, 0, 1, 1, 1, 2]


def test_input_grounded_from_filler_and_from_text(tok):
    reqs = datasets.input_grounded_dataset(tok, 3, input_len=50, output_len=60, task="rewrite", seed=0)
    instr = datasets.GROUNDED_INSTRUCTIONS["rewrite"]
    for r in reqs:
        assert r.prompt.startswith(instr) and r.prompt_len == n_tokens(tok, r.prompt)
        assert n_tokens(tok, r.prompt[len(instr) + 2 :]) == 50
    source = " ".join(["river stone light music garden"] * 40)
    reqs = datasets.input_grounded_dataset(tok, 4, 30, 30, task="summarize", source_text=source, seed=0)
    assert all("river" in r.prompt or "stone" in r.prompt for r in reqs)
    with pytest.raises(ValueError):
        datasets.input_grounded_dataset(tok, 1, 10_000, 5, source_text="too short")


def test_jsonl(tok, tmp_path):
    p = tmp_path / "p.jsonl"
    lines = [
        {"prompt": "river stone light", "output_len": 5},
        {"messages": [{"role": "user", "content": "garden window"}], "priority": "batch"},
    ]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    reqs = datasets.jsonl_dataset(tok, p, 5, output_len=9)
    assert [r.output_len for r in reqs] == [5, 9, 5, 9, 5]
    assert reqs[1].priority == "batch" and reqs[1].messages[0]["content"] == "garden window"
    assert reqs[0].prompt_len == n_tokens(tok, "river stone light")
    p.write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError):
        datasets.jsonl_dataset(tok, p, 1, 9)


def test_batch_share_marks_exactly_that_share(tok):
    reqs = datasets.random_dataset(tok, 20, 5, 2, seed=0)
    datasets.assign_batch_share(reqs, 0.25, seed=0)
    assert sum(r.priority == "batch" for r in reqs) == 5


def test_without_a_tokenizer_counts_are_labelled_approximate():
    tok = load_tokenizer(None)
    assert isinstance(tok, WordCountTokenizer) and not tok.exact
    assert "approximate" in tok.description
    reqs = datasets.random_dataset(tok, 3, 12, 4, seed=0)
    assert all(r.prompt_len == len(r.prompt.split()) == 12 for r in reqs)


def test_a_gguf_tokenizer_is_read_from_the_model_stores_copy(tmp_path, monkeypatch):
    """``--tokenizer FILE.gguf``: the first load writes the store's copy (the engine's), later
    ones read it instead of converting the file's metadata again; the ids are the file's."""
    from transformers import AutoTokenizer

    from llmserve.models.model_source import cache_dir
    from tests.helpers import make_tiny_gguf, make_tiny_llama

    gguf = make_tiny_gguf(make_tiny_llama(tmp_path), tmp_path / "tiny.gguf", "Q8_0")
    store = tmp_path / "store"
    monkeypatch.setenv("LLMSERVE_MODEL_STORE", str(store))
    text = "The quick brown fox jumps over 13 lazy dogs."
    from_file = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf.name, local_files_only=True)
    first = load_tokenizer(gguf)
    assert (cache_dir(gguf, store) / "tokenizer.json").is_file()
    real = AutoTokenizer.from_pretrained

    def no_conversion(*a, **k):
        raise AssertionError("converted the GGUF again")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", no_conversion)
    again = load_tokenizer(gguf)
    want = from_file.encode(text, add_special_tokens=False)
    assert first.encode(text) == again.encode(text) == want and again.words() == first.words()
    assert HFTokenizer(from_file, "the file's").words() == first.words()  # the same datasets as before
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", real)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the store's folder would be")
    monkeypatch.setenv("LLMSERVE_MODEL_STORE", str(blocked))
    assert load_tokenizer(gguf).encode(text) == want  # no store: the file's metadata
