"""Shared by the live tests of /v1/responses and /v1/messages: the tool, schema and oracle."""

from __future__ import annotations

import httpx

# An enum keeps a random model's forced arguments short: the grammar leaves it two words.
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                  "required": ["city"], "additionalProperties": False}
COLOUR = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}


def chat_text(base_url: str, messages: list[dict], headers: dict | None = None, **kw) -> str:
    """The oracle: the chat route's greedy answer to the same conversation."""
    body = {"model": "tiny", "messages": messages, "temperature": 0, **kw}
    r = httpx.post(base_url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"] or ""
