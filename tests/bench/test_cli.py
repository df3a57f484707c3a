"""The command line end to end against the fake server: table, JSON, PNG, compare."""

from __future__ import annotations

import argparse
import json

import pytest

from llmserve.bench.cli import add_bench_args, config_from_args, main
from llmserve.bench.report import compare_rows, load_result


def parse(argv):
    p = argparse.ArgumentParser()
    add_bench_args(p)
    return p.parse_args(argv)


def test_run_save_plot_and_compare(fake_server, tmp_path, tiny_tokenizer_dir, capsys):
    base = ["--base-url", fake_server.url("/ok/v1"), "--num-prompts", "10", "--disable-tqdm",
            "--random-input-len", "16", "--random-output-len", "4", "--ignore-eos",
            "--tokenizer", str(tiny_tokenizer_dir), "--batch-share", "0.3",
            "--goodput", "ttft:10000", "--metric-percentiles", "50,90,99"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(base + ["--save-result", str(a), "--plot", "--label", "A"]) == 0
    assert main(base + ["--save-result", str(b), "--request-rate", "50", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "Serving Benchmark Result" in out and "Per priority class" in out

    data = load_result(a)
    assert (tmp_path / "a.png").stat().st_size > 10_000
    s = data["summary"]
    assert s["completed"] == 10 and s["failed"] == 0 and s["total_output_tokens"] == 40
    assert s["good_completed"] == 10 and "p50_ttft_ms" in s and "p99_e2el_ms" in s
    assert data["config"]["endpoint"]["model"] == "fake-model"
    assert data["config"]["load"]["request_rate"] == "inf"
    assert list(data["config"]) == ["endpoint", "dataset", "load", "percentiles", "percentile_metrics", "slo",
                                    "save_result", "plot",
                                    "show_progress", "label", "server_metrics"]
    assert data["config"]["percentiles"] == [50.0, 90.0, 99.0] and data["config"]["slo"] == {"ttft": 10000.0}
    assert data["config"]["plot"] == str(tmp_path / "a.png") and "api_key" not in data["config"]["endpoint"]
    assert data["meta"]["token_counts"].startswith("exact")
    assert len(data["requests"]) == 10 and "chunk_s" in data["requests"][0]
    assert set(data["per_class"]) == {"batch", "realtime"}
    assert data["per_class"]["batch"]["completed"] == 3
    sent = fake_server.stats.bodies
    assert sum(body.get("priority") == "batch" for body in sent) == 6  # 3 per run
    assert all(body["ignore_eos"] for body in sent)

    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    from llmserve.cli import main as llmserve_main  # the top-level `llmserve bench ...` wiring

    assert llmserve_main(["bench", "compare", str(a), str(b)]) == 0
    wired = capsys.readouterr().out
    assert "B / A" in wired and "request_throughput" in wired
    assert "B / A" in out and "request_throughput" in out and "load config differs" in out
    rows = {k: (va, vb, r) for k, va, vb, r in compare_rows(data, load_result(b))}
    assert rows["completed"] == (10, 10, 1.0)
    va, vb, r = rows["mean_ttft_ms"]
    assert r == pytest.approx(vb / va)


def test_all_failures_exit_nonzero_and_are_shown(fake_server, tmp_path, capsys, monkeypatch):
    # A server that answers the initial test request and then fails everything: the table shows it.
    monkeypatch.setattr("llmserve.bench.cli.initial_test", lambda endpoint, probe, say, since=None: None)
    out_file = tmp_path / "f.json"
    code = main(["--base-url", fake_server.url("/http500/v1"), "--model", "m", "--num-prompts", "4",
                 "--disable-tqdm", "--random-input-len", "4", "--save-result", str(out_file)])
    assert code == 1
    assert "http_500" in capsys.readouterr().out
    s = json.loads(out_file.read_text())["summary"]
    assert s["failed"] == 4 and s["failures_by_kind"] == {"http_500": 4} and s["mean_ttft_ms"] is None


def test_a_server_failing_the_initial_test_request_stops_the_run_with_one_line(fake_server, tmp_path, capsys):
    out_file = tmp_path / "f.json"
    code = main(["--base-url", fake_server.url("/http500/v1"), "--model", "m", "--num-prompts", "4",
                 "--disable-tqdm", "--random-input-len", "4", "--save-result", str(out_file)])
    out = capsys.readouterr().out.strip()
    assert code == 2 and len(out.splitlines()) == 1, out
    assert "initial test request" in out and "HTTP 500" in out and fake_server.url("/http500/v1") in out
    assert fake_server.stats.requests == 1 and not out_file.exists()  # not the 4, not a table of failures


def test_a_server_that_is_down_is_named_by_its_url(capsys):
    from llmserve.ports import free_port

    base = f"http://127.0.0.1:{free_port()}/v1"
    for extra in ([], ["--model", "m"]):  # the model asked of it, or the initial test request
        assert main(["--base-url", base, "--num-prompts", "2", "--disable-tqdm", "--ready-check-timeout-sec", "0",
                     *extra]) == 2
        out = capsys.readouterr().out.strip()
        assert len(out.splitlines()) == 1 and f"cannot reach {base}/" in out, out


def test_flags_are_checked_before_the_server_is_asked_for_its_model(capsys):
    from llmserve.ports import free_port

    base = f"http://127.0.0.1:{free_port()}/v1"  # nothing there: a flag error must come first
    assert main(["--base-url", base, "--num-prompts", "-1"]) == 2
    out = capsys.readouterr().out
    assert "--num-prompts" in out and "cannot reach" not in out


def test_model_defaults_to_the_served_one(fake_server):
    cfg = config_from_args(parse(["--base-url", fake_server.url("/ok/v1")]))
    assert cfg.endpoint.model == "fake-model"


def test_bad_flags_are_rejected():
    for argv in (["--model", "m", "--request-rate", "0"], ["--model", "m", "--goodput", "x:1"],
                 ["--model", "m", "--dataset-name", "jsonl"], ["--model", "m", "--batch-share", "2"],
                 ["--model", "m", "--metric-percentiles", "0"]):
        with pytest.raises(ValueError):
            config_from_args(parse(argv))
    assert main(["--model", "m", "--max-concurrency", "0"]) == 2


def test_an_unknown_flag_with_a_value_is_named_as_unrecognized_not_an_invalid_sub_command(capsys):
    """argparse takes the value after an unknown flag for the sub-command; the error says what
    went wrong instead of "invalid choice: '3' (choose from 'compare')"."""
    with pytest.raises(SystemExit) as e:
        parse(["--bogus-flag", "3", "--num-prompts", "4"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unrecognized arguments: 3 " in err and "invalid choice" not in err
    with pytest.raises(SystemExit):
        parse(["compare", "only-one.json"])  # the sub-command's own errors are untouched
    assert "required: result_b" in capsys.readouterr().err


def test_bad_inputs_exit_2_before_any_traffic(fake_server, tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("5,1\n")
    base = ["--base-url", fake_server.url("/ok/v1"), "--model", "m", "--disable-tqdm"]
    assert main(base + ["--dataset-name", "jsonl", "--dataset-path", str(tmp_path / "missing.jsonl")]) == 2
    assert main(base + ["--rate-trace", str(trace)]) == 2
    assert main(base + ["--tokenizer", str(tmp_path / "no-such-tokenizer")]) == 2
    assert fake_server.stats.requests == 0
    assert "llmserve bench:" in capsys.readouterr().out


def test_warmups_are_sent_first_and_share_no_prompt_with_the_run(fake_server, tmp_path):
    out = tmp_path / "w.json"
    assert main(["--base-url", fake_server.url("/ok/v1"), "--num-prompts", "4", "--num-warmups", "3",
                 "--random-input-len", "6", "--disable-tqdm", "--save-result", str(out)]) == 0
    prompts = [b["prompt"] for b in fake_server.stats.bodies]
    assert len(prompts) == 8 and prompts[0] == prompts[1]  # the initial test request: the first warm-up's
    assert not set(prompts[:4]) & set(prompts[4:])
    data = load_result(out)
    assert data["summary"]["num_requests"] == 4 and data["meta"]["warmups"] == {"sent": 3, "failed": 0}
