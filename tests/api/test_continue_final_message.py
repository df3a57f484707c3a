"""continue_final_message (vLLM's chat field; Anthropic's assistant prefill): the prompt
ends right after the final message's text, as transformers' apply_chat_template cuts it,
and /v1/messages continues a final assistant message instead of opening a new turn."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from llmserve.models.model_source import load_tokenizer

PREFILL = [{"role": "user", "content": "What is the capital of France? Answer in JSON."},
           {"role": "assistant", "content": "{\"capital\": \""}]


@pytest.mark.real_model
def test_the_prompt_is_transformers_continue_final_message(smollm2_path, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name, local_files_only=True)
    tok = load_tokenizer(smollm2_path, tmp_path)
    for msgs in (PREFILL, [*PREFILL[:1], {"role": "assistant", "content": "Sure, it is  "}]):
        want = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, continue_final_message=True)
        got = tok.apply_chat_template(msgs, add_generation_prompt=False, continue_final_message=True)
        assert got == want and not got.endswith("<|im_end|>\n")
        assert tok.encode_chat(msgs, add_generation_prompt=False, continue_final_message=True) == \
            hf.encode(want, add_special_tokens=False)


def _post(host, path: str, body: dict) -> httpx.Response:
    return httpx.post(host[0] + path, json=body, headers={"authorization": f"Bearer {host[1]}"}, timeout=60)


def test_chat_continues_the_final_message_and_messages_prefill_uses_it(host):
    base = {"model": "tiny", "max_tokens": 6, "temperature": 0, "messages": PREFILL}
    cont = _post(host, "/v1/chat/completions", {**base, "continue_final_message": True,
                                                "add_generation_prompt": False})
    assert cont.status_code == 200, cont.text
    client = anthropic.Anthropic(base_url=host[0], api_key=host[1], max_retries=0, timeout=60)
    m = client.messages.create(model="tiny", max_tokens=6, messages=PREFILL, extra_body={"temperature": 0})
    assert (m.content[0].text if m.content else "") == (cont.json()["choices"][0]["message"]["content"] or "")
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == cont.json()["usage"]["prompt_tokens"]


def test_continue_final_message_with_add_generation_prompt_is_a_400(host):
    r = _post(host, "/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "messages": PREFILL,
                                             "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    r = _post(host, "/v1/chat/completions", {"model": "tiny", "max_tokens": 2, "messages": PREFILL,
                                             "chat_template_kwargs": {"continue_final_message": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
