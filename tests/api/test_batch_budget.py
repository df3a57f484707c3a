"""A named key's batch lines are charged to its budget and usage (LiteLLM's way), not
to the rate windows its interactive traffic lives on; a line its spent budget cannot
pay for fails alone with ``insufficient_quota``, not retried until the batch expires."""

from __future__ import annotations

import io
import json
import time

import httpx
import openai

from tests.api.gateway_process import GatewayProcess
from tests.api.test_batches import _jsonl, _line, _wait

TEAM_KEY, ADMIN_KEY, BUDGET = "team-a-key-for-batch-budget", "admin-key-for-batch-budget", 1000


def _budget_used(gw: GatewayProcess) -> int:
    r = httpx.get(gw.url + "/admin/keys/team-a/usage", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200, r.text
    return r.json()["limits"]["budget"]["used"]


def _batch(client: openai.OpenAI, lines: list) -> openai.types.Batch:
    f = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    return _wait(client, b.id)


def test_batch_lines_are_charged_to_the_keys_budget(engine, tmp_path):
    gw = GatewayProcess(tmp_path, [engine.url])
    gw.config["auth"] = {"admin_key": ADMIN_KEY, "keys": [{
        "key": TEAM_KEY, "name": "team-a",
        "limits": {"requests_per_minute": 1, "budget": {"tokens": BUDGET, "period": "day"}}}]}
    gw.start()
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEAM_KEY, max_retries=0, timeout=60)
        b = _batch(client, [_line(f"q{i}", f"question {i}") for i in range(3)])
        assert b.status == "completed" and b.request_counts.completed == 3, b.request_counts
        out = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines()]
        spent = sum(o["response"]["body"]["usage"]["total_tokens"] for o in out)
        deadline = time.monotonic() + 10  # (settling the estimate to the usage runs in the background)
        while _budget_used(gw) != spent and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _budget_used(gw) == spent > 0  # the answers' own usage, nothing else

        # Three lines took none of the key's one request a minute: its own request goes through.
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.usage.total_tokens > 0

        # A line that asks more than is left fails alone, at once, with OpenAI's quota error.
        left = BUDGET - _budget_used(gw)
        b = _batch(client, [_line("too-big", "x", max_tokens=left), _line("fits", "y", max_tokens=2)])
        assert b.status == "completed" and (b.request_counts.completed, b.request_counts.failed) == (1, 1)
        err = [json.loads(x) for x in client.files.content(b.error_file_id).text.splitlines()]
        assert [e["custom_id"] for e in err] == ["too-big"]
        assert err[0]["response"]["status_code"] == 429
        assert err[0]["response"]["body"]["error"]["code"] == "insufficient_quota"
        assert _budget_used(gw) <= BUDGET
    finally:
        gw.stop()
