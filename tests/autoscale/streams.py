"""Streaming clients for the live reclaim test and benchmark: every event of a stream
with its arrival time, so a run can say whether each stream completed, what it said
(text and token ids: the requests ask for ``return_token_ids``) and how long it waited
between events (a resume is a gap)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx

__all__ = ["Stream", "greedy_requests", "join", "run_streams", "wait_events"]

UPSTREAM = "x-llmserve-upstream"


def greedy_requests(n: int, tokens: int) -> list[tuple[str, dict]]:
    """``n`` distinct greedy streams, completions and chats alternating, each exactly ``tokens`` long."""
    common = {"model": "tiny", "stream": True, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
              "return_token_ids": True, "stream_options": {"include_usage": True}}
    out = []
    for k in range(n):
        if k % 2:
            out.append(("/v1/chat/completions",
                        {**common, "messages": [{"role": "user", "content": f"Tell me story number {k}"}]}))
        else:
            out.append(("/v1/completions", {**common, "prompt": f"Once upon a time, number {k}"}))
    return out


@dataclass
class Stream:
    """One streaming request and what came back."""

    path: str
    body: dict
    upstream: str | None = None  # the instance that began it (the gateway's header)
    status: int | None = None
    events: list[str] = field(default_factory=list)  # data payloads, "[DONE]" included
    times: list[float] = field(default_factory=list)  # monotonic arrival of each event
    t0: float = 0.0
    error: str | None = None  # a transport error or a non-200 answer

    def run(self, client: httpx.Client) -> None:
        self.t0 = time.monotonic()
        try:
            with client.stream("POST", self.path, json=self.body) as r:
                self.status, self.upstream = r.status_code, r.headers.get(UPSTREAM)
                if r.status_code != 200:
                    self.error = f"{r.status_code}: {r.read()[:300].decode(errors='replace')}"
                    return
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.times.append(time.monotonic())
        except httpx.HTTPError as e:
            self.error = f"{type(e).__name__}: {e}"

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"

    def chunks(self) -> list[dict]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]

    def text(self) -> str:
        return "".join(ch.get("text") or (ch.get("delta") or {}).get("content") or ""
                       for c in self.chunks() for ch in c.get("choices", []))

    def token_ids(self) -> list[int]:
        return [t for c in self.chunks() for ch in c.get("choices", []) for t in ch.get("token_ids", [])]

    def problems(self) -> list[str]:
        """Why this is not one complete, clean stream (empty when it is)."""
        out = [self.error] if self.error else []
        out += [f"error event: {c['error']}" for c in self.chunks() if "error" in c]
        if not self.done:
            out.append(f"no [DONE] after {len(self.events)} events")
        return out

    def gaps(self) -> list[float]:
        """Seconds between consecutive events."""
        return [b - a for a, b in zip(self.times, self.times[1:])]


def run_streams(url: str, requests: list[tuple[str, dict]], timeout_s: float = 120.0) -> tuple[list[Stream], list]:
    """Start every request at once, each in its own thread; the streams (filling as
    events arrive) and the threads to join."""
    streams = [Stream(path, body) for path, body in requests]

    def one(s: Stream) -> None:
        with httpx.Client(base_url=url, timeout=timeout_s, trust_env=False) as c:
            s.run(c)

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in streams]
    for t in threads:
        t.start()
    return streams, threads


def wait_events(streams: list[Stream], n: int, timeout_s: float) -> None:
    """Until every stream has ``n`` events or has ended."""
    deadline = time.monotonic() + timeout_s
    while any(len(s.events) < n and s.error is None and not s.done for s in streams):
        if time.monotonic() > deadline:
            raise TimeoutError(f"streams not at {n} events: {[len(s.events) for s in streams]}")
        time.sleep(0.01)


def join(threads: list, timeout_s: float) -> None:
    for t in threads:
        t.join(timeout=timeout_s)
