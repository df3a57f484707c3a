"""A request's output constraint, from whichever field set it: OpenAI's
``response_format`` or ``tool_choice``, vLLM's ``guided_*`` or ``structured_outputs``.
The request models allow at most one (api/protocol.py), so there is no precedence.
With a reasoning parser on, a chat's constraint applies after the reasoning; tool_choice
auto is constrained only in Hermes' notation (``OutputFormats.constrains_auto``)."""

from __future__ import annotations

from dataclasses import replace

from llmserve.api.protocol import ChatCompletionRequest, CompletionRequest
from llmserve.engine.reasoning_gate import first_phase, think_tokens
from llmserve.engine.sampling_params import StructuredOutputsParams
from llmserve.server.tool_calls import call_grammar


def structured_outputs(r: CompletionRequest | ChatCompletionRequest, reasoning_parser: str | None = None,
                       constrain_auto: bool = True) -> StructuredOutputsParams | None:
    so = _constraint(r, constrain_auto)
    if so is not None and reasoning_parser is not None and isinstance(r, ChatCompletionRequest):
        return replace(so, after_reasoning=reasoning_parser)
    return so


def prompt_phase(reasoning_parser: str | None, tokenizer, prompt_ids: list[int]) -> str | None:
    """Where a chat prompt leaves the reasoning, as the engine's grammar gate reads it."""
    tags = think_tokens(tokenizer) if reasoning_parser is not None else None
    return first_phase(reasoning_parser, *tags, prompt_ids) if tags is not None else None


def _constraint(r: CompletionRequest | ChatCompletionRequest, constrain_auto: bool) -> StructuredOutputsParams | None:
    if isinstance(r, ChatCompletionRequest) and r.tool_mode == "auto" and not constrain_auto:
        return None
    if isinstance(r, ChatCompletionRequest) and r.tool_mode != "none":
        tools = [t.model_dump(exclude_none=True) for t in r.tools or []]
        if r.tool_mode == "named":
            tools = [t for t in tools if t["function"]["name"] == r.tool_choice.function.name]
        return StructuredOutputsParams(structural_tag=call_grammar(tools, r.tool_mode, r.parallel_tool_calls))
    if r.structured_outputs is not None:
        so = r.structured_outputs
        return StructuredOutputsParams(json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar,
                                       json_object=bool(so.json_object))
    if r.guided_json is not None:
        return StructuredOutputsParams(json=r.guided_json)
    if r.guided_regex is not None:
        return StructuredOutputsParams(regex=r.guided_regex)
    if r.guided_choice is not None:
        return StructuredOutputsParams(choice=r.guided_choice)
    if r.guided_grammar is not None:
        return StructuredOutputsParams(grammar=r.guided_grammar)
    fmt = r.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object" or fmt.json_schema.schema_ is None:
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=fmt.json_schema.schema_)
