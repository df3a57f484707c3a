"""The pure part of mid-stream resume: what is kept of each event, what the client gets."""

import json
from types import SimpleNamespace

import pytest

from llmserve.gateway.resume import ResumeState, UpstreamFailed, not_resumable, open_resume

ENGINE = SimpleNamespace(instance_id="a", load_source="load")
FOREIGN = SimpleNamespace(instance_id="v", load_source="metrics")


def event(cid: str, created: int, text: str, ids: list[int] | None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    if ids is not None:
        choice["token_ids"] = ids
    chunk = {"id": cid, "object": "text_completion", "created": created, "model": "m", "choices": [choice]}
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()


def test_ids_are_kept_and_stripped_and_a_resumed_upstream_gets_the_clients_head():
    st = ResumeState({"model": "m", "prompt": "p"})
    st.start(ENGINE)
    out = st.feed(event("cmpl-1", 10, 'say "token_ids": [9]', [5]) + event("cmpl-1", 10, "b", [6, 7]))
    assert out == event("cmpl-1", 10, 'say "token_ids": [9]', None) + event("cmpl-1", 10, "b", None)
    assert st.ids == [5, 6, 7]
    st.start(ENGINE)  # resumed: the new instance's id and created become the client's
    out = st.feed(event("cmpl-2", 20, "c", [8]) + b"data: [DONE]\n\n")
    assert out == event("cmpl-1", 10, "c", None) + b"data: [DONE]\n\n"
    assert st.ids == [5, 6, 7, 8] and st.done and st.why_not is None
    body = json.loads(st.continuation(b'{"model": "m", "prompt": "p"}'))
    assert body == {"model": "m", "prompt": "p", "return_token_ids": True, "resume_token_ids": [5, 6, 7, 8]}


def test_a_client_that_asked_for_ids_keeps_them():
    st = ResumeState({"model": "m", "return_token_ids": True})
    st.start(ENGINE)
    assert st.feed(event("c", 1, "a", [3])) == event("c", 1, "a", [3]) and st.ids == [3]


def test_an_engine_dead_event_is_not_forwarded_and_breaks_the_stream():
    st = ResumeState({"model": "m"})
    st.start(ENGINE)
    dead = b'data: {"error": {"message": "the engine failed", "type": "service_unavailable", ' \
           b'"param": null, "code": "engine_dead"}}\n\n'
    with pytest.raises(UpstreamFailed) as failed:
        st.feed(event("c", 1, "a", [3]) + dead + b"data: [DONE]\n\n")
    assert st.ids == [3] and not st.done
    assert failed.value.pending == event("c", 1, "a", None)  # the client's: sent before resuming


def test_what_makes_a_stream_not_resumable():
    assert not_resumable({"n": 2}) and not_resumable({"best_of": 3})
    assert not_resumable({"prompt": ["a", "b"]}) and not not_resumable({"prompt": [1, 2, 3]})
    assert not_resumable({"tools": [{}]}) and not not_resumable({"tools": [{}], "tool_choice": "none"})
    st = ResumeState({"model": "m"})
    st.start(FOREIGN)
    assert "not an llmserve engine" in st.why_not
    st = ResumeState({"model": "m"})
    st.start(ENGINE)
    st.feed(event("c", 1, "a", None))
    assert "without their token ids" in st.why_not


def test_the_body_for_engines_asks_for_ids_only_when_it_will_resume():
    raw = b' {"model": "m", "stream": true}'
    state, content = open_resume(json.loads(raw), raw, True, 2)
    assert json.loads(content) == {"return_token_ids": True, "model": "m", "stream": True} and state
    raw = b'{"model": "m", "stream": true, "return_token_ids": false}'
    assert json.loads(open_resume(json.loads(raw), raw, True, 2)[1])["return_token_ids"] is True
    for stream, resumes, body in ((False, 2, {}), (True, 0, {}), (True, 2, {"n": 3})):
        raw = json.dumps({"model": "m", **body}).encode()
        assert open_resume(json.loads(raw), raw, stream, resumes)[1] == raw


def _fed(buffers: list[bytes], body: dict, resumed_at: int | None = None) -> tuple[bytes, ResumeState]:
    st = ResumeState(body)
    st.start(ENGINE)
    out = b""
    for i, buf in enumerate(buffers):
        if i == resumed_at:
            st.start(ENGINE)
        out += st.feed(buf)
    return out, st


@pytest.mark.parametrize("body", [{"model": "m"}, {"model": "m", "return_token_ids": True}])
def test_event_by_event_as_an_engine_writes_them_is_the_same_as_one_buffer(body):
    """A buffer holding one token chunk takes feed's short path; the client must get what
    the general path gives, the resumed upstream's head replaced, ids kept or stripped."""
    first = [event("cmpl-1", 10, "a", [1]), event("cmpl-1", 10, "b", [2, 3]), event("cmpl-1", 10, "", [])]
    resumed = [event("cmpl-2", 20, "c", [4]), event("cmpl-2", 20, 'text with "data: " in it', [5]),
               event("cmpl-2", 20, "d", [6]), b"data: [DONE]\n\n"]
    one_by_one, st = _fed(first + resumed, body, resumed_at=len(first))
    whole_first, ref = _fed([b"".join(first), b"".join(resumed)], body, resumed_at=1)
    assert one_by_one == whole_first
    assert st.ids == ref.ids == [1, 2, 3, 4, 5, 6] and st.done and st.why_not is None
    expect = [event("cmpl-1", 10, t, ids if body.get("return_token_ids") else None)
              for t, ids in (("a", [1]), ("b", [2, 3]), ("", []), ("c", [4]),
                             ('text with "data: " in it', [5]), ("d", [6]))]
    assert one_by_one == b"".join(expect) + b"data: [DONE]\n\n"


def test_a_lone_chunk_without_ids_after_the_first_still_stops_resuming():
    out, st = _fed([event("c", 1, "a", [1]), event("c", 1, "b", None)], {"model": "m"})
    assert "without their token ids" in st.why_not and st.ids == [1]


def test_what_the_instance_writes_is_what_the_gateway_reads():
    """One wire format (api/stream_format.py): a chunk the instance's writer builds has its
    head where HEAD finds it and its ids where take_ids finds them, even after other keys."""
    from llmserve.api.stream_format import HEAD, attach_ids, head, sse, take_ids

    choice = {"index": 0, "text": 'a ", "token_ids": [9] "', "token_ids": [0], "finish_reason": None}
    attach_ids(choice, [5, 6])
    event = sse({**head("cmpl-1", "text_completion", 7), "model": "m", "choices": [choice]}).encode()
    assert HEAD.search(event).group(1) == b'{"id": "cmpl-1", "object": "text_completion", "created": 7'
    ids: list[int] = []
    stripped, found = take_ids(event, ids)
    assert (ids, found) == ([5, 6], 1) and b"[5, 6]" not in stripped
    assert json.loads(stripped[len(b"data: "):])["choices"][0]["text"] == 'a ", "token_ids": [9] "'
