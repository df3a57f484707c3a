"""``llmserve`` — one console script, one subcommand per job.

Environment variables are read by the entry points only (here, ``engine/argv.py`` and
the instance's own ``server/entry.py``, which ``llmserve engine`` runs): ``LLMSERVE_MODEL_STORE``
sets the default model store; ``LLMSERVE_API_KEY`` is one more key ``llmserve
engine`` accepts (how ``serve`` hands its instances their key: an environment
variable is not in ``ps`` output, a command-line flag is); ``LLMSERVE_NO_KERNELS``
runs without the C++ kernels. Flags are generated from the config models
(``llmserve/flags.py``), so a setting's name, default and help live in one place.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def _store_default() -> str | None:
    from llmserve.engine.argv import model_store_default

    return model_store_default()


def add_engine_args(p: argparse.ArgumentParser) -> None:
    from llmserve.engine.argv import add_engine_args as add

    add(p)


def engine_config_from(args: argparse.Namespace):
    from llmserve.engine.argv import engine_config_from as read

    return read(args)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)


def cmd_pull(args: argparse.Namespace) -> int:
    from llmserve.models.loader import ModelLoadError
    from llmserve.models.store import find_spec, pull

    if find_spec(args.name) is None and _looks_like_path(args.name) and not Path(args.name).exists():
        # a mistyped path is not an unknown model name: the list of names would not help
        raise ModelLoadError(f"{args.name}: no such file or folder")
    path = pull(args.name, args.model_store, quiet=args.quiet)
    print(path)
    return 0


def _looks_like_path(name: str) -> bool:
    """A name with a folder separator, a leading ``.``/``~``, or a ``.gguf`` suffix (a known
    name with a slash, ``HuggingFaceTB/SmolLM2-135M-Instruct``, is looked up first)."""
    return "/" in name or "\\" in name or name.startswith((".", "~")) or name.lower().endswith(".gguf")


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
    if args.system and not getattr(args, "chat", True):
        raise ValueError("--system needs --chat (a system message is a chat template's turn)")
    # Checked before the model loads (seconds): a bad flag is refused at once.
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, seed=cfg.seed)  # --seed seeds both the engine and sampling
    opts = {k: v for k, v in cfg.to_dict().items() if k != "model"}
    return LLM(cfg.model, **opts), sp


def cmd_generate(args: argparse.Namespace) -> int:
    llm, sp = _llm_and_params(args)
    tok = llm.get_tokenizer()
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    turns = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": prompt}]
    ids = tok.encode_chat(turns) if args.chat else tok.encode(prompt)
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
        try:
            eng.add_request(f"turn-{len(history)}", tok.encode_chat(history), sp)
        except ValueError as e:  # (the conversation outgrew the context): this turn only, the session goes on
            history.pop()
            print(f"llmserve: {e}; the message was not sent (empty line or Ctrl-D to quit)", file=sys.stderr)
            continue
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
    from llmserve.server.entry import add_server_args as add

    add(p)


def cmd_engine(args: argparse.Namespace) -> int:
    from llmserve.server.entry import serve

    return serve(args)


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
    "serve": ("llmserve.serve.serve", "add_serve_args", "run_serve",
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
    s.add_argument("name", nargs="?", default=DEFAULT_MODEL,
                   help="a known model name, or the path of a .gguf file or HF folder, which is only "
                        "checked (config, tokenizer, file headers against the config's tensors)")
    s.add_argument("--model-store", default=_store_default())
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(fn=cmd_pull)

    s = sub.add_parser("generate", help="run one prompt through the engine, streaming")
    s.add_argument("prompt", help="the prompt; - reads it from stdin")
    s.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    s.add_argument("--system", default=None, help="with --chat: a system message first")
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
    from llmserve.engine.argv import add_vllm_server_aliases

    add_vllm_server_aliases(s)
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
    from llmserve.server.entry import run_command

    args = build_parser(argv).parse_args(argv)
    return run_command(args.fn, args)


if __name__ == "__main__":
    sys.exit(main())
