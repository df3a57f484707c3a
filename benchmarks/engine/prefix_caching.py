"""Prefix caching on the real model (issue 3): caching on and off in one run.

1. Shared system prompt (~1,000 tokens) + short questions: TTFT per request on an
   otherwise idle engine, after one warm request has populated the cache.
2. Multi-turn chat: conversations resend their history every turn; prefill tokens
   computed and TTFT per turn.
3. Head-of-line: short realtime requests arriving (wall clock) while a stream of
   2,000-token batch-priority prompts is being prefilled; realtime TTFT against the
   idle TTFT, for several ``max_num_batched_tokens``.

    python benchmarks/engine/prefix_caching.py [--quick] [--threads 1]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import numpy as np
from common import (
    EngineCore,
    Loaded,
    command_line,
    greedy,
    load,
    loadavg,
    machine,
    md_table,
    pct,
    run_one,
    ttft,
    write_results,
)

SUBJECTS = ["Orders", "Refunds", "Shipping", "Accounts", "Warranty", "Privacy", "Billing", "Returns",
            "Subscriptions", "Gift cards", "Repairs", "Store pickup"]
RULES = [
    "Always greet the customer by name when the name is known, and keep the tone friendly and calm.",
    "Never promise a delivery date that the tracking system does not show.",
    "Refunds above 200 euros need a second approval from a team lead before they are issued.",
    "If a parcel has not moved for five working days, open a carrier investigation.",
    "Ask for the order number first; without it, search by email address and postcode.",
    "Do not share the last four digits of a card unless the customer has passed verification.",
    "A damaged item may be replaced without a return when the photo shows the damage clearly.",
    "Subscriptions can be paused for up to three months, once per year, at no cost.",
    "Gift cards are valid for three years and cannot be exchanged for cash.",
    "Repairs under warranty are free; outside warranty, quote the fixed price from the repair table.",
    "Escalate any mention of legal action or injury to the compliance desk immediately.",
    "Store pickup orders are held for seven days and then returned to stock.",
    "Explain the reason for every refusal and offer one concrete alternative.",
    "Summarise the agreed next steps at the end of every conversation.",
]
QUESTIONS = [
    "How long is a gift card valid?", "Can I pause my subscription?", "My parcel has not moved for a week.",
    "Who approves a refund of 350 euros?", "Is a repair free after the warranty ends?",
    "How long do you keep a store pickup order?", "Can you tell me my card number?",
    "The blender arrived broken, what now?", "What should I do if a customer mentions a lawyer?",
    "Can I exchange a gift card for cash?", "How do I find an order without its number?",
    "What do I say at the end of a chat?", "When can you promise a delivery date?",
    "Can a subscription be paused twice a year?",
]
USER_TURNS = [
    # (conversation, turn) user messages of roughly 60-100 tokens
    [("I am planning a vegetable garden on a small balcony that gets about five hours of sun in the "
     "afternoon. I have room for six large pots and a railing planter. I would like to grow something "
     "to eat every week from June to October. What should I plant first, and in which pots?"),
     ("Thanks. The tomatoes you mentioned: should they be bush or vine varieties for pots that are forty "
     "centimetres wide, and how often should I water them when the weather is hot and windy?"),
     ("Good. My neighbour says coffee grounds are a good fertiliser for everything. Is that true for "
     "the herbs and the lettuce, or should I buy a liquid feed instead? I prefer organic options."),
     ("Last question: how do I keep pigeons away from the seedlings without harming them? They land "
     "on the railing every morning and pull up anything small.")],
    [("I run a small bakery with four employees and I want to start taking online orders for cakes "
     "with pickup the next day. I have a simple website but no shop system yet. What are the main "
     "things I need to set up, and in what order?"),
     ("For payments, is it better to take the full price online or only a deposit? Some customers "
     "order big birthday cakes and then do not come, which costs us a lot."),
     ("How should I handle allergies? Each cake can contain nuts, gluten, eggs and milk, and people "
     "often ask for changes. I want the order form to make this clear."),
     ("Finally, what should the confirmation email say so that customers know when to come and what "
     "to bring? Please keep it short, we are a friendly neighbourhood shop.")],
    [("I am learning Python and wrote a script that reads a CSV file of my monthly expenses and prints "
     "the total for each category. It works, but it is slow for big files and the code is messy. "
     "What are the usual ways to make such a script cleaner?"),
     ("I used a dictionary with the category as key and a running sum as value. Would the collections "
     "module or pandas be better here, and what are the trade-offs for a beginner?"),
     ("How do I make the script handle broken lines in the file, for example a missing amount or a "
     "comma inside the description, without crashing the whole run?"),
     ("Last thing: I want to print the results sorted by total, largest first, with two decimals and "
     "aligned columns. What is the simplest way to do that?")],
]


def system_prompt(tok: Any, n_tokens: int, seed: int = 0) -> str:
    """A support handbook of about ``n_tokens`` tokens, deterministic for a seed."""
    rng = random.Random(seed)
    parts = [("You are the customer support assistant of Northwind Home, a shop for kitchen and home "
             "appliances. Follow the handbook below exactly. Answer in at most three sentences.")]
    i = 0
    while len(tok.encode("\n".join(parts))) < n_tokens:
        subject = SUBJECTS[i % len(SUBJECTS)]
        rules = rng.sample(RULES, 3)
        parts.append(f"Section {i + 1}, {subject}: " + " ".join(rules)
                     + f" Reference code {rng.randint(1000, 9999)}-{subject[:3].upper()}.")
        i += 1
    ids = tok.encode("\n".join(parts))[:n_tokens]
    return tok.decode(ids)


def chat_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    return tok.encode_chat(messages, add_generation_prompt=True)


# ---- 1. shared system prompt ----------------------------------------------------------------
def shared_prompt(m: Loaded, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    tok = m.tokenizer
    sys_text = system_prompt(tok, args.system_tokens)
    n_q = 4 if args.quick else 12
    opts = {"threads": args.threads, "num_kv_blocks": 256}
    cores = {"on": m.core(enable_prefix_caching=True, **opts), "off": m.core(enable_prefix_caching=False, **opts)}
    prompts = [chat_ids(tok, [{"role": "system", "content": sys_text}, {"role": "user", "content": q}])
               for q in QUESTIONS[:n_q + 1]]
    warm, measured = prompts[-1], prompts[:n_q]
    for name, core in cores.items():  # populates the cache (on) and warms the kernels (both)
        run_one(core, f"warm-{name}", warm, greedy(1))
    res: dict[str, dict[str, list]] = {k: {"ttft": [], "cached": [], "prompt_len": []} for k in cores}
    for i, ids in enumerate(measured):
        order = ["on", "off"] if i % 2 == 0 else ["off", "on"]
        for name in order:
            out = run_one(cores[name], f"q{i}-{name}", ids, greedy(1))
            res[name]["ttft"].append(ttft(out))
            res[name]["cached"].append(out.num_cached_tokens)
            res[name]["prompt_len"].append(len(ids))
        print(f"  q{i}: on {res['on']['ttft'][-1]:.3f}s off {res['off']['ttft'][-1]:.3f}s", flush=True)
    rows = []
    for name in ("off", "on"):
        t = res[name]["ttft"]
        rows.append([f"caching {name}", len(t), np.mean(res[name]["prompt_len"]),
                     np.mean(res[name]["cached"]), pct(t, 50) * 1e3, pct(t, 90) * 1e3, max(t) * 1e3])
    p50 = pct(res["off"]["ttft"], 50) / pct(res["on"]["ttft"], 50)
    p90 = pct(res["off"]["ttft"], 90) / pct(res["on"]["ttft"], 90)
    pair = [a / b for a, b in zip(res["off"]["ttft"], res["on"]["ttft"])]
    md = md_table(["variant", "requests", "prompt tokens (mean)", "cached tokens (mean)", "TTFT p50 ms",
                   "TTFT p90 ms", "TTFT max ms"], rows)
    md += (f"\n\nTTFT off/on: **p50 {p50:.1f}×**, p90 {p90:.1f}×; per request pair "
           f"min {min(pair):.1f}× median {np.median(pair):.1f}× (target ≥ 8× at p50: "
           f"{'met' if p50 >= 8 else 'missed'}). System prompt {args.system_tokens} tokens, "
           f"max_num_batched_tokens 512 (so the uncached prompt is prefilled in "
           f"{-(-int(np.mean(res['off']['prompt_len'])) // 512)} chunks), requests one at a time.")
    return md, {"results": res, "p50_ratio": p50, "p90_ratio": p90, "pair_ratios": pair,
                "system_tokens": args.system_tokens}


# ---- 2. multi-turn chat -----------------------------------------------------------------------
def multi_turn(m: Loaded, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    tok = m.tokenizer
    n_conv, n_turns = (2, 2) if args.quick else (3, 4)
    reply_tokens = 16 if args.quick else 32
    opts = {"threads": args.threads, "num_kv_blocks": 256}
    cores = {"on": m.core(enable_prefix_caching=True, **opts), "off": m.core(enable_prefix_caching=False, **opts)}
    for name, core in cores.items():
        run_one(core, f"warm-{name}", chat_ids(tok, [{"role": "user", "content": "Hello there!"}]), greedy(2))
    hist: list[list[dict[str, str]]] = [[] for _ in range(n_conv)]
    per_turn = {k: [[] for _ in range(n_turns)] for k in cores}  # (ttft, prompt, computed)
    same_replies = 0
    hits0 = {k: c.kv.prefix_hits for k, c in cores.items()}
    k = 0
    for t in range(n_turns):
        for c in range(n_conv):  # conversations interleave, as concurrent users would
            hist[c].append({"role": "user", "content": USER_TURNS[c][t]})
            ids = chat_ids(tok, hist[c])
            replies = {}
            for name in (["on", "off"] if k % 2 == 0 else ["off", "on"]):
                out = run_one(cores[name], f"c{c}t{t}-{name}", ids, greedy(reply_tokens))
                per_turn[name][t].append((ttft(out), len(ids), len(ids) - out.num_cached_tokens))
                replies[name] = out
            k += 1
            same_replies += replies["on"].token_ids == replies["off"].token_ids
            hist[c].append({"role": "assistant", "content": replies["on"].text})
            print(f"  conv {c} turn {t + 1}: prompt {len(ids)} cached(on) {replies['on'].num_cached_tokens} "
                  f"ttft on {ttft(replies['on']):.3f}s off {ttft(replies['off']):.3f}s", flush=True)
    rows = []
    for t in range(n_turns):
        on, off = per_turn["on"][t], per_turn["off"][t]
        rows.append([t + 1, np.mean([x[1] for x in on]), sum(x[2] for x in off), sum(x[2] for x in on),
                     np.mean([x[0] for x in off]) * 1e3, np.mean([x[0] for x in on]) * 1e3,
                     np.mean([x[0] for x in off]) / np.mean([x[0] for x in on])])
    tot = {k: sum(x[2] for turn in per_turn[k] for x in turn) for k in cores}
    prompt_total = sum(x[1] for turn in per_turn["on"] for x in turn)
    t_tot = {k: sum(x[0] for turn in per_turn[k] for x in turn) for k in cores}
    rows.append(["all", prompt_total / (n_conv * n_turns), tot["off"], tot["on"], t_tot["off"] * 1e3 / (n_conv * n_turns),
                 t_tot["on"] * 1e3 / (n_conv * n_turns), t_tot["off"] / t_tot["on"]])
    md = md_table(["turn", "prompt tokens (mean)", "prefill tokens computed, off", "prefill tokens computed, on",
                   "TTFT off ms (mean)", "TTFT on ms (mean)", "TTFT off/on"], rows)
    md += (f"\n\n{n_conv} conversations × {n_turns} turns, greedy replies of {reply_tokens} tokens, "
           f"each turn resends the whole history through the chat template. Prefill tokens computed "
           f"with caching: {tot['on']} of {prompt_total} prompt tokens ({tot['off'] / max(tot['on'], 1):.1f}× fewer); "
           f"KV prefix hits counter grew by {cores['on'].kv.prefix_hits - hits0['on']} tokens. "
           f"Replies identical with and without caching: {same_replies}/{n_conv * n_turns}.")
    return md, {"per_turn": per_turn, "prefill_computed": tot, "prompt_tokens": prompt_total,
                "same_replies": same_replies, "turns": n_turns, "conversations": n_conv}


# ---- 3. head-of-line blocking ------------------------------------------------------------------
def realtime_prompts(tok: Any, n: int, offset: int) -> list[list[int]]:
    return [chat_ids(tok, [{"role": "user", "content": f"{QUESTIONS[(offset + i) % len(QUESTIONS)]} (ticket {offset + i})"}])
            for i in range(n)]


def drive_loaded(core: EngineCore, rt: list[list[int]], gaps: list[float], batch_len: int, batch_conc: int,
                 rng: np.random.Generator, tag: str, vocab: int) -> dict[str, Any]:
    """Keep ``batch_conc`` batch prompts in flight; realtime prompts arrive at wall-clock offsets.

    The core runs in this thread, so a request that arrives during a step is added
    when the step ends, with its true arrival time: its TTFT includes the rest of
    the step in progress, as with the InThreadEngine.
    """
    n_batch = 0
    plans: list[Any] = []
    schedule = core.scheduler.schedule

    def spy() -> Any:  # see what each step held (read only)
        plan = schedule()
        plans.append(plan)
        return plan

    core.scheduler.schedule = spy  # type: ignore[method-assign]

    def add_batch() -> None:
        nonlocal n_batch
        ids = rng.integers(100, vocab, size=batch_len).tolist()  # distinct: no prefix hits
        core.add_request(f"{tag}-b{n_batch}", ids, greedy(4, ignore_eos=True), priority="batch")
        n_batch += 1

    for _ in range(batch_conc):
        add_batch()
    core.step()  # the stream is under way before the first realtime arrival
    t0 = time.monotonic()
    arrivals = list(np.cumsum(gaps))
    pending = list(range(len(rt)))
    ttfts: dict[int, float] = {}
    queue: dict[int, float] = {}
    steps: list[tuple[float, int, bool, bool]] = []  # duration, tokens, realtime scheduled, realtime waiting
    batch_done = 0
    try:
        while len(ttfts) < len(rt):
            now = time.monotonic()
            while pending and t0 + arrivals[pending[0]] <= now:
                i = pending.pop(0)
                core.add_request(f"{tag}-rt{i}", rt[i], greedy(4), priority="realtime", arrival_time=t0 + arrivals[i])
            if not core.has_unfinished():
                time.sleep(max(0.0, t0 + arrivals[pending[0]] - time.monotonic()))
                continue
            s0 = time.monotonic()
            outs = core.step()
            plan = plans[-1]
            rt_sched = any(not s.request.is_batch_class for s in plan.scheduled)
            rt_wait = any(not r.is_batch_class for r in core.scheduler.waiting)
            steps.append((time.monotonic() - s0, plan.total_tokens, rt_sched, rt_wait))
            for out in outs:
                if "-rt" in out.request_id:
                    i = int(out.request_id.rsplit("rt", 1)[1])
                    if i not in ttfts and out.outputs[0].token_ids:
                        ttfts[i] = ttft(out)
                        queue[i] = out.metrics.first_scheduled_time - out.metrics.arrival_time
                elif out.finished:
                    batch_done += 1
                    add_batch()
    finally:
        core.scheduler.schedule = schedule  # type: ignore[method-assign]
        for rid in list(core.scheduler.requests):
            core.abort_request(rid)
    return {"ttft": [ttfts[i] for i in range(len(rt))], "queue": [queue[i] for i in range(len(rt))],
            "steps": steps, "batch_finished": batch_done, "batch_started": n_batch}


def chunk_profile(core: EngineCore, budget: int, vocab: int, n_steps: int = 3) -> dict[str, float]:
    """ms per step by operator family for full ``budget``-token chunks of a 2,000-token prompt at ~1,000 context."""
    from torch.profiler import ProfilerActivity, profile

    rng = np.random.default_rng(1)
    core.add_request("prof", rng.integers(100, vocab, size=2000).tolist(), greedy(1), priority="batch")
    while core.scheduler.requests["prof"].num_computed_tokens < 1000:
        core.step()
    t = time.monotonic()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n_steps):
            core.step()
    wall = (time.monotonic() - t) / n_steps
    core.abort_request("prof")
    fam = {"matmul (weights)": ("aten::mm", "aten::addmm", "aten::bmm"),
           "attention (SDPA)": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                "aten::_scaled_dot_product_attention_math"),
           "KV gather/scatter": ("aten::index_select", "aten::index_copy_", "aten::index", "aten::index_put_")}
    out = {k: 0.0 for k in fam}
    total = 0.0
    for e in prof.key_averages():
        total += e.self_cpu_time_total
        for k, names in fam.items():
            if e.key in names:
                out[k] += e.self_cpu_time_total
    res = {k: v / 1e3 / n_steps for k, v in out.items()}
    res["other ops"] = (total - sum(out.values())) / 1e3 / n_steps
    res["wall"] = wall * 1e3
    return res


def head_of_line(m: Loaded, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    tok = m.tokenizer
    budgets = args.budgets or ([64, 128, 256] if args.quick else [32, 64, 128, 256, 512])
    rounds, per_round, n_idle = (1, 4, 3) if args.quick else (2, 8, 4)
    batch_len = 2000
    vocab = m.model_config.vocab_size
    cores = {b: m.core(threads=args.threads, max_num_batched_tokens=b, num_kv_blocks=320,
                       long_prefill_token_threshold=args.long_prefill_token_threshold) for b in budgets}
    rng = np.random.default_rng(0)
    for b, core in cores.items():
        run_one(core, f"warm{b}", realtime_prompts(tok, 1, 99)[0], greedy(4))
    res = {b: {"idle": [], "loaded": [], "queue": [], "steps": [], "batch_finished": 0, "batch_started": 0}
           for b in budgets}
    q = 0
    for r in range(rounds):
        order = budgets if r % 2 == 0 else budgets[::-1]
        for b in order:
            core = cores[b]
            for ids in realtime_prompts(tok, n_idle, q):
                res[b]["idle"].append(ttft(run_one(core, f"idle{q}", ids, greedy(4))))
                q += 1
            gaps = rng.exponential(args.rt_gap, size=per_round).tolist()
            out = drive_loaded(core, realtime_prompts(tok, per_round, q), gaps, batch_len, 2, rng,
                               f"r{r}b{b}", vocab)
            q += per_round
            for key in ("ttft", "queue"):
                res[b]["loaded" if key == "ttft" else key] += out[key]
            res[b]["steps"] += out["steps"]
            res[b]["batch_finished"] += out["batch_finished"]
            res[b]["batch_started"] += out["batch_started"]
            print(f"  round {r} budget {b}: idle p50 {pct(res[b]['idle'], 50):.3f}s loaded max "
                  f"{max(out['ttft']):.3f}s, load {loadavg()[0]:.2f}", flush=True)
    rows, why = [], []
    for b in budgets:
        idle, loaded, steps = res[b]["idle"], res[b]["loaded"], res[b]["steps"]
        chunk = [d for d, n, rts, _ in steps if n >= 0.9 * b and not rts]  # a full batch prefill chunk
        mixed = [d for d, n, rts, _ in steps if rts]
        ratio = pct(loaded, 99) / pct(idle, 50)
        # What a scheduler that gave an arriving realtime request the very next step would
        # achieve: at worst the rest of a full chunk step, then one step holding the request.
        bound = pct(chunk, 99) + (np.median(mixed) if mixed else 0.0)
        rows.append([b, len(loaded), pct(idle, 50) * 1e3, pct(loaded, 50) * 1e3, pct(loaded, 99) * 1e3,
                     ratio, "yes" if ratio <= 2 else "no", pct(res[b]["queue"], 50) * 1e3,
                     np.median(chunk) * 1e3 if chunk else float("nan"),
                     np.median(mixed) * 1e3 if mixed else float("nan"),
                     bound * 1e3, bound / pct(idle, 50), res[b]["batch_finished"]])
        why.append((b, bound / pct(idle, 50)))
    md = md_table(["max_num_batched_tokens", "realtime requests", "idle TTFT p50 ms", "loaded TTFT p50 ms",
                   "loaded TTFT p99 ms", "p99 / idle p50", "within 2×", "realtime queue time p50 ms",
                   "full-chunk step ms (median)", "step holding realtime ms (median)",
                   "next-step bound ms", "bound / idle p50", "batch prompts finished"], rows)
    prof = {b: chunk_profile(cores[b], b, vocab) for b in budgets}
    prof_md = md_table(["max_num_batched_tokens", "step wall ms (profiled)"] + [k for k in next(iter(prof.values())) if k != "wall"],
                       [[b, prof[b]["wall"]] + [v for k, v in prof[b].items() if k != "wall"] for b in budgets])
    met = [b for b, x in rows_ok(rows)]
    md += (f"\n\nlong_prefill_token_threshold {args.long_prefill_token_threshold} (0: prompt chunks "
           f"limited by the budget only). Batch stream: two {batch_len}-token batch-priority prompts always in flight (a new one "
           f"starts when one finishes, 4 output tokens each, random token ids so nothing is cached). "
           f"Realtime: short chat questions (~{len(realtime_prompts(tok, 1, 0)[0])} prompt tokens, 4 output "
           f"tokens) with exponential gaps of mean {args.rt_gap} s, wall clock; TTFT counts from the "
           f"arrival instant, so it includes the rest of the step in progress. {rounds} rounds × "
           f"{per_round} realtime requests per setting, settings interleaved; idle TTFT measured on the "
           f"same engine between rounds. Queue time = arrival to first scheduled. 'Next-step bound' = "
           f"p99 of a full-chunk step + median step holding the realtime request: the TTFT p99 a "
           f"scheduler that admits a realtime arrival at the next step would get on this CPU.\n\n"
           f"Target (p99 within 2× of idle) met at: {', '.join(map(str, met)) or 'none'}; "
           f"next-step bound within 2× at: {', '.join(str(b) for b, x in why if x <= 2) or 'none'}.\n\n"
           f"Where a full-chunk step's time goes (torch.profiler, CPU self time in ms per step, "
           f"3 steps at ~1,000 tokens of context):\n\n{prof_md}")
    return md, {"budgets": budgets, "chunk_profile": prof, "results": {str(b): v for b, v in res.items()}}


def rows_ok(rows: list[list[Any]]) -> list[tuple[int, float]]:
    return [(r[0], r[5]) for r in rows if r[5] <= 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: see README)")
    p.add_argument("--system-tokens", type=int, default=1000)
    p.add_argument("--rt-gap", type=float, default=1.5, help="mean seconds between realtime arrivals")
    p.add_argument("--only", choices=["shared", "multiturn", "hol"], default=None,
                   help="run one part (results go to prefix_caching-<part>.md)")
    p.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="head-of-line: max_num_batched_tokens values, e.g. 64,256")
    p.add_argument("--long-prefill-token-threshold", type=int, default=0,
                   help="head-of-line: cap on a prompt chunk per step (results go to ...-lpt<N>.md)")
    args = p.parse_args()
    info = machine()
    print("load average", info["loadavg_start"], flush=True)
    m = load()
    sections, data = [], {}
    parts = [("shared", "Shared system prompt, TTFT", shared_prompt), ("multiturn", "Multi-turn chat", multi_turn),
             ("hol", "Head-of-line: realtime TTFT during 2,000-token batch prompts", head_of_line)]
    for key, title, fn in parts:
        if args.only and key != args.only:
            continue
        print(f"== {title}", flush=True)
        la = loadavg()
        t = time.monotonic()
        md, d = fn(m, args)
        md += f"\n\nLoad average during this part: {la[0]:.2f} at start, {loadavg()[0]:.2f} at end ({time.monotonic() - t:.0f} s)."
        sections.append((title, md))
        data[key] = d
        print(md, flush=True)
    info["torch_threads"] = args.threads
    name = "prefix_caching" + (f"-{args.only}" if args.only else "")
    if args.long_prefill_token_threshold:
        name += f"-lpt{args.long_prefill_token_threshold}"
    paths = write_results(name, args.quick, command_line(), info, sections, data)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
