"""The batch store's exactly-once rule, across a reopen (what a restart does)."""

from __future__ import annotations

import json
import time

from llmserve.gateway.batches.lines import Line
from llmserve.gateway.batches.store import BatchStore, line_result


def _batch(bid: str = "batch_1") -> dict:
    now = int(time.time())
    return {"id": bid, "object": "batch", "endpoint": "/v1/chat/completions", "status": "in_progress",
            "created_at": now, "expires_at": now + 60, "output_file_id": None, "error_file_id": None}


def _lines(n: int, bad: int | None = None) -> list[Line]:
    return [Line(i, f"c{i}", None, {"code": "invalid_json", "message": "x"}) if i == bad
            else Line(i, f"c{i}", {"n": i}) for i in range(n)]


def test_a_line_has_one_result_and_pending_lines_survive_a_reopen(tmp_path):
    path = tmp_path / "b.db"
    s = BatchStore(path)
    s.create_batch("me", _batch(), _lines(5, bad=1))
    assert [i for i, _, _ in s.pending("batch_1", set(), 10)] == [0, 2, 3, 4]
    assert s.finish_line("batch_1", 0, True, line_result("batch_1", 0, "c0", status=200, body={"a": 1}))
    assert not s.finish_line("batch_1", 0, True, line_result("batch_1", 0, "c0", status=200, body={"a": 2}))
    s2 = BatchStore(path)  # a new process on the same file
    assert [i for i, _, _ in s2.pending("batch_1", {2}, 10)] == [3, 4]
    assert s2.get_batch("batch_1")["request_counts"] == {"total": 5, "completed": 1, "failed": 1}
    for i in (2, 3, 4):
        s2.finish_line("batch_1", i, True, line_result("batch_1", i, f"c{i}", status=200, body={"a": i}))
    s2.finalize("batch_1", "completed")
    b = s2.get_batch("batch_1", "me")
    assert b["status"] == "completed" and b["completed_at"]
    out = [json.loads(x) for x in s2.file_content(b["output_file_id"], "me").decode().splitlines()]
    assert [o["custom_id"] for o in out] == ["c0", "c2", "c3", "c4"]
    assert out[0]["response"]["body"] == {"a": 1}  # the first result, not the second
    err = [json.loads(x) for x in s2.file_content(b["error_file_id"], "me").decode().splitlines()]
    assert [e["custom_id"] for e in err] == ["c1"] and err[0]["error"]["code"] == "invalid_json"
    assert s2.get_batch("batch_1", "someone else") is None
    assert s2.file_content(b["output_file_id"], "someone else") is None


