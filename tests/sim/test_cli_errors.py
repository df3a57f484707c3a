"""`llmserve simulate`: runs that end, and bad values refused as one line with exit code 2."""

import threading

import numpy as np
import pytest

from llmserve.autoscale import AutoscaleConfig, StaticConfig
from llmserve.cli import main
from llmserve.sim.compare import size_static_for_peak
from llmserve.sim.profile import InstanceProfile, StepModel, save_profile
from llmserve.sim.results import COMPLETED, REJECTED
from llmserve.sim.simulator import SimConfig, Simulator
from llmserve.sim.traces import Trace

SMALL_KV = InstanceProfile("small-kv", StepModel(0.01, 1e-4, 2e-3, 1e-6), max_num_seqs=4,
                           max_num_batched_tokens=256, kv_capacity_tokens=3000, cold_start_s=30.0, warmup_s=5.0)


def trace(rows):
    a = np.array([r[0] for r in rows], float)
    return Trace("t", a, np.array([r[1] for r in rows], np.int64), np.array([r[2] for r in rows], np.int64),
                 np.zeros(len(rows), np.int8), float(a[-1]) + 1.0)


def run_within(sim: Simulator, seconds: float):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", sim.run()), daemon=True)
    t.start()
    t.join(seconds)
    assert "r" in out, "the simulation did not end"
    return out["r"]


def test_a_request_longer_than_the_kv_capacity_is_refused_not_a_hang():
    tr = trace([(0.0, 40_000, 50), (0.5, 100, 20), (1.0, 2000, 1001), (1.5, 2000, 1000)])
    cfg = AutoscaleConfig(policy="static", static=StaticConfig(instances=1))
    res = run_within(Simulator(tr, SMALL_KV, cfg, SimConfig(initial_instances=1)), 30)
    # As the engine answers 400 to a request past its context (capped at its KV capacity):
    assert list(res.status) == [REJECTED, COMPLETED, REJECTED, COMPLETED]
    assert res.summary.rejected == 2 and res.summary.completed == 2


def test_static_sizing_refuses_at_once_when_too_many_requests_never_fit():
    tr = trace([(float(i), 5000 if i % 10 == 0 else 100, 20) for i in range(50)])
    with pytest.raises(ValueError, match="KV capacity"):
        size_static_for_peak(tr, SMALL_KV, AutoscaleConfig(), SimConfig())


def one_line_error(capsys, argv) -> str:
    assert main(["simulate", "--no-progress", "--no-plots", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # progress lines may come before it
    assert err.startswith("llmserve: error: "), err
    return err


@pytest.mark.parametrize("argv, says", [
    (["--trace", "diurnal", "--hours", "-1"], "--hours must be a positive number"),
    (["--hours", "0"], "--hours must be a positive number"),
    (["--peak-rps", "0"], "--peak-rps"),
    (["--trace", "bursty", "--base-rps", "-2"], "--base-rps"),
    (["--trace", "ramp", "--high-rps", "nan"], "--high-rps"),
    (["--oracle-target", "0"], "--oracle-target must be in (0, 1]"),
    (["--oracle-target", "1.5"], "--oracle-target"),
    (["--batch-fraction", "1.5"], "--batch-fraction must be in [0, 1]"),
    (["--static-instances", "0"], "--static-instances must be >= 1"),
    (["--static-instances", "few"], "--static-instances must be 'auto' or a whole number"),
    (["--prompt-len", "abc"], "--prompt-len must be MEDIAN[:SIGMA]"),
    (["--output-len", "-5"], "--output-len needs a positive median"),
    (["--canary-power", "--canary-rollouts", "0"], "--canary-rollouts must be >= 1"),
    (["--canary-power", "--canary-settings", "{bad"], "--canary-settings: not valid YAML"),
    (["--canary-power", "--canary-settings", "/nope/canary.yaml"], "no such file /nope/canary.yaml"),
    (["--canary-power", "--canary-settings", "{interval_s: -1}"], "--canary-settings: interval_s"),
    (["--canary-power", "--canary-worse-by", "x"], "--canary-worse-by must be comma-separated numbers"),
    (["--fidelity"], "live for 24.0 h"),
])
def test_bad_values_are_one_line(capsys, argv, says):
    assert says in one_line_error(capsys, argv)


def write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("rows, says", [
    ("0,-100,50\n1,100,5\n", ":2: token counts must be >= 0"),
    ("0,100,50\n1,100,-5\n", ":3: token counts must be >= 0"),
    ("nan,100,50\n", ":2: timestamp must be a finite number"),
    ("inf,100,50\n", ":2: timestamp must be a finite number"),
])
def test_a_csv_trace_with_a_broken_row_names_its_line(tmp_path, capsys, rows, says):
    csv = write(tmp_path / "t.csv", "timestamp,prompt_tokens,output_tokens\n" + rows)
    assert says in one_line_error(capsys, ["--trace", csv, "--static-instances", "1", "--policy", "static"])


def test_a_trace_no_request_of_which_fits_is_refused(tmp_path, capsys):
    csv = write(tmp_path / "big.csv", "timestamp,prompt_tokens,output_tokens\n0,40000,50\n")
    err = one_line_error(capsys, ["--trace", csv, "--policy", "static", "--static-instances", "1"])
    assert "KV capacity" in err


def test_sizing_the_initial_pool_says_why_and_what_to_give(tmp_path, capsys):
    prof = tmp_path / "p.json"
    save_profile(SMALL_KV, prof)
    csv = write(tmp_path / "t.csv", "timestamp,prompt_tokens,output_tokens\n"
                + "".join(f"{i},{5000 if i % 5 == 0 else 100},20\n" for i in range(30)))
    err = one_line_error(capsys, ["--trace", csv, "--profile", str(prof), "--policy", "kpa"])
    assert "--initial-instances defaults to" in err and "--initial-instances N" in err


def test_the_initial_pool_given_needs_no_static_sizing(tmp_path, capsys):
    prof = tmp_path / "p.json"
    save_profile(SMALL_KV, prof)
    csv = write(tmp_path / "t.csv", "timestamp,prompt_tokens,output_tokens\n"
                + "".join(f"{i},{5000 if i % 5 == 0 else 100},20\n" for i in range(30)))
    out = tmp_path / "out"
    assert main(["simulate", "--no-progress", "--no-plots", "--trace", csv, "--profile", str(prof),
                 "--policy", "kpa", "--initial-instances", "1", "--out", str(out)]) == 0
    assert "refused at once" in capsys.readouterr().err


def test_a_deployment_model_not_served_names_those_that_are(tmp_path, capsys):
    serve = write(tmp_path / "serve.yaml", "models:\n  - name: chat\n    versions:\n"
                  "      - {name: v1, model: SmolLM2-135M-Instruct}\n")
    err = one_line_error(capsys, ["--deployment", serve, "--deployment-model", "nosuch", "--trace", "ramp"])
    assert "'nosuch'" in err and "'chat'" in err


def test_help_gives_the_output_length_default_the_code_uses(capsys):
    from llmserve.sim.traces import default_output_lengths

    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    d = default_output_lengths()
    assert f"(default {d.median:g}:{d.sigma:g})" in " ".join(capsys.readouterr().out.split())
