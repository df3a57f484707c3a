"""The Batch API as OpenAI has it, over fake upstreams: a batch past its window ends
``expired`` and a cancelled one ``cancelled`` at once, their lines in flight abandoned; a
file with no line to run fails the batch with ``errors``; the upload limit is the file's;
the files list pages as OpenAI's; only a ``batch`` file is a batch's input."""

from __future__ import annotations

import io
import json
import sqlite3

import httpx
import openai
import pytest

from tests.gateway.app_harness import stack, wait_until
from tests.gateway.fake_upstream import Behaviour

FAST = {"poll_interval_s": 0.05, "retry_interval_s": 0.05}


def _file(n: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "chat", "messages": [{"role": "user", "content": f"q{i}"}]}}).encode() + b"\n" for i in range(n))


def _client(s) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)


def _start(c: openai.OpenAI, content: bytes):
    f = c.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    return c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")


def _lines(c: openai.OpenAI, fid: str | None) -> list[dict]:
    return [json.loads(x) for x in c.files.content(fid).text.splitlines()] if fid else []


def _inflight(s) -> int:
    return sum(i.inflight for p in s.gateway.pools() for i in p.instances())


def test_cancel_ends_at_once_and_abandons_the_lines_in_flight(tmp_path):
    b = Behaviour("i0", first_token_delay_s=30.0)  # a line sent is in flight for 30 s
    with stack({"v1": [b]}, state={"dir": str(tmp_path)}, batches={**FAST, "concurrency": 2}) as s:
        c = _client(s)
        batch = _start(c, _file(4))
        wait_until(lambda: b.requests >= 2 and _inflight(s) == 2, what="two lines in flight")
        c.batches.cancel(batch.id)
        # before: "cancelling" until each line in flight ended (its 30 s here, a queue deadline or never)
        wait_until(lambda: c.batches.retrieve(batch.id).status == "cancelled", timeout=5, what="cancelled")
        wait_until(lambda: _inflight(s) == 0, what="the abandoned requests' seats freed")
        done = c.batches.retrieve(batch.id)
        assert done.request_counts.total == 4 and done.request_counts.failed == 4 and done.output_file_id is None
        errors = _lines(c, done.error_file_id)
        assert [e["custom_id"] for e in errors] == ["c0", "c1", "c2", "c3"]  # none lost: in flight or never sent
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}


def test_a_batch_past_its_window_expires_while_its_lines_are_retried(tmp_path):
    b = Behaviour("i0", first_token_delay_s=0.2)
    with stack({"v1": [b]}, state={"dir": str(tmp_path)}, batches={**FAST, "concurrency": 1}) as s:
        c = _client(s)
        batch = _start(c, _file(6))
        wait_until(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 1, what="a line done")
        b.error_rate, b.error_status = 1.0, 503  # the pool goes away: the next lines are retried
        sent = b.requests
        wait_until(lambda: b.requests >= sent + 3, what="retries")
        with sqlite3.connect(tmp_path / "batches.db") as db:  # the 24 h window, ended
            db.execute("UPDATE batches SET obj = json_set(obj, '$.expires_at', 0) WHERE id = ?", (batch.id,))
        # before: in_progress for as long as a line was retried, which was for ever
        wait_until(lambda: c.batches.retrieve(batch.id).status == "expired", timeout=5, what="expired")
        done = c.batches.retrieve(batch.id)
        counts = done.request_counts
        assert counts.total == 6 and counts.completed >= 1 and counts.completed + counts.failed == 6
        out, errors = _lines(c, done.output_file_id), _lines(c, done.error_file_id)
        assert len(out) == counts.completed and all(o["response"]["status_code"] == 200 for o in out)
        assert {e["error"]["code"] for e in errors} == {"batch_expired"}
        assert sorted(x["custom_id"] for x in out + errors) == [f"c{i}" for i in range(6)]
        wait_until(lambda: _inflight(s) == 0, what="nothing left in flight")


def test_a_file_with_no_line_to_run_fails_the_batch_with_its_errors(tmp_path):
    bad = b'{not json\n' + json.dumps({"custom_id": "a", "method": "GET", "url": "/v1/chat/completions",
                                       "body": {}}).encode() + b"\n"
    b = Behaviour("i0")
    with stack({"v1": [b]}, state={"dir": str(tmp_path)}, batches=FAST) as s:
        c = _client(s)
        batch = _start(c, bad)
        assert batch.status == "failed" and batch.failed_at is not None  # as created: nothing runs
        assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_json", 1), ("invalid_method", 2)]
        assert c.batches.retrieve(batch.id).status == "failed" and b.requests == 0
        assert [e["error"]["code"] for e in _lines(c, batch.error_file_id)] == ["invalid_json", "invalid_method"]
        assert batch.model is None  # (no line to run names one)
        # one line to run: the batch runs it, the bad one fails alone, and errors stays null
        mixed = _start(c, bad + _file(1))
        assert mixed.model == "chat"  # OpenAI's Batch.model: its lines' model
        wait_until(lambda: c.batches.retrieve(mixed.id).status == "completed", what="completed")
        done = c.batches.retrieve(mixed.id)
        assert done.errors is None and done.model == "chat" and c.batches.list().data[0].model == "chat"


