"""docs/openai-api.md names every field /v1/responses and /v1/messages accept or refuse."""

from __future__ import annotations

import re
from pathlib import Path

from llmserve.api import messages_protocol as mp
from llmserve.api import responses_protocol as rp


def test_every_field_is_in_the_doc():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "openai-api.md").read_text()
    named = set(re.findall(r"`([a-z_\[\].]+)`", doc))
    fields = {f.alias or n for m in (rp.ResponsesRequest, mp.MessagesRequest) for n, f in m.model_fields.items()}
    fields |= set(rp.UNSUPPORTED_FIELDS) | set(mp.UNSUPPORTED_FIELDS)
    missing = sorted(fields - named)
    assert not missing, f"not in docs/openai-api.md: {missing}"
