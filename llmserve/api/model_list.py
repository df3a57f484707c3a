"""``GET /v1/models`` in one shape for both SDKs that read it: OpenAI's list (``object``,
``data`` of ``{id, object, created, owned_by}``), with Anthropic's fields beside
(``type``, ``display_name``, ``created_at`` per model; ``has_more``, ``first_id``,
``last_id``), which OpenAI's clients ignore: ``anthropic.Anthropic(...).models.list()``
read them as None. Shared by the instance and the gateway."""

from __future__ import annotations

import datetime
from typing import Any


def with_anthropic_fields(card: dict[str, Any]) -> dict[str, Any]:
    created = datetime.datetime.fromtimestamp(card["created"], datetime.UTC)
    return {**card, "type": "model", "display_name": card["id"],
            "created_at": created.isoformat().replace("+00:00", "Z")}


def model_list(cards: list[dict[str, Any]]) -> dict[str, Any]:
    data = [with_anthropic_fields(c) for c in cards]
    return {"object": "list", "data": data, "has_more": False,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}