def test_the_upload_limit_is_the_files_bytes_not_the_multipart_body(tmp_path):
    with stack({"v1": [Behaviour("i0")]}, state={"dir": str(tmp_path)}, batches={"max_file_bytes": 2048}) as s:
        c = _client(s)

        def sized(n: int) -> bytes:
            head = b'{"custom_id": "a", "pad": "'
            return head + b"x" * (n - len(head) - 3) + b'"}\n'

        assert len(sized(2048)) == 2048
        assert c.files.create(file=("in.jsonl", io.BytesIO(sized(2048))), purpose="batch").bytes == 2048
        with pytest.raises(openai.APIStatusError) as e:
            c.files.create(file=("in.jsonl", io.BytesIO(sized(2049))), purpose="batch")
        assert e.value.status_code == 413 and e.value.body["param"] == "file"


def test_the_files_list_pages_as_openai_does(tmp_path):
    with stack({"v1": [Behaviour("i0")]}, state={"dir": str(tmp_path)}) as s:
        c = _client(s)
        for _ in range(5):
            c.files.create(file=("in.jsonl", io.BytesIO(_file(1))), purpose="batch")
        newest_first = [f.id for f in c.files.list().data]
        assert len(newest_first) == 5
        page = c.files.list(limit=2)
        assert [f.id for f in page.data] == newest_first[:2] and page.has_more
        assert [f.id for f in c.files.list(limit=2)] == newest_first  # the client pages on with after
        assert [f.id for f in c.files.list(limit=3, order="asc")] == newest_first[::-1]
        raw = httpx.get(s.url + f"/v1/files?limit=2&order=asc&after={newest_first[-1]}",
                        headers={"authorization": "Bearer x"}).json()
        assert [f["id"] for f in raw["data"]] == newest_first[-2:-4:-1]
        assert (raw["first_id"], raw["last_id"], raw["has_more"]) == (newest_first[-2], newest_first[-3], True)
        last = c.files.list(after=newest_first[-2])
        assert [f.id for f in last.data] == newest_first[-1:] and not last.has_more
        for query, param in (("limit=0", "limit"), ("limit=10001", "limit"), ("limit=x", "limit"),
                             ("order=up", "order"), ("after=file-nope", "after"), ("foo=1", "foo")):
            r = httpx.get(s.url + f"/v1/files?{query}", headers={"authorization": "Bearer x"})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (query, r.text)


def test_an_output_file_is_not_a_batch_input(tmp_path):
    with stack({"v1": [Behaviour("i0")]}, state={"dir": str(tmp_path)}, batches=FAST) as s:
        c = _client(s)
        batch = _start(c, _file(2))
        wait_until(lambda: c.batches.retrieve(batch.id).status == "completed", what="completed")
        out = c.batches.retrieve(batch.id).output_file_id
        assert c.files.retrieve(out).purpose == "batch_output"
        before = [x.id for x in c.batches.list().data]
        with pytest.raises(openai.BadRequestError) as e:
            c.batches.create(input_file_id=out, endpoint="/v1/chat/completions", completion_window="24h")
        assert e.value.body["param"] == "input_file_id" and "purpose" in e.value.body["message"]
        assert [x.id for x in c.batches.list().data] == before  # nothing stored


def test_batches_list_pages_from_a_cursor_of_yours_and_sdk_options_we_lack_are_named(tmp_path):
    with stack({"v1": [Behaviour("i0")]}, state={"dir": str(tmp_path)}, batches=FAST) as s:
        c = _client(s)
        made = [_start(c, _file(1)).id for _ in range(3)]
        assert [b.id for b in c.batches.list(limit=1)] == made[::-1]  # newest first, paged with after
        r = httpx.get(s.url + "/v1/batches?after=batch_nope", headers={"authorization": "Bearer x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "after", r.text  # (it listed from the start)
        f = c.files.create(file=("in.jsonl", io.BytesIO(_file(1))), purpose="batch")
        with pytest.raises(openai.BadRequestError) as e:
            c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                             output_expires_after={"anchor": "created_at", "seconds": 3600})
        assert (e.value.body["param"], e.value.body["code"]) == ("output_expires_after", "unsupported_parameter")
        with pytest.raises(openai.BadRequestError) as e:
            c.files.create(file=("in.jsonl", io.BytesIO(_file(1))), purpose="batch",
                           expires_after={"anchor": "created_at", "seconds": 3600})
        assert e.value.body["code"] == "unsupported_parameter"
        assert [b.id for b in c.batches.list()] == made[::-1]  # nothing more stored


def test_one_keys_files_cannot_fill_the_state_folder_for_every_other(tmp_path):
    """batches.max_key_bytes: an upload that would take a key's files past it is a 413 and stores
    nothing; another key still uploads, and deleting makes room."""
    with stack({"v1": [Behaviour("i0")]}, state={"dir": str(tmp_path)},
               batches={**FAST, "max_key_bytes": 3 * len(_file(8))}) as s:
        a, b = (openai.OpenAI(base_url=s.url + "/v1", api_key=k, max_retries=0) for k in ("key-a", "key-b"))
        kept = [a.files.create(file=("in.jsonl", io.BytesIO(_file(8))), purpose="batch").id for _ in range(3)]
        with pytest.raises(openai.APIStatusError) as e:
            a.files.create(file=("in.jsonl", io.BytesIO(_file(8))), purpose="batch")
        assert e.value.status_code == 413 and e.value.body["code"] == "storage_limit_exceeded"
        assert sorted(f.id for f in a.files.list()) == sorted(kept)  # nothing stored
        assert b.files.create(file=("in.jsonl", io.BytesIO(_file(8))), purpose="batch").bytes == len(_file(8))
        a.files.delete(kept[0])
        assert a.files.create(file=("in.jsonl", io.BytesIO(_file(8))), purpose="batch").id not in kept
