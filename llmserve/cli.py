"""``llmserve`` — one console script, one subcommand per job.

Environment variables are read here and nowhere deeper: ``LLMSERVE_MODEL_STORE``
sets the default model store; ``LLMSERVE_API_KEY`` is one more key ``llmserve
engine`` accepts (how ``serve`` hands its instances their key: an environment
variable is not in ``ps`` output, a command-line flag is).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def _store_default() -> str | None:
    return os.environ.get("LLMSERVE_MODEL_STORE")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine flags, named as in ``vllm serve`` where the concept is the same."""
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=DEFAULT_MODEL, help="model store name, .gguf file or Hugging Face folder")
    g.add_argument("--model-store", default=_store_default(), help="model store folder")
    g.add_argument("--dtype", default=None, choices=["fp32", "bf16", "int8", "w8a8", "auto"],
                   help="weight format: int8 = int8 weights, activations rounded per 32 (see "
                        "--exact-activations); w8a8 = int8 activations per tensor (torch's dynamic int8; "
                        "lossy on SmolLM2); auto (default) = int8 for a "
                        "block-quantised GGUF where the int8 kernel runs, else fp32")
    g.add_argument("--exact-activations", action="store_true",
                   help="int8 weights: fp32 prefill on fp32 weights kept in memory and two-byte activations "
                        "in decode steps (greedy-equal to fp32 on the test chats; ~0.5 GB more for SmolLM2), "
                        "instead of the int8 kernel on every row with one-byte activations where quality holds")
    g.add_argument("--instances", type=int, default=1,
                   help="engines sharing this machine: the default KV pool takes its share of the free memory")
    g.add_argument("--kv-cache-dtype", default=None, choices=["auto", "fp32", "fp16"],
                   help="KV pool element type; auto (default) = fp16 with int8 weights, else fp32")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--kv-cache-memory", type=int, default=None, help="KV pool budget in bytes")
    pc = g.add_mutually_exclusive_group()
    pc.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_true", default=True)
    pc.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    g.add_argument("--speculative-config", type=json.loads, default=None,
                   help='JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\'')
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads for this instance")
    g.add_argument("--batch-min-share", type=float, default=0.1)
    g.add_argument("--long-prefill-token-threshold", type=int, default=0,
                   help="cap on a prompt chunk per step (0: none); small values bound realtime TTFT under long prompts")
    g.add_argument("--step-budget-tokens", type=int, default=48,
                   help="a step with prompt tokens lasts about as long as an idle prefill of this many tokens "
                        "(measured on this machine as it runs); 0: token budgets only")
    g.add_argument("--step-time-budget-ms", type=float, default=None,
                   help="that step time outright, in ms (overrides --step-budget-tokens)")


def engine_config_from(args: argparse.Namespace):
    from llmserve.engine.config import EngineConfig

    kw: dict[str, Any] = dict(
        model=args.model, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_bytes=args.kv_cache_memory, enable_prefix_caching=args.enable_prefix_caching,
        instances=args.instances, exact_activations=args.exact_activations,
        speculative_config=args.speculative_config, seed=args.seed, threads=args.threads,
        batch_min_share=args.batch_min_share, model_store=args.model_store,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        step_budget_tokens=args.step_budget_tokens,
        step_time_budget_s=None if args.step_time_budget_ms is None else args.step_time_budget_ms / 1000)
    if args.dtype:
        kw["dtype"] = args.dtype
    if getattr(args, "kv_cache_dtype", None):
        kw["kv_cache_dtype"] = args.kv_cache_dtype
    if getattr(args, "served_model_name", None):
        kw["served_model_name"] = args.served_model_name[0]
    return EngineConfig(**kw)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)


def cmd_pull(args: argparse.Namespace) -> int:
    from llmserve.models.store import pull

    path = pull(args.name, args.model_store, quiet=args.quiet)
    print(path)
    return 0


def _stream_print(llm, prompt_ids: list[int], sp) -> None:
    """Stream tokens to stdout as the engine produces them."""
    eng = llm.engine
    eng.add_request("cli", prompt_ids, sp)
    while eng.has_unfinished():
        for out in eng.step():
            sys.stdout.write(out.outputs[0].delta_text)
            sys.stdout.flush()
    sys.stdout.write("\n")


def _llm_and_params(args: argparse.Namespace):
    from llmserve.engine.llm import LLM
    from llmserve.engine.sampling_params import SamplingParams

    cfg = engine_config_from(args)
    opts = {k: v for k, v in cfg.to_dict().items() if k not in ("model", "extra")}
    llm = LLM(cfg.model, **opts)
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, seed=args.seed)  # --seed seeds both the engine and sampling
    return llm, sp


