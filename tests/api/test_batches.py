"""Files and batches with the official openai client on a real gateway over a real
tiny engine: create, poll to completed, download, cancel; and a gateway killed with
SIGKILL in the middle of a batch that, restarted, completes it with every line
exactly once."""

from __future__ import annotations

import io
import json
import time

import httpx
import openai
import pytest

from tests.api.conftest import KEY
from tests.api.gateway_process import GatewayProcess


def _jsonl(lines: list) -> bytes:
    return b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)


def _line(cid: str, content: str, max_tokens: int = 4) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                     "temperature": 0}}


def _wait(client: openai.OpenAI, bid: str, done=("completed", "cancelled", "expired", "failed"), timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = client.batches.retrieve(bid)
        if b.status in done:
            return b
        time.sleep(0.2)
    raise AssertionError(f"batch {bid} still {b.status}: {b.request_counts}")


@pytest.fixture()
def client(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_batch_runs_to_completed_and_a_bad_line_fails_alone(client, gateway):
    lines = [_line(f"req-{i}", f"question {i}") for i in range(6)]
    lines.insert(2, b"{this is not json")
    lines.insert(4, {**_line("wrong-url", "x"), "url": "/v1/embeddings"})
    lines.append(_line("req-0", "a repeated custom_id"))
    f = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    assert f.purpose == "batch" and f.bytes > 0 and client.files.retrieve(f.id).filename == "in.jsonl"
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={"job": "nightly"})
    assert b.status == "in_progress" and b.metadata == {"job": "nightly"}
    b = _wait(client, b.id)
    assert b.status == "completed" and b.request_counts.total == 9
    assert b.request_counts.completed == 6 and b.request_counts.failed == 3
    out = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == [f"req-{i}" for i in range(6)]
    # each answer is what the chat route gives the same request
    for o in out[:2]:
        assert o["response"]["status_code"] == 200 and o["error"] is None
        direct = httpx.post(gateway.url + "/v1/chat/completions", json=lines[0 if o is out[0] else 1]["body"],
                            headers={"authorization": f"Bearer {KEY}"}, timeout=60).json()
        assert o["response"]["body"]["choices"][0]["message"] == direct["choices"][0]["message"]
    errors = [json.loads(x) for x in client.files.content(b.error_file_id).text.splitlines()]
    assert [e["error"]["code"] for e in errors] == ["invalid_json", "mismatched_url", "duplicate_custom_id"]
    assert b.id in [x.id for x in client.batches.list(limit=100).data]


def test_a_line_the_chat_route_refuses_is_a_400_in_the_error_file(client):
    bad = _line("bad-temp", "x")
    bad["body"]["temperature"] = 9
    f = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([bad, _line("ok", "y")]))), purpose="batch")
    b = _wait(client, client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                            completion_window="24h").id)
    err = json.loads(client.files.content(b.error_file_id).text)
    assert err["custom_id"] == "bad-temp" and err["response"]["status_code"] == 400
    assert err["response"]["body"]["error"]["param"] == "temperature"
    assert json.loads(client.files.content(b.output_file_id).text)["custom_id"] == "ok"


def test_cancel(client):
    f = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line(f"c{i}", f"q {i}", 32) for i in range(200)]))),
                            purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert client.batches.cancel(b.id).status in ("cancelling", "cancelled")
    b = _wait(client, b.id)
    assert b.status == "cancelled" and b.cancelled_at is not None
    assert b.request_counts.completed < 200
    done = client.files.content(b.output_file_id).text.splitlines() if b.output_file_id else []
    assert len(done) == b.request_counts.completed


BAD = [
    ("POST", "/v1/batches", {"input_file_id": "file-none", "endpoint": "/v1/chat/completions",
                             "completion_window": "24h"}, "input_file_id"),
    ("POST", "/v1/batches", {"input_file_id": "f", "endpoint": "/v1/embeddings", "completion_window": "24h"},
     "endpoint"),
    ("POST", "/v1/batches", {"input_file_id": "f", "endpoint": "/v1/chat/completions", "completion_window": "1h"},
     "completion_window"),
    ("POST", "/v1/batches", {"input_file_id": "f", "endpoint": "/v1/chat/completions", "completion_window": "24h",
                             "extra": 1}, "extra"),
    ("GET", "/v1/batches/batch_nope", None, None),
    ("POST", "/v1/batches/batch_nope/cancel", None, None),
    ("GET", "/v1/batches?limit=0", None, "limit"),
    ("DELETE", "/v1/batches", None, None),
    ("GET", "/v1/files/file-nope", None, None),
    ("GET", "/v1/files/file-nope/content", None, None),
    ("DELETE", "/v1/files/file-nope", None, None),
    ("POST", "/v1/files", {"purpose": "batch"}, "file"),  # JSON, not multipart
]


