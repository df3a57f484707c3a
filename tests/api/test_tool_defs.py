"""A tool whose parameters are a pydantic model with a nested one (``openai.pydantic_function_tool``
writes ``$defs`` and ``$ref``) is taken and its forced call's arguments validate, on an instance
and the gateway: the call's grammar moved the parameters under ``arguments`` and lost ``$defs``."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pydantic


class Item(pydantic.BaseModel):
    sku: Literal["apple", "pear"]
    ripe: bool


class Order(pydantic.BaseModel):
    items: list[Item] = pydantic.Field(min_length=1, max_length=2)


def test_a_pydantic_tool_with_nested_models_is_called_with_valid_arguments(host):
    client = openai.OpenAI(base_url=host[0] + "/v1", api_key=host[1], max_retries=0, timeout=120)
    tool = openai.pydantic_function_tool(Order)
    assert "$defs" in json.dumps(tool)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "order a pear"}], temperature=0, tools=[tool])
    # auto: the call is the model's to make (a random model's text here); the tool is taken
    assert client.chat.completions.create(**kw, max_tokens=8, tool_choice="auto").choices[0].finish_reason
    c = client.chat.completions.create(**kw, max_tokens=120, tool_choice="required", parallel_tool_calls=False)
    assert c.choices[0].finish_reason == "tool_calls"
    (call,) = c.choices[0].message.tool_calls
    assert call.function.name == "Order"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    Order.model_validate_json(call.function.arguments)