def cmd_generate(args: argparse.Namespace) -> int:
    llm, sp = _llm_and_params(args)
    tok = llm.get_tokenizer()
    ids = tok.encode_chat([{"role": "user", "content": args.prompt}]) if args.chat else tok.encode(args.prompt)
    _stream_print(llm, ids, sp)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    llm, sp = _llm_and_params(args)
    tok = llm.get_tokenizer()
    history: list[dict[str, str]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    print("llmserve chat — empty line or Ctrl-D to quit", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        history.append({"role": "user", "content": line})
        eng = llm.engine
        eng.add_request(f"turn-{len(history)}", tok.encode_chat(history), sp)
        reply = ""
        while eng.has_unfinished():
            for out in eng.step():
                sys.stdout.write(out.outputs[0].delta_text)
                sys.stdout.flush()
                reply = out.outputs[0].text
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": reply})
    return 0


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8001)
    g.add_argument("--api-key", action="append", default=[],
                   help="accepted API key (repeatable; LLMSERVE_API_KEY adds one)")
    g.add_argument("--priority-range", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="integer priorities accepted, lower runs first (default 0 1: realtime, batch)")
    g.add_argument("--served-model-name", nargs="+", default=[])
    g.add_argument("--instance-id", default="")
    g.add_argument("--max-queued-requests", type=int, default=256)
    g.add_argument("--max-queued-prompt-tokens", type=int, default=1 << 20)
    g.add_argument("--max-n", type=int, default=16)
    g.add_argument("--max-logprobs", type=int, default=20)
    g.add_argument("--max-tokens-limit", type=int, default=None)
    g.add_argument("--max-body-bytes", type=int, default=4 << 20)
    g.add_argument("--max-header-bytes", type=int, default=16 << 10)
    # Connection limits; unset: ServerConfig's defaults (documented there).
    for flag, kind in (("--max-url-bytes", int), ("--header-timeout", float), ("--body-timeout", float),
                       ("--send-timeout", float), ("--keep-alive-timeout", float), ("--max-connections", int),
                       ("--stream-buffer-outputs", int)):
        g.add_argument(flag, type=kind, default=None)
    g.add_argument("--drain-timeout", type=float, default=30.0)
    g.add_argument("--no-warmup", action="store_true")
    g.add_argument("--engine-in-thread", action="store_true",
                   help="run the engine core in a thread of the server process, not its own process")
    g.add_argument("--fault-error-rate", type=float, default=0.0, help="testing: share of requests answered 500")
    g.add_argument("--fault-latency-ms", type=float, default=0.0, help="testing: latency added to each request")
    g.add_argument("--startup-delay", type=float, default=0.0,
                   help="seconds to wait before loading the model (simulates a slow cold start)")
    g.add_argument("--log-level", default="warning")


def cmd_engine(args: argparse.Namespace) -> int:
    # numpy's OpenBLAS pool would start a thread at import; the engine process is forked
    # from this one, which must then have one thread (torch does the arithmetic).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from llmserve.priority import NAMED_RANGE, PriorityRange
    from llmserve.server.app import run_server
    from llmserve.server.config import ServerConfig

    env_key = os.environ.get("LLMSERVE_API_KEY")
    scfg = ServerConfig(
        host=args.host, port=args.port, api_keys=args.api_key + ([env_key] if env_key else []),
        priority_range=PriorityRange(*args.priority_range) if args.priority_range else NAMED_RANGE,
        served_model_name=args.served_model_name,
        instance_id=args.instance_id, max_queued_requests=args.max_queued_requests,
        max_queued_prompt_tokens=args.max_queued_prompt_tokens, max_n=args.max_n, max_logprobs=args.max_logprobs,
        max_tokens_limit=args.max_tokens_limit, max_body_bytes=args.max_body_bytes,
        max_header_bytes=args.max_header_bytes, drain_timeout_s=args.drain_timeout, warmup=not args.no_warmup,
        engine_process=not args.engine_in_thread,
        fault_error_rate=args.fault_error_rate, fault_latency_ms=args.fault_latency_ms, startup_delay_s=args.startup_delay,
        log_level=args.log_level, **_given(args, max_url_bytes="max_url_bytes",
                                           header_timeout_s="header_timeout", body_timeout_s="body_timeout",
                                           send_timeout_s="send_timeout", keep_alive_timeout_s="keep_alive_timeout",
                                           max_connections="max_connections",
                                           stream_buffer_outputs="stream_buffer_outputs"))
    ecfg = engine_config_from(args)
    if ecfg.threads is None:  # one instance alone here: its cores, less the API process's where that is cheap
        from llmserve.engine.threads import available_cores, engine_threads

        ecfg.threads = engine_threads(available_cores(), ecfg.instances)
    return run_server(ecfg, scfg)


def _given(args: argparse.Namespace, **fields: str) -> dict:
    """``{field: value}`` for the flags that were given (``fields`` maps field to flag dest)."""
    return {f: getattr(args, dest) for f, dest in fields.items() if getattr(args, dest) is not None}


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure this machine's engine and write a simulator instance profile."""
    from llmserve.engine.calibration import measure_steps
    from llmserve.engine.llm import build_engine
    from llmserve.sim.calibrate import calibrate
    from llmserve.sim.profile import load_profile, save_profile

    engine = build_engine(engine_config_from(args))
    rows = measure_steps(engine)
    template = load_profile(args.template)
    if args.cold_start is not None:
        template = template.with_cold_start(args.cold_start)
    profile, report = calibrate(rows, template, name=args.name)
    save_profile(profile, args.out)
    print(f"{len(rows)} steps, r2 {report.r2:.3f}, mean abs rel error {report.mean_abs_rel_error:.1%}")
    print(f"step model: {profile.step}")
    print(f"wrote {args.out}")
    return 0


# Subcommands of the other layers, imported only when chosen: each pulls in its own
# stack (httpx, numpy, matplotlib, ...), which would add a second or more to every
# `llmserve engine` start. Each module owns its flags.
_LAYER_COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "bench": ("llmserve.bench.cli", "add_bench_args", "run_bench",
              "serving benchmark against any OpenAI-compatible endpoint"),
    "simulate": ("llmserve.sim.cli", "add_simulate_args", "run_simulate",
                 "capacity simulator: replay traffic through the live policies"),
    "gateway": ("llmserve.gateway.cli", "add_gateway_args", "run_gateway_cmd",
                "the OpenAI-compatible gateway in front of instance pools"),
    "serve": ("llmserve.autoscale.serve", "add_serve_args", "run_serve",
              "gateway + elastic controller + local instances"),
}


