"""Tool calls in the Hermes / Qwen format: the prompt that offers tools and the
grammar that constrains calls (``tool_parser.py`` reads them back).

A model whose chat template renders ``tools`` itself gets them that way; for one
whose template does not (SmolLM2's), the tools' JSON schemas go into a system
message that asks for calls as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and past calls and tool results are written back in the same notation (or, with
``--tool-call-parser``, in that parser's: ``ASK``). Generation is constrained to Hermes': with
``tool_choice`` "required" or a named function the output is one or more calls
whose arguments match the function's parameters; with "auto" the text is free
until the model opens ``<tool_call>``, and the call inside is constrained.
"""

from __future__ import annotations

import json
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"

TOOLS_SYSTEM = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

"""
_ARGS = "<args-json-object>"
# How the tools text asks for calls, in the notation they are read back in (--tool-call-parser):
# asking for Hermes' tags while reading Phi-4-mini's functools[...] would lose every call.
ASK = {
    "hermes": ("For each function call, return a json object with function name and arguments within "
               f'<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": {_ARGS}}}\n</tool_call>'),
    "llama3_json": ('To call functions, answer with only one JSON object per call, separated by "; ":\n'
                    f'{{"name": <function-name>, "parameters": {_ARGS}}}'),
    "mistral": f'To call functions, answer with [TOOL_CALLS] and a JSON list of calls:\n[TOOL_CALLS][{{"name": <function-name>, "arguments": {_ARGS}}}]',
    "phi4_mini_json": f'To call functions, answer with functools and a JSON list of calls:\nfunctools[{{"name": <function-name>, "arguments": {_ARGS}}}]',
    "pythonic": "To call functions, answer with only a Python list of calls:\n[function_name(argument=value, ...), ...]",
}
ASK["llama4_pythonic"] = ASK["pythonic"]


# ---- prompt ------------------------------------------------------------------------------

def render_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    notation: str = "hermes") -> list[dict[str, Any]]:
    """Messages for a template with no tool syntax: tools in the system message, calls (in
    ``notation``, the parser's) and results as text (consecutive results in one user turn, as
    Qwen's template does)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = _calls_text([_call_body(c) for c in m["tool_calls"]], notation)
            out.append({"role": "assistant", "content": (m["content"] + "\n" if m["content"] else "") + calls})
        elif m["role"] == "tool":
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_results"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_results": True})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    for m in out:
        m.pop("_results", None)
    if tools:
        block = TOOLS_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools)) \
            + ASK.get(notation, ASK["hermes"])
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def _call_body(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    return {"name": fn["name"], "arguments": fn["arguments"]}


def _calls_text(bodies: list[dict[str, Any]], notation: str) -> str:
    """Past calls as the model writes them in ``notation``."""
    dump = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    if notation == "llama3_json":
        return "; ".join(dump({"name": b["name"], "parameters": b["arguments"]}) for b in bodies)
    if notation == "mistral":
        return "[TOOL_CALLS]" + dump(bodies)
    if notation == "phi4_mini_json":
        return "functools" + dump(bodies)
    if notation in ("pythonic", "llama4_pythonic"):
        args = [b["arguments"] if isinstance(b["arguments"], dict) else {} for b in bodies]
        return "[" + ", ".join(f"{b['name']}({', '.join(f'{k}={v!r}' for k, v in a.items())})"
                               for b, a in zip(bodies, args)) + "]"
    return "\n".join(f"{OPEN}\n{dump(b)}\n{CLOSE}" for b in bodies)


# ---- grammar -----------------------------------------------------------------------------

def call_grammar(tools: list[dict[str, Any]], mode: str, parallel: bool) -> dict[str, Any] | None:
    """The xgrammar structural tag for ``mode`` ('auto', 'required', or 'named' with
    ``tools`` holding just that function); None for 'none'."""
    if mode == "none":
        return None
    tags = [{"type": "tag", "begin": OPEN + "\n", "end": "\n" + CLOSE, "content": {
        "type": "json_schema", "json_schema": call_schema(t["function"])}} for t in tools]
    if mode == "auto":
        fmt = {"type": "triggered_tags", "triggers": [OPEN], "tags": tags, "at_least_one": False,
               "stop_after_first": not parallel}
    else:
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
               "stop_after_first": mode == "named" or not parallel}
    return {"type": "structural_tag", "format": fmt}


DEFS = ("$defs", "definitions")  # where JSON Schema (2019+ and draft 7) keeps what "$ref" names


def call_schema(function: dict[str, Any]) -> dict[str, Any]:
    """``{"name": <const>, "arguments": <parameters>}``. The parameters move one level down,
    so their local references follow them: ``#/$defs/X`` (pydantic's nested models) stays
    valid by lifting the definitions to this root, any other ``#/...`` gains the path."""
    params = dict(function.get("parameters") or {"type": "object", "properties": {}})
    lifted = {k: params.pop(k) for k in DEFS if k in params}

    def moved(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: moved(v) for k, v in node.items()}
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#") and not ref.startswith(tuple(f"#/{k}/" for k in lifted)):
                out["$ref"] = "#/properties/arguments" + ref[1:]
            return out
        return [moved(v) for v in node] if isinstance(node, list) else node

    return {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": function["name"]}, "arguments": moved(params)},
            **{k: moved(v) for k, v in lifted.items()}}
