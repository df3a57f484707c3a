"""`llmserve bench` as a script written for `vllm bench serve` types it: --backend and
path endpoints, --host/--port, --served-model-name, bare --save-result with --result-dir,
--percentile-metrics, the sharegpt dataset, and the wait for a server still starting."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from llmserve.bench.cli import main

from .fakes import ServerStats, ServerThread, make_fake_openai_app


def run(fake_server, *argv: str) -> int:
    return main(["--base-url", fake_server.url("/ok/v1"), "--num-prompts", "3", "--disable-tqdm",
                 "--random-input-len", "8", "--random-output-len", "3", *argv])


@pytest.mark.parametrize("argv, path", [
    (["--endpoint", "/v1/chat/completions"], "/ok/v1/chat/completions"),
    (["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"], "/ok/v1/chat/completions"),
    (["--backend", "openai-chat"], "/ok/v1/chat/completions"),
    (["--backend", "vllm", "--endpoint", "/v1/completions"], "/ok/v1/completions"),
    (["--endpoint", "chat"], "/ok/v1/chat/completions"),
])
def test_backend_and_endpoint_paths_send_where_vllm_would(fake_server, argv, path, capsys):
    assert run(fake_server, *argv) == 0
    sent = fake_server.stats.bodies
    chat = path.endswith("chat/completions")
    assert len(sent) == 4 and all(("messages" in b) == chat and ("prompt" in b) != chat for b in sent)
    assert f"{fake_server.url(path)} " in capsys.readouterr().out


def test_sampling_flags_are_sent_and_greedy_is_the_default(fake_server):
    assert run(fake_server, "--temperature", "0.7", "--top-p", "0.9", "--top-k", "20", "--min-p", "0.05") == 0
    assert all((b["temperature"], b["top_p"], b["top_k"], b["min_p"]) == (0.7, 0.9, 20, 0.05)
               for b in fake_server.stats.bodies)
    assert run(fake_server) == 0
    last = fake_server.stats.bodies[-1]
    assert last["temperature"] == 0.0 and not {"top_p", "top_k", "min_p"} & set(last)
    assert run(fake_server, "--top-p", "0") == 2


def test_contradicting_or_unknown_spellings_are_flag_errors(fake_server, capsys):
    assert run(fake_server, "--backend", "openai-chat", "--endpoint", "/v1/completions") == 2
    out = capsys.readouterr().out.strip()
    assert "--backend openai-chat sends chat" in out and "\n" not in out
    assert main(["--base-url", "http://127.0.0.1:9/v1", "--host", "h", "--model", "m"]) == 2
    assert "--base-url and --host/--port" in capsys.readouterr().out
    for bad in (["--port", "99999"], ["--base-url", "http://127.0.0.1:99999/v1"]):  # a flag error, no traceback
        assert main([*bad, "--model", "m", "--ready-check-timeout-sec", "0"]) == 2
        assert "base URL must be" in capsys.readouterr().out
    assert run(fake_server, "--percentile-metrics", "ttft,latency") == 2
    assert "--percentile-metrics" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # TGI's own API is not what this bench sends
        main(["--backend", "tgi", "--model", "m"])
    with pytest.raises(SystemExit):
        main(["--endpoint", "/v1/embeddings", "--model", "m"])
    assert fake_server.stats.requests == 0


def test_host_port_and_served_model_name(fake_server, tiny_tokenizer_dir, tmp_path):
    out = tmp_path / "r.json"
    base = fake_server.url("")
    assert main(["--host", "127.0.0.1", "--port", str(fake_server.port), "--num-prompts", "2", "--disable-tqdm",
                 "--random-input-len", "8", "--random-output-len", "2", "--save-result", str(out),
                 "--model", str(tiny_tokenizer_dir), "--served-model-name", "my-model"]) == 0
    data = json.loads(out.read_text())
    assert data["config"]["endpoint"]["base_url"] == f"{base}"
    assert data["config"]["dataset"]["tokenizer"] == str(tiny_tokenizer_dir)  # --model names the tokenizer
    assert data["meta"]["token_counts"].startswith("exact")
    assert {b["model"] for b in fake_server.stats.bodies} == {"my-model"}


def test_bare_save_result_writes_vllms_file_with_vllms_keys(fake_server, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run(fake_server, "--save-result", "--max-concurrency", "2", "--percentile-metrics", "ttft,e2el") == 0
    out = capsys.readouterr().out
    (saved,) = list(tmp_path.glob("*.json"))
    assert re.fullmatch(r"completions-infqps-concurrency2-fake-model-\d{8}-\d{6}\.json", saved.name), saved.name
    data = json.loads(saved.read_text())
    for key in ("date", "backend", "model_id", "num_prompts", "request_rate", "max_concurrency", "duration",
                "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                "mean_tpot_ms", "p99_itl_ms", "mean_e2el_ms"):
        assert key in data, key
    assert data["completed"] == data["summary"]["completed"] == 3 and data["model_id"] == "fake-model"
    assert data["max_concurrency"] == 2 and data["request_rate"] == "inf"
    assert "Mean TTFT (ms)" in out and "Mean E2EL (ms)" in out
    assert "Mean TPOT (ms)" not in out and "Mean ITL (ms)" not in out  # not among --percentile-metrics

    named = tmp_path / "runs"
    assert run(fake_server, "--result-dir", str(named), "--result-filename", "x.json", "--plot") == 0
    assert (named / "x.json").exists() and (named / "x.png").exists()
    assert run(fake_server, "--save-result", "a.json", "--result-dir", str(named)) == 2


def sharegpt(tmp_path, rows):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"id": str(i), "conversations": [{"from": f, "value": v} for f, v in turns]}
                                for i, turns in enumerate(rows)]))
    return path


def test_sharegpt_first_turns_with_their_answers_lengths(fake_server, tiny_tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    words = "river stone light music garden window table bridge market winter summer forest".split()
    rows = [[("human", " ".join(words[:5 + i])), ("gpt", " ".join(words[:4 + i])), ("human", "more")]
            for i in range(4)]
    rows += [[("human", "too short")], [("human", "a b"), ("gpt", "river stone light music")],
             [("human", " ".join(words)), ("gpt", "no")]]  # one turn; a 2-token prompt; a 1-token answer
    path = sharegpt(tmp_path, rows)
    base = ["--dataset-name", "sharegpt", "--dataset-path", str(path), "--tokenizer", str(tiny_tokenizer_dir)]
    assert run(fake_server, *base, "--num-prompts", "6") == 0
    sent = fake_server.stats.bodies[1:]  # after the initial test request
    valid = {r[0][1]: len(hf(r[1][1], add_special_tokens=False).input_ids) for r in rows[:4]}
    assert len(sent) == 6 and {b["prompt"] for b in sent} == set(valid)
    assert all(b["max_tokens"] == valid[b["prompt"]] for b in sent)
    assert run(fake_server, *base, "--sharegpt-output-len", "2", "--endpoint", "/v1/chat/completions") == 0
    assert {b["max_tokens"] for b in fake_server.stats.bodies[-3:]} == {2}
    assert fake_server.stats.bodies[-1]["messages"][0]["content"] in valid
    empty = sharegpt(tmp_path, rows[4:])
    assert run(fake_server, "--dataset-name", "sharegpt", "--dataset-path", str(empty)) == 2


def test_a_server_still_starting_is_waited_for():
    stats = ServerStats()
    srv = ServerThread(make_fake_openai_app(stats))  # its port is bound, not yet listening: refused
    threading.Timer(1.5, srv.__enter__).start()
    try:
        t0 = time.monotonic()
        assert main(["--base-url", srv.url("/warming/v1"), "--num-prompts", "2", "--disable-tqdm",
                     "--random-input-len", "4", "--random-output-len", "2", "--ready-check-timeout-sec", "60"]) == 0
        assert time.monotonic() - t0 >= 1.5
        # refused, then the model list, then two 503s (warming), then the test request and the run
        assert stats.requests == 5 and stats.success == 3
    finally:
        time.sleep(0.5)
        srv.__exit__(None, None, None)


def test_a_server_that_stays_down_stops_the_run_at_the_deadline(capsys):
    from llmserve.ports import free_port

    base = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.monotonic()
    assert main(["--base-url", base, "--model", "m", "--num-prompts", "2", "--disable-tqdm",
                 "--ready-check-timeout-sec", "1.5"]) == 2
    assert time.monotonic() - t0 >= 1.5
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(f"Waiting up to 1.5 s for {base}/completions")
    assert f"cannot reach {base}/completions" in lines[-1] and "waited 1.5 s" in lines[-1]


def test_the_test_requests_wait_counts_from_when_the_model_lists_wait_began():
    """One --ready-check-timeout-sec for both waits (the model list's, then the test
    request's): the second starts with what the first left, not a new timeout (2x before)."""
    from llmserve.bench.ready import NotReady, until_ready

    tries = []

    def warming():
        tries.append(time.monotonic())
        raise NotReady("HTTP 503")

    with pytest.raises(ValueError, match="HTTP 503"):  # the model list's wait used it all: one try, no sleep
        until_ready(warming, 30.0, "http://x", since=time.monotonic() - 30.0)
    assert len(tries) == 1
    assert until_ready(lambda: "up", 30.0, "http://x", since=time.monotonic() - 60.0) == "up"  # ready: no wait