def _chosen_command(argv: list[str] | None) -> str | None:
    args = sys.argv[1:] if argv is None else argv
    return next((a for a in args if not a.startswith("-")), None)


def _layer_subcommands(sub, chosen: str | None) -> None:
    import importlib

    for name, (module, add_args, run, help_) in _LAYER_COMMANDS.items():
        s = sub.add_parser(name, help=help_)
        if name == chosen:
            mod = importlib.import_module(module)
            getattr(mod, add_args)(s)
            s.set_defaults(fn=getattr(mod, run))


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the subcommand named in ``argv`` (default: sys.argv) gets its layer's flags."""
    p = argparse.ArgumentParser(prog="llmserve", description="Elastic, OpenAI-compatible LLM serving.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("pull", help="fetch a model into the model store")
    s.add_argument("name", nargs="?", default=DEFAULT_MODEL)
    s.add_argument("--model-store", default=_store_default())
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(fn=cmd_pull)

    s = sub.add_parser("generate", help="run one prompt through the engine, streaming")
    s.add_argument("prompt")
    s.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_engine_args(s)
    _sampling_args(s)
    s.set_defaults(fn=cmd_generate)

    s = sub.add_parser("chat", help="interactive chat in the terminal")
    s.add_argument("--system", default=None)
    add_engine_args(s)
    _sampling_args(s)
    s.set_defaults(fn=cmd_chat)

    s = sub.add_parser("engine", help="serve one engine instance over HTTP (OpenAI API)")
    add_engine_args(s)
    add_server_args(s)
    s.set_defaults(fn=cmd_engine)

    s = sub.add_parser("calibrate", help="measure the engine's step times into a simulator profile")
    add_engine_args(s)
    s.add_argument("--out", required=True, help="profile JSON to write")
    s.add_argument("--name", default="calibrated")
    s.add_argument("--template", default="cpu-smollm2", help="profile whose limits and cold start to keep")
    s.add_argument("--cold-start", type=float, default=None, help="seconds (default: the template's)")
    s.set_defaults(fn=cmd_calibrate)

    _layer_subcommands(sub, _chosen_command(argv))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a clear one-line error for the user
        from llmserve.models.loader import ModelLoadError

        if isinstance(e, (ModelLoadError, ValueError, FileNotFoundError)):
            print(f"llmserve: error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
