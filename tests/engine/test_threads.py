import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmserve.engine.config import EngineConfig
from llmserve.engine.threads import FEW_ROWS, engine_threads, step_threads
from tests.helpers import make_tiny_llama


def test_an_instance_gets_its_share_of_the_cores():
    assert [engine_threads(c) for c in (1, 2, 3, 4, 8, 16)] == [1, 2, 3, 4, 8, 16]
    assert engine_threads(16, 4) == 4 and engine_threads(2, 4) == 1 and engine_threads(8, 3) == 2


def test_few_row_steps_leave_a_core_to_the_api_process():
    assert [step_threads(r, 2) for r in (1, FEW_ROWS, FEW_ROWS + 1, 512)] == [1, 1, 2, 2]
    assert step_threads(1, 16) == 15 and step_threads(64, 16) == 16
    assert step_threads(1, 1) == 1 and step_threads(64, 1) == 1  # never none


# In a child process: switching libgomp's thread count here would leave this test
# process's pool in a state its later forks (the core-process tests) cannot use.
_PROBE = """
import json, sys, torch
from llmserve.engine.config import EngineConfig
from llmserve.engine.llm import build_engine
from llmserve.engine.sampling_params import SamplingParams
eng = build_engine(EngineConfig(model=sys.argv[1], dtype="fp32", threads=json.loads(sys.argv[2])))
seen, execute = [], eng.runner.execute
def spy(plan):
    seen.append((plan.total_tokens, torch.get_num_threads()))
    return execute(plan)
eng.runner.execute = spy
eng.add_request("r", list(range(5, 25)), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
while eng.has_unfinished():
    eng.step()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("threads", [2, None])
def test_the_engine_step_runs_few_rows_on_one_thread_fewer(tmp_path, threads):
    model = make_tiny_llama(tmp_path / "model")
    out = subprocess.run([sys.executable, "-c", _PROBE, str(model), json.dumps(threads)], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parents[2], timeout=300)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen[0][0] > FEW_ROWS and any(rows <= FEW_ROWS for rows, _ in seen)  # a prefill, then decodes
    if threads is None:  # threads not given: the engine leaves torch's count alone
        assert len({n for _, n in seen}) == 1
    else:
        assert all(n == step_threads(rows, threads) for rows, n in seen), seen


@pytest.mark.parametrize("bad", [{"batch_min_share": 1.0}, {"long_prefill_token_threshold": -1},
                                 {"step_budget_tokens": -1}, {"step_time_budget_s": 0.0}])
def test_scheduler_settings_are_refused_with_the_engine_config(bad):
    with pytest.raises(ValueError):
        EngineConfig(**bad)