@pytest.mark.parametrize("method,path,body,param", BAD)
def test_bad_requests_are_openai_4xx(gateway, client, method, path, body, param):
    before = [b.id for b in client.batches.list(limit=100).data]
    r = httpx.request(method, gateway.url + path, json=body, headers={"authorization": f"Bearer {KEY}"})
    assert 400 <= r.status_code < 500, r.text
    assert [b.id for b in client.batches.list(limit=100).data] == before  # nothing half-stored
    assert r.json()["error"]["message"]
    if param is not None:
        assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("files,data,param", [
    ({"file": ("x.jsonl", b"")}, {"purpose": "batch"}, "file"),
    ({"file": ("x.jsonl", b"\xff\xfe\n")}, {"purpose": "batch"}, "file"),
    ({"file": ("x.jsonl", b"{}\n")}, {"purpose": "fine-tune"}, "purpose"),
    (None, {"purpose": "batch"}, "file"),
])
def test_bad_uploads(gateway, files, data, param):
    r = httpx.post(gateway.url + "/v1/files", files=files, data=data, headers={"authorization": f"Bearer {KEY}"})
    assert 400 <= r.status_code < 500 and r.json()["error"]["param"] == param, r.text


def test_a_form_field_or_query_we_do_not_take_is_refused_by_name(client):
    """The client sends ``expires_after`` as form fields: refused, not dropped; so is a list query we do not take."""
    before = [f.id for f in client.files.list().data]
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("a", "b")]))), purpose="batch",
                            expires_after={"anchor": "created_at", "seconds": 3600})
    assert e.value.body["param"].startswith("expires_after")
    assert [f.id for f in client.files.list().data] == before  # nothing stored
    with pytest.raises(openai.BadRequestError) as e:  # a list option OpenAI does not have
        client.files.list(extra_query={"sort": "bytes"})
    assert e.value.body["param"] == "sort"


def test_another_key_sees_nothing_and_no_key_is_401(gateway, client):
    f = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("a", "b")]))), purpose="batch")
    assert httpx.get(gateway.url + f"/v1/files/{f.id}").status_code == 401
    assert httpx.get(gateway.url + f"/v1/files/{f.id}", headers={"authorization": "Bearer wrong"}).status_code == 401


def test_sigkill_mid_batch_then_restart_completes_every_line_exactly_once(engine, tmp_path):
    gw = GatewayProcess(tmp_path, [engine.url], keys=[KEY], batches={"concurrency": 2})
    gw.start()
    try:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        n = 40
        f = c.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line(f"k{i}", f"q {i}", 16) for i in range(n)]))),
                           purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 120
        while (mid := c.batches.retrieve(b.id)).request_counts.completed < 5:
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.05)
        gw.kill()  # mid-batch: 35 lines of 16 tokens at concurrency 2 take far longer than this call
        assert mid.status == "in_progress" and 5 <= mid.request_counts.completed < n
        gw.start()  # same port, same state folder
        # (the resumed runner may finish the rest before this read: only nothing counted is lost)
        assert c.batches.retrieve(b.id).request_counts.completed >= mid.request_counts.completed
        b = _wait(c, b.id)
        assert b.status == "completed" and b.request_counts.completed == n and b.request_counts.failed == 0
        ids = [json.loads(x)["custom_id"] for x in c.files.content(b.output_file_id).text.splitlines()]
        assert sorted(ids) == sorted(f"k{i}" for i in range(n))  # every line, once
        assert c.files.retrieve(f.id).id == f.id  # the input file survived too
    finally:
        gw.stop()


def test_a_batch_of_responses_lines(client, gateway):
    """``endpoint: /v1/responses``: each line runs through /v1/responses as the batch's key, so
    its answer is the same request's direct answer and a stored one is that key's to read;
    a line the responses route refuses fails alone."""
    def resp_line(cid: str, text: str, **kw) -> dict:
        return {"custom_id": cid, "method": "POST", "url": "/v1/responses",
                "body": {"model": "tiny", "input": text, "max_output_tokens": 5, "temperature": 0, **kw}}

    lines = [resp_line("r-0", "hello", instructions="terse"), resp_line("r-1", "again"),
             resp_line("r-bad", "x", background=True), resp_line("r-nostore", "z", store=False),
             {**_line("chat-url", "x")}]
    f = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    b = _wait(client, client.batches.create(input_file_id=f.id, endpoint="/v1/responses",
                                            completion_window="24h").id)
    assert b.status == "completed" and b.endpoint == "/v1/responses"
    assert (b.request_counts.completed, b.request_counts.failed) == (3, 2)
    out = {o["custom_id"]: o for o in map(json.loads, client.files.content(b.output_file_id).text.splitlines())}
    assert sorted(out) == ["r-0", "r-1", "r-nostore"]
    for cid in ("r-0", "r-1"):
        body = out[cid]["response"]["body"]
        assert out[cid]["response"]["status_code"] == 200 and body["object"] == "response"
        direct = client.responses.create(**{**lines[int(cid[-1])]["body"], "store": False})
        assert body["output"][0]["content"][0]["text"] == direct.output_text
        assert client.responses.retrieve(body["id"]).output_text == direct.output_text  # stored as this key's
    other = openai.OpenAI(base_url=gateway.url + "/v1", api_key="another", max_retries=0)
    with pytest.raises(openai.APIStatusError):  # 401 here (not a gateway key); never another key's record
        other.responses.retrieve(out["r-0"]["response"]["body"]["id"])
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out["r-nostore"]["response"]["body"]["id"])
    errors = {e["custom_id"]: e for e in map(json.loads, client.files.content(b.error_file_id).text.splitlines())}
    assert errors["r-bad"]["response"]["status_code"] == 400
    assert errors["r-bad"]["response"]["body"]["error"]["param"] == "background"
    assert errors["chat-url"]["error"]["code"] == "mismatched_url"
