"""Shared pieces of the engine benchmarks: one weight load for many engine cores,
percentiles, machine load, and the results files.

The machine these run on is small and shared, so every script measures the
variants it compares in the same process and the same run, interleaved where it
can; several ``EngineCore`` objects share one set of weights for that.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MODEL = "SmolLM2-135M-Instruct"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch
from tables import md_table, pct  # noqa: F401 - re-exported for the engine benchmarks

from llmserve.engine.config import EngineConfig
from llmserve.engine.engine import EngineCore
from llmserve.engine.outputs import RequestOutput
from llmserve.engine.sampling_params import SamplingParams


@dataclass
class Loaded:
    """Weights, config and tokenizer loaded once; ``core()`` builds engines over them."""

    name: str
    model_config: Any
    weights: dict[str, torch.Tensor]
    tokenizer: Any
    source: Path
    store: Path

    def core(self, **options: Any) -> EngineCore:
        config = EngineConfig(model=self.name, **options)
        return EngineCore(config, self.model_config, self.weights, self.tokenizer)


def load(name: str = MODEL) -> Loaded:
    from llmserve.models.model_source import load_tokenizer, load_weights
    from llmserve.models.store import default_store_dir, resolve

    store = default_store_dir()
    source = resolve(name, store)
    model_config, weights = load_weights(source, store)
    return Loaded(name, model_config, weights, load_tokenizer(source, store), Path(source), store)


def loadavg() -> tuple[float, float, float]:
    return os.getloadavg()


def machine() -> dict[str, Any]:
    """Where and on what code a run happened (uncommitted engine changes are hashed)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False,
                                  timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    diff = git("diff", "HEAD", "--", "llmserve/engine", "llmserve/models")
    changed = git("diff", "HEAD", "--name-only", "--", "llmserve/engine", "llmserve/models").split()
    commit = git("rev-parse", "--short", "HEAD").strip() or "?"
    if diff:
        commit += f" + uncommitted changes to {', '.join(changed)} (diff sha256 {hashlib.sha256(diff.encode()).hexdigest()[:12]})"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host_cpus": os.cpu_count(),
        "loadavg_start": loadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "git_commit": commit,
    }


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def prefill_all(core: EngineCore) -> int:
    """Step ``core`` until every request's prompt is computed; the steps taken."""
    sch, steps = core.scheduler, 0
    while sch.waiting or any(r.num_computed_tokens < len(r.prompt_token_ids) for r in sch.running):
        core.step()
        steps += 1
    return steps


def steady_core(loaded: Loaded, batch: int, steps: int, warm: int = 2, **options: Any) -> EngineCore:
    """An engine core (int8 unless ``options`` say) with ``batch`` 128-token prompts computed
    and ``warm`` decode steps taken: ready for ``steps`` steady decode steps."""
    from offline_throughput import prompts_for  # (benchmarks/ is on the path, above)

    core = loaded.core(**{"dtype": "int8", **options, "max_num_seqs": max(batch, 1)})
    sp = SamplingParams(max_tokens=128 + warm + steps + 8, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts_for(loaded.tokenizer, batch, 128, 0)):
        core.add_request(f"r{i}", p, sp)
    prefill_all(core)
    for _ in range(warm):
        core.step()
    return core


def run_one(core: EngineCore, rid: str, prompt: list[int], params: SamplingParams,
            **kw: Any) -> RequestOutput:
    """Add one request to an idle engine and step it to completion; the final output."""
    core.add_request(rid, prompt, params, arrival_time=time.monotonic(), **kw)
    final = None
    while core.has_unfinished():
        for out in core.step():
            if out.request_id == rid and out.finished:
                final = out
    assert final is not None
    return final


def ttft(out: RequestOutput) -> float:
    m = out.metrics
    return m.first_token_time - m.arrival_time


def write_results(name: str, quick: bool, command: str, info: dict[str, Any],
                  sections: list[tuple[str, str]], data: dict[str, Any]) -> tuple[Path, Path]:
    """``benchmarks/results/<name>[-quick].{md,json}``; sections are (title, markdown)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = name + ("-quick" if quick else "")
    info = {**info, "loadavg_end": loadavg(), "command": command}
    la0, la1 = info["loadavg_start"], info["loadavg_end"]
    head = [f"# {name}{' (quick)' if quick else ''}", "",
            f"`{command}`  ", (f"{info['date']}, {info['host_cpus']} CPUs, torch {info['torch']} "
            f"with {info['torch_threads']} thread(s), commit {info['git_commit']}  "),
            (f"load average (1/5/15 min) at start {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, "
            f"at end {la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}"), ""]
    body = []
    for title, md in sections:
        body += [f"## {title}", "", md, ""]
    md_path, json_path = RESULTS / f"{stem}.md", RESULTS / f"{stem}.json"
    md_path.write_text("\n".join(head + body))
    json_path.write_text(json.dumps({"machine": info, **data}, indent=1, default=_jsonable))
    return md_path, json_path


def _jsonable(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def command_line() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