def test_expiry_fails_what_is_pending_and_cancel_only_moves_a_running_batch(tmp_path):
    s = BatchStore(tmp_path / "b.db")
    s.create_batch("me", _batch(), _lines(3))
    s.finish_line("batch_1", 0, True, line_result("batch_1", 0, "c0", status=200, body={}))
    s.finalize("batch_1", "expired")
    b = s.get_batch("batch_1")
    assert b["status"] == "expired" and b["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    codes = [json.loads(x)["error"]["code"] for x in s.file_content(b["error_file_id"], "me").decode().splitlines()]
    assert codes == ["batch_expired", "batch_expired"]
    assert s.cancel("batch_1", "me")["status"] == "expired"
    s.create_batch("me", _batch("batch_2"), _lines(2))
    assert s.cancel("batch_2", "other") is None
    assert s.cancel("batch_2", "me")["status"] == "cancelling"
    assert [b["id"] for b in s.active()] == ["batch_2"]


def test_a_cancelled_batch_fails_what_was_not_run_and_a_late_result_is_not_recorded(tmp_path):
    s = BatchStore(tmp_path / "b.db")
    s.create_batch("me", _batch(), _lines(3))
    s.finish_line("batch_1", 0, True, line_result("batch_1", 0, "c0", status=200, body={}))
    s.cancel("batch_1", "me")
    s.finalize("batch_1", "cancelled")
    # a line abandoned while its result was being written: the files are already built
    assert not s.finish_line("batch_1", 1, True, line_result("batch_1", 1, "c1", status=200, body={}))
    b = s.get_batch("batch_1")
    assert b["status"] == "cancelled" and b["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    err = [json.loads(x) for x in s.file_content(b["error_file_id"], "me").decode().splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in err] == [("c1", "batch_cancelled"), ("c2", "batch_cancelled")]


def test_files_list_in_either_order_from_a_cursor(tmp_path):
    s = BatchStore(tmp_path / "b.db")
    ids = [s.add_file("me", "batch", f"f{i}", b"{}\n")["id"] for i in range(4)]
    s.add_file("other", "batch", "x", b"{}\n")
    asc = [f["id"] for f in s.list_files("me", None, 10, "asc")]
    assert sorted(asc) == sorted(ids) and [f["id"] for f in s.list_files("me", None, 10, "desc")] == asc[::-1]
    assert [f["id"] for f in s.list_files("me", None, 2, "asc", asc[0])] == asc[1:3]
    assert [f["id"] for f in s.list_files("me", None, 10, "desc", asc[2])] == asc[1::-1]
    assert s.list_files("me", "batch_output", 10) == []
    assert s.list_files("other", None, 10, "asc", asc[0]) is None  # another key's file is no cursor


def test_lists_made_in_one_second_keep_the_order_they_were_made_in(tmp_path):
    """``client.batches.list(limit=1).data[0]`` is the batch just made, even when several were
    made in one second (the ids are random, so they cannot break created_at's ties)."""
    s = BatchStore(tmp_path / "b.db")
    ids = [s.add_file("me", "batch", f"f{i}", b"{}\n")["id"] for i in range(8)]
    assert [f["id"] for f in s.list_files("me", None, 10, "asc")] == ids
    assert [f["id"] for f in s.list_files("me", None, 3, "desc", ids[5])] == ids[4:1:-1]
    bids = [f"batch_{x}" for x in ("c", "a", "d", "b", "e")]
    for bid in bids:
        s.create_batch("me", _batch(bid), _lines(1))
    s.create_batch("other", _batch("batch_z"), _lines(1))
    assert [b["id"] for b in s.list_batches("me", 10, None)] == bids[::-1]
    assert [b["id"] for b in s.list_batches("me", 2, bids[3])] == bids[2::-1][:2]
    assert s.list_batches("me", 10, "batch_nope") is None and s.list_batches("me", 10, "batch_z") is None


def test_a_batch_reports_the_usage_of_its_answered_lines_as_openai_does(tmp_path):
    """``batch.usage`` (the SDK's BatchUsage): the tokens of the lines answered 200, chat and
    completions bodies' prompt/completion tokens or responses bodies' input/output tokens."""
    from openai.types.batch_usage import BatchUsage

    s = BatchStore(tmp_path / "b.db")
    s.create_batch("me", _batch(), _lines(4))
    chat = {"usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                      "prompt_tokens_details": {"cached_tokens": 8}}}
    resp = {"usage": {"input_tokens": 7, "output_tokens": 2, "total_tokens": 9,
                      "input_tokens_details": {"cached_tokens": 0}}}
    s.finish_line("batch_1", 0, True, line_result("batch_1", 0, "c0", status=200, body=chat))
    s.finish_line("batch_1", 1, False, line_result("batch_1", 1, "c1", status=400, body={"error": {}}))
    live = BatchUsage.model_validate(s.get_batch("batch_1", "me")["usage"])
    assert (live.input_tokens, live.output_tokens, live.total_tokens) == (10, 3, 13)
    s.finish_line("batch_1", 2, True, line_result("batch_1", 2, "c2", status=200, body=resp))
    s.finalize("batch_1", "cancelled")
    done = BatchUsage.model_validate(s.get_batch("batch_1", "me")["usage"])
    assert (done.input_tokens, done.output_tokens, done.total_tokens) == (17, 5, 22)
    assert (done.input_tokens_details.cached_tokens, done.output_tokens_details.reasoning_tokens) == (8, 0)


def test_a_batch_sums_its_lines_reasoning_tokens(tmp_path):
    """With a reasoning parser chat says completion_tokens_details.reasoning_tokens and
    responses output_tokens_details.reasoning_tokens: the batch's usage sums both (it said 0)."""
    s = BatchStore(tmp_path / "b.db")
    s.create_batch("me", _batch(), _lines(3))
    chat = {"usage": {"prompt_tokens": 4, "completion_tokens": 6, "completion_tokens_details": {"reasoning_tokens": 5}}}
    resp = {"usage": {"input_tokens": 4, "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 2}}}
    plain = {"usage": {"prompt_tokens": 4, "completion_tokens": 1}}
    for i, body in enumerate((chat, resp, plain)):
        s.finish_line("batch_1", i, True, line_result("batch_1", i, f"c{i}", status=200, body=body))
    usage = s.get_batch("batch_1", "me")["usage"]
    assert usage["output_tokens_details"] == {"reasoning_tokens": 7} and usage["output_tokens"] == 10
