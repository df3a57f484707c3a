"""The engine core in its own process: same tokens as in-thread, abort, death."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile

import pytest

from llmserve.engine import core_proc
from llmserve.engine.client import EngineDeadError
from llmserve.engine.in_thread import InThreadEngine
from llmserve.engine.config import EngineConfig
from llmserve.engine.multi_process import MultiProcessEngine
from llmserve.engine.llm import build_engine, load_engine_tokenizer
from llmserve.engine.outputs import RequestOutput
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.wire import decode_output, decode_request, encode_output, encode_request, pack, unpack
from tests.helpers import make_tiny_llama

PROMPTS = {"a": [5, 6, 7, 8, 9, 10], "b": [11, 12, 13], "c": [20, 21, 22, 23, 24, 25, 26, 27, 28]}
PARAMS = {"a": SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2),
          "b": SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
          "c": SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.3, ignore_eos=True)}
LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=512)
    # One torch thread: the child is forked from the test process, which has used torch.
    return EngineConfig(model=str(path), threads=1, dtype="fp32")


async def _start(config) -> MultiProcessEngine:
    tok = load_engine_tokenizer(config)
    handle = core_proc.start(lambda: build_engine(config, tok), tempfile.mkdtemp(prefix="llmserve-test-"))
    return await MultiProcessEngine(handle, tok).connect()


async def _finals(engine) -> dict[str, RequestOutput]:
    async def one(rid):
        deltas, last = [], None
        async for out in engine.add_request(PROMPTS[rid], PARAMS[rid], rid):
            deltas += out.outputs[0].delta_token_ids
            last = out
        assert deltas == last.outputs[0].token_ids  # the deltas add up to the final output
        return last

    outs = await asyncio.gather(*(one(r) for r in PROMPTS))
    return dict(zip(PROMPTS, outs))


def test_the_wire_carries_requests_and_outputs_as_data():
    from llmserve.engine.request import Request

    req = Request("r", [1, 2], PARAMS["b"], 12, arrival_time=3.5, priority=1, cache_salt="s",
                  eos_token_ids=frozenset({2}))
    back, text = decode_request(unpack(pack(encode_request(req, "hi"))))
    assert (back.request_id, back.prompt_token_ids, back.sampling_params, back.max_tokens, back.priority,
            back.cache_salt, back.eos_token_ids, text) == ("r", [1, 2], PARAMS["b"], 12, 1, "s", frozenset({2}),
                                                            "hi")


async def test_outputs_equal_the_in_thread_engine_token_for_token(config):
    local = InThreadEngine(build_engine(config))
    try:
        want = await _finals(local)
    finally:
        local.shutdown()
    eng = await _start(config)
    try:
        got = await _finals(eng)
        for rid in PROMPTS:
            w, g = want[rid].outputs[0], got[rid].outputs[0]
            assert (g.token_ids, g.text, g.finish_reason) == (w.token_ids, w.text, w.finish_reason)
            assert got[rid].prompt_token_ids == PROMPTS[rid]
        lp_w, lp_g = want["a"].outputs[0].logprobs, got["a"].outputs[0].logprobs
        # Same tokens and top ids; values within fp32 noise: which requests share a step
        # (and so the order of a sum) depends on timing, in one engine as in the other.
        assert [(x.token_id, [t for t, _ in x.top]) for x in lp_g] == \
            [(x.token_id, [t for t, _ in x.top]) for x in lp_w]
        assert all(abs(a - b) < 1e-4 for xg, xw in zip(lp_g, lp_w)
                   for (_, a), (_, b) in zip(xg.top, xw.top))
        snap = eng.load_snapshot()
        assert snap["num_running"] == 0 and snap["finished"]["length"] == 3
    finally:
        eng.shutdown()


async def test_abort_frees_the_request_and_the_engine_goes_on(config):
    eng = await _start(config)
    try:
        stream = eng.add_request(PROMPTS["a"], LONG, "long")
        n = 0
        async for _ in stream:
            n += 1
            if n == 3:
                break
        await stream.aclose()  # the client went away: an abort
        for _ in range(100):
            await asyncio.sleep(0.05)
            if eng.load_snapshot().get("num_running") == 0 and eng.load_snapshot()["finished"].get("abort"):
                break
        snap = eng.load_snapshot()
        assert snap["num_running"] == 0 and snap["kv_cache_usage"] == 0.0 and snap["finished"]["abort"] == 1
        with pytest.raises(ValueError, match="maximum context length"):  # refused here, at once
            eng.add_request(PROMPTS["a"], SamplingParams(max_tokens=10_000), "too-long")
        again = await _finals(eng)
        assert all(o.finished for o in again.values())
    finally:
        eng.shutdown()


async def test_a_killed_engine_process_ends_every_stream_and_is_dead(config):
    eng = await _start(config)
    try:
        stream = eng.add_request(PROMPTS["a"], LONG, "long")
        await stream.__anext__()
        os.kill(eng.handle.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match="exited"):
            async for _ in stream:
                pass
        assert not eng.is_alive() and "-9" in eng.death
        with pytest.raises(EngineDeadError):
            eng.add_request(PROMPTS["b"], PARAMS["b"])
    finally:
        eng.shutdown()


async def test_a_build_failure_is_raised_by_connect(config, tmp_path):
    """A model that cannot be loaded comes back as ModelLoadError (the CLI's one line, exit 2);
    any other failure (a bug) as RuntimeError."""
    from llmserve.models.loader import ModelLoadError

    bad = EngineConfig(model=str(tmp_path / "missing"), threads=1)

    def bug():
        raise KeyError("oops")

    for build, kind in ((lambda: build_engine(bad), ModelLoadError), (bug, RuntimeError)):
        handle = core_proc.start(build, tempfile.mkdtemp(prefix="llmserve-test-"))
        eng = MultiProcessEngine(handle, None)
        with pytest.raises(kind) as e:
            await eng.connect()
        eng.shutdown()
        assert isinstance(e.value, ModelLoadError) == (kind is ModelLoadError), e.value


def test_encode_output_round_trip():
    from llmserve.engine.outputs import CompletionOutput, RequestMetrics, TokenLogprob

    lp = [TokenLogprob(3, -0.5, [(3, -0.5), (4, -1.0)])]
    out = RequestOutput("r", [1], [CompletionOutput(0, "ab", [3], "stop", 3, lp, "b", [3], lp)], True, None, 1,
                        RequestMetrics(1.0, 2.0, 3.0, 4.0, 5.0), None)
    assert decode_output(unpack(pack(encode_output(out))), [1], None) == out


async def test_a_compiling_grammar_never_stops_the_step_loop(config, monkeypatch):
    """Issue 28: a new schema's compile ran on the engine loop, so every running stream
    stalled for it. Made slow here (1.5 s in the forked child), it must run beside the
    loop: a plain stream keeps getting tokens while it compiles, then the constrained
    request joins and completes with valid JSON. The tokenizer's grammar info is built
    before the engine says ready, so the first schema does not pay for it either."""
    import json
    import time

    from llmserve.engine.grammar import GrammarBackend
    from llmserve.engine.sampling_params import StructuredOutputsParams

    compiled = GrammarBackend._compile

    def slow(self, *a):
        time.sleep(1.5)
        return compiled(self, *a)

    monkeypatch.setattr(GrammarBackend, "_compile", slow)  # the child is forked: it has this too
    eng = await _start(config)
    try:
        plain_times: list[float] = []

        async def plain():
            async for out in eng.add_request([5, 6, 7], LONG, "plain"):
                plain_times.extend(time.monotonic() for _ in out.outputs[0].delta_token_ids)

        task = asyncio.create_task(plain())
        while len(plain_times) < 2:
            await asyncio.sleep(0.01)
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}
        sp = SamplingParams(max_tokens=64, temperature=0,
                            structured_outputs=StructuredOutputsParams(json=json.dumps(schema)))
        sent = time.monotonic()
        first = None
        text = ""
        async for out in eng.add_request([8, 9, 10], sp, "json"):
            first = first or time.monotonic()
            text, reason = out.outputs[0].text, out.outputs[0].finish_reason
        assert first - sent >= 1.4  # it did wait for its (slow) grammar
        during = [t for t in plain_times if sent < t < first]
        assert len(during) >= 5, f"the plain stream got {len(during)} tokens while the grammar compiled"
        assert reason == "stop" and isinstance(json.loads(text)["ok"], bool), text
        await task
    finally:
        eng.shutdown()


BAD_INPUTS = [  # (prompt, params, keyword arguments): each refused before it reaches a core
    ([], SamplingParams(max_tokens=4), {}),
    ([5, 10**6], SamplingParams(max_tokens=4), {}),
    (PROMPTS["a"], SamplingParams(max_tokens=10_000), {}),
    (PROMPTS["a"], SamplingParams(max_tokens=4), {"priority": "urgent"}),
    (PROMPTS["a"], SamplingParams(max_tokens=4, logit_bias={10**6: 1.0}), {}),
    (PROMPTS["a"], SamplingParams(max_tokens=4), {"cache_salt": 7}),
]


def _refusal(engine, prompt, params, kw) -> str:
    with pytest.raises(ValueError) as e:
        engine.add_request(prompt, params, "bad", **kw)
    return f"{type(e.value).__name__}: {e.value}"


async def test_both_clients_are_one_seam_and_refuse_bad_input_alike(config):
    """One protocol, one input processor: the in-thread and the multi-process client
    refuse the same inputs with the same error, at once, and then serve on."""
    from llmserve.engine.client import EngineClient
    from llmserve.engine.input_processor import InputProcessor
    from llmserve.server.app import _engine_builder

    local = await _engine_builder(config, own_process=False)()  # the builder's type is the protocol
    eng = await _start(config)
    try:
        for client in (local, eng):
            assert isinstance(client, EngineClient) and type(client.inputs) is InputProcessor
        refused_here = [_refusal(local, *bad) for bad in BAD_INPUTS]
        assert refused_here == [_refusal(eng, *bad) for bad in BAD_INPUTS]
        assert len(set(refused_here)) == len(BAD_INPUTS)  # six different reasons, not one catch-all
        assert all(o.finished for o in (await _finals(eng)).values())
    finally:
        local.shutdown()
        eng.shutdown()


def test_socket_folders_of_killed_processes_are_removed_at_the_next_start(tmp_path):
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid is free now (reuse within the test is vanishingly unlikely)
    dead = tmp_path / f"{core_proc.IPC_PREFIX}{gone.pid}-abc123"
    live = tmp_path / f"{core_proc.IPC_PREFIX}{os.getppid()}-def456"
    other = tmp_path / f"{core_proc.IPC_PREFIX}notapid"
    for d in (dead, live, other):
        d.mkdir()
        (d / "in").touch()
    fresh = core_proc.new_ipc_dir(str(tmp_path))
    assert not dead.exists()
    assert live.exists() and other.exists()  # a running process's, and a name it did not make
    assert os.path.basename(fresh).startswith(f"{core_proc.IPC_PREFIX}{os.getpid()}-")
    assert core_proc.new_ipc_dir(str(tmp_path)) != fresh and os.path.isdir(fresh)  # its own stays
