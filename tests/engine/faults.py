"""Faults injected into one request's path through a real engine, for the isolation tests.

The engine is not faked: these wrap a collaborator (the runner's logits, the
tokenizer's detokeniser) so that exactly one request meets NaN logits or a
raising detokeniser, the way a numerically broken row or a broken decoder would.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from llmserve.engine.engine import EngineCore
from llmserve.engine.request import Request


def poison_logits(core: EngineCore, monkeypatch, pick: Callable[[Request], bool],
                  after_tokens: int = 0) -> list[set[str]]:
    """NaN logits for the rows of requests ``pick`` chooses, once they have
    ``after_tokens`` output tokens. Returns the batches (request ids) it poisoned,
    so a test can check the poison really shared steps with other requests."""
    real = core.runner.execute
    batches: list[set[str]] = []

    def execute(plan):
        run = real(plan)
        for s in plan.scheduled:
            req = s.request
            if s.sample and pick(req) and req.num_output_tokens >= after_tokens:
                start, n = run.rows[req.request_id]
                logits = run.logits.clone()  # (the runner's are inference tensors)
                logits[start:start + n] = float("nan")
                run = dataclasses.replace(run, logits=logits)
                batches.append({x.request.request_id for x in plan.scheduled})
        return run

    monkeypatch.setattr(core.runner, "execute", execute)
    return batches


def hold_until_queued(engine, n: int, timeout: float = 30.0):
    """Park an in-thread engine's loop until ``n`` more commands (adds) are queued
    behind the hold, so they all enter the scheduler in one drain and share steps
    however late their HTTP requests arrive on a loaded machine. Returns the hold's
    future (it raises if the adds never came)."""
    def wait(core):
        deadline = time.monotonic() + timeout
        while engine._cmds.qsize() < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {engine._cmds.qsize()} of {n} commands were queued")
            time.sleep(0.002)

    return engine.call(wait)


def break_forward(core: EngineCore, monkeypatch) -> None:
    """Every forward pass raises: a fault of the whole batch."""
    def execute(plan):
        raise RuntimeError("injected forward failure")

    monkeypatch.setattr(core.runner, "execute", execute)


class _Breaking:
    def __init__(self, detok, after_calls: int) -> None:
        self.detok, self.left = detok, after_calls

    def add(self, ids):
        if self.left <= 0:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected decoder failure")
        self.left -= 1
        return self.detok.add(ids)

    def finish(self):
        return self.detok.finish()


def break_detokenizer(core: EngineCore, monkeypatch, prompt_ids: list[int], after_calls: int = 2) -> None:
    """The detokeniser of the request with this prompt raises after ``after_calls`` tokens."""
    real = core.tokenizer.detokenizer

    def detokenizer(prompt, skip_special_tokens):
        d = real(prompt, skip_special_tokens)
        return _Breaking(d, after_calls) if list(prompt) == list(prompt_ids) else d

    monkeypatch.setattr(core.tokenizer, "detokenizer", detokenizer)
