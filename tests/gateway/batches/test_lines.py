"""An input file's lines: each bad line is named with its own error; the good ones run."""

from __future__ import annotations

import json

from llmserve.gateway.batches.lines import batch_model, parse_lines

EP = "/v1/chat/completions"


def _l(cid, **kw) -> bytes:
    return json.dumps({"custom_id": cid, "method": "POST", "url": EP, "body": {"messages": []}, **kw}).encode()


def test_each_bad_line_has_its_code_and_the_good_ones_keep_their_bodies():
    content = b"\n".join([
        _l("a"), b"not json", b"[1]", _l(None), _l("a"), _l("b", method="GET"), _l("c", url="/v1/completions"),
        _l("d", body="x"), _l("e", body={"stream": True}), _l("f", extra=1), b"   ", _l("g")])
    lines = parse_lines(content, EP)
    codes = [ln.error["code"] if ln.error else "ok" for ln in lines]
    assert codes == ["ok", "invalid_json", "invalid_request", "missing_custom_id", "duplicate_custom_id",
                     "invalid_method", "mismatched_url", "invalid_body", "invalid_body", "invalid_request", "ok"]
    assert [ln.index for ln in lines] == list(range(11))  # blank lines are not lines
    assert lines[0].body == {"messages": []} and lines[-1].custom_id == "g"
    assert lines[1].error["message"].startswith("line 2:")


def test_a_file_with_no_line_to_run_has_openai_errors_and_one_good_line_has_none():
    from llmserve.gateway.batches.lines import ERRORS_SHOWN, file_errors

    bad = parse_lines(b"\n".join([b"not json", _l("a", method="GET")]), EP)
    assert file_errors(bad) == {"object": "list", "data": [
        {"code": "invalid_json", "message": bad[0].error["message"], "param": None, "line": 1},
        {"code": "invalid_method", "message": bad[1].error["message"], "param": None, "line": 2}]}
    assert file_errors(parse_lines(b"\n".join([b"not json", _l("a")]), EP)) is None
    many = file_errors(parse_lines(b"\n".join([b"x"] * (ERRORS_SHOWN + 5)), EP))
    assert len(many["data"]) == ERRORS_SHOWN + 1  # the rest are said to be in the error file
    assert many["data"][-1]["code"] == "too_many_errors" and "5 more" in many["data"][-1]["message"]


def test_the_batch_model_is_the_one_its_lines_to_run_name():
    def model_of(*bodies) -> str | None:
        content = b"\n".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": EP, "body": body}).encode()
                             for i, body in enumerate(bodies))
        return batch_model(parse_lines(content + b"\nnot json", EP))  # (a bad line names nothing)

    assert model_of({"model": "m"}, {"model": "m"}) == "m"
    assert model_of({"model": "m"}, {"model": "n"}) is None
    assert model_of({"model": "m"}, {}) is None
    assert model_of({"model": 5}) is None
