"""Live: spot reclaims while greedy streams are in flight on the spot instance lose nothing.

``llmserve serve`` with a static pool of two (one on-demand, one spot) of real
tiny engines, slowed by ``--fault-chunk-latency-ms`` so a 100-token stream lasts
seconds. Streaming completions and chats (``ignore_eos``, temperature 0) run once
undisturbed; then the same requests again, and while they are in flight the spot
instance is reclaimed: first without notice (SIGKILL at once), then, on its
replacement, with a notice shorter than the streams (SIGKILL at the deadline,
streams still running). Every stream must end with ``[DONE]``, carry no error
event, and say exactly what it said undisturbed, token id for token id: the
gateway resumed those cut on the killed instance on the other one
(``retry.max_resumes: 0`` in the gateway config makes this test fail).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import make_tiny_llama

from .serve_harness import ServeProcess, serve_config
from .streams import Stream, greedy_requests, join, run_streams, wait_events

pytestmark = pytest.mark.slow

TOKENS = 100
STREAMS = 6
CHUNK_LATENCY_MS = "25"  # before each event: a stream lasts 2.5 s or more
NOTICE_S = 1.0  # shorter than a stream: the deadline falls mid-stream


def spot_config(model) -> dict:
    return serve_config(model, engine_args=["--max-num-seqs", "8", "--fault-chunk-latency-ms", CHUNK_LATENCY_MS],
                        autoscale={"policy": "static", "tick_s": 60.0, "static": {"instances": 2},
                                   "bounds": {"min_instances": 1, "max_instances": 3},
                                   "capacity": {"spot": {"max_instances": 2, "price_per_hour": 0.35}}})


def resumes(serve: ServeProcess, outcome: str) -> float:
    for family in text_string_to_metric_families(serve.metrics()):
        for s in family.samples:
            if s.name == "llmserve:gateway_stream_resumes_total" and s.labels.get("outcome") == outcome:
                return s.value
    return 0.0


def on(stream: Stream, row: dict) -> bool:
    """Whether the stream began on this instance (the gateway names it by id or by address)."""
    return stream.upstream in (row["instance_id"], urlsplit(row["url"]).netloc)


def spot_row(serve: ServeProcess) -> dict:
    return next(i for i in serve.instances(finished=False) if i["capacity_class"] == "spot" and i["state"] == "ready")


def reclaimed_under_streams(serve: ServeProcess, spot: dict, notice_s: float, after_events: int) -> tuple[
        list[Stream], int]:
    """The requests again, the spot instance reclaimed once every stream has ``after_events``
    events; the streams, and how many were running on the spot instance then."""
    streams, threads = run_streams(serve.url, greedy_requests(STREAMS, TOKENS))
    try:
        wait_events(streams, after_events, 60)
        cut = [s for s in streams if on(s, spot) and not s.done]
        r = serve.admin("POST", f"/autoscale/instances/{spot['instance_id']}/reclaim", params={"notice_s": notice_s})
        assert r.status_code == 200, r.text
    finally:
        join(threads, 120)
    return streams, len(cut)


def assert_as_undisturbed(streams: list[Stream], ref: list[Stream]) -> None:
    for s, r in zip(streams, ref):
        assert s.problems() == [], (s.path, s.problems())
        assert s.token_ids() == r.token_ids(), s.path  # no gap, no token twice
        assert s.text() == r.text(), s.path
        assert [c["usage"]["completion_tokens"] for c in s.chunks() if c.get("usage")] == [TOKENS]
        assert {c["id"] for c in s.chunks()} == {s.chunks()[0]["id"]}


def test_streams_in_flight_on_a_reclaimed_spot_instance_complete_as_if_undisturbed(tmp_path):
    model = make_tiny_llama(tmp_path, seed=5, name="tiny-spot-kill")
    serve = ServeProcess(spot_config(model), tmp_path)
    try:
        serve.wait_ready(2, timeout=180)
        ref, threads = run_streams(serve.url, greedy_requests(STREAMS, TOKENS))
        join(threads, 120)
        for r in ref:
            assert r.problems() == [] and len(r.token_ids()) == TOKENS, r.problems()

        # Without notice: SIGKILL while the streams are in flight.
        spot = spot_row(serve)
        base = resumes(serve, "resumed")
        streams, cut = reclaimed_under_streams(serve, spot, 0, after_events=10)
        assert cut >= 1, [s.upstream for s in streams]  # else this proves nothing
        assert_as_undisturbed(streams, ref)
        assert resumes(serve, "resumed") == base + cut
        assert resumes(serve, "failed") == resumes(serve, "not_resumable") == 0
        serve.wait_until(lambda p: p["counts"]["ready"] == 2 and p["counts"]["draining"] == 0, 120,
                         "the killed instance replaced")
        rows = {i["instance_id"]: i for i in serve.instances()}
        assert rows[spot["instance_id"]]["state"] == "failed"
        again = [i for i in rows.values() if i["replaces"] == spot["instance_id"]]
        assert len(again) == 1, again
        new = again[0]
        assert new["capacity_class"] == "spot" and new["state"] == "ready"

        # A notice shorter than the streams: they drain until the deadline's SIGKILL, then resume.
        base = resumes(serve, "resumed")
        streams, cut = reclaimed_under_streams(serve, new, NOTICE_S, after_events=5)
        assert cut >= 1, [s.upstream for s in streams]
        assert_as_undisturbed(streams, ref)
        assert resumes(serve, "resumed") == base + cut  # none finished within the notice
        assert resumes(serve, "failed") == resumes(serve, "not_resumable") == 0
    finally:
        serve.stop()
