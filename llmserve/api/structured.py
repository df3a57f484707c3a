"""Request models for constrained outputs and tools: OpenAI's ``response_format``,
``tools`` and ``tool_choice``, vLLM's ``guided_*`` fields and ``structured_outputs``.

A JSON schema is checked against its meta-schema here (at the gateway too), so a
schema that is not JSON Schema is a 400 naming the field; whether a valid schema,
regex or grammar compiles is the engine's to say (also a 400, from the instance).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator


class Limits:
    TOOLS = 128  # OpenAI's cap
    REGEX_CHARS = 16_384
    GRAMMAR_CHARS = 65_536
    CHOICES = 1024
    CHOICE_CHARS = 1024
    DESCRIPTION_CHARS = 8192
    TOOL_CALLS = 128  # in one assistant message
    ARGUMENTS_CHARS = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


def check_json_schema(schema: Any) -> dict[str, Any]:
    """``schema`` if it is a JSON Schema (an object valid against its meta-schema)."""
    from jsonschema import Draft202012Validator, exceptions, validators

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise ValueError("must be a JSON Schema object (this string is not JSON)") from None
    if not isinstance(schema, dict):
        raise ValueError("must be a JSON Schema object")
    try:
        validators.validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise ValueError(f"is not a valid JSON Schema: {e.message}" + (f" (at {where})" if where else "")) from None
    return schema


Schema = dict[str, Any]  # a JSON Schema, checked by check_json_schema
FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


# ---- response_format --------------------------------------------------------------------

class JSONSchemaSpec(_Strict):
    name: FunctionName
    description: Annotated[str, Field(max_length=Limits.DESCRIPTION_CHARS)] | None = None
    schema_: Schema | None = Field(None, alias="schema")
    strict: bool | None = None  # outputs always match the schema here, strict or not

    _check = field_validator("schema_")(classmethod(lambda cls, v: v if v is None else check_json_schema(v)))


class ResponseFormatText(_Strict):
    type: Literal["text"]


class ResponseFormatJSONObject(_Strict):
    type: Literal["json_object"]


class ResponseFormatJSONSchema(_Strict):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


def _format_type(v: Any) -> str | None:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return f"type={kind}" if isinstance(kind, str) else None


# Tags spelled "type=..." so that error paths can drop them (parse._is_type_tag).
ResponseFormat = Annotated[
    Annotated[ResponseFormatText, Tag("type=text")] | Annotated[ResponseFormatJSONObject, Tag("type=json_object")]
    | Annotated[ResponseFormatJSONSchema, Tag("type=json_schema")],
    Discriminator(_format_type, custom_error_type="invalid_value",
                  custom_error_message="response_format.type must be 'text', 'json_object' or 'json_schema'")]


# ---- vLLM's structured_outputs ------------------------------------------------------------

Regex = Annotated[str, Field(min_length=1, max_length=Limits.REGEX_CHARS)]
Grammar = Annotated[str, Field(min_length=1, max_length=Limits.GRAMMAR_CHARS)]
Choices = Annotated[list[Annotated[str, Field(min_length=1, max_length=Limits.CHOICE_CHARS)]],
                    Field(min_length=1, max_length=Limits.CHOICES)]


class StructuredOutputs(_Strict):
    """vLLM's ``structured_outputs``: exactly one constraint."""

    json_: Schema | str | None = Field(None, alias="json")
    regex: Regex | None = None
    choice: Choices | None = None
    grammar: Grammar | None = None
    json_object: bool | None = None

    _check = field_validator("json_")(classmethod(lambda cls, v: v if v is None else check_json_schema(v)))

    @model_validator(mode="after")
    def _one(self) -> "StructuredOutputs":
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar, json_object")
        return self


# ---- tools --------------------------------------------------------------------------------

class FunctionDefinition(_Strict):
    name: FunctionName
    description: Annotated[str, Field(max_length=Limits.DESCRIPTION_CHARS)] | None = None
    parameters: Schema | None = None
    strict: bool | None = None  # arguments always match the parameters when generation is constrained

    _check = field_validator("parameters")(classmethod(lambda cls, v: v if v is None else check_json_schema(v)))


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


def _choice_kind(v: Any) -> Any:
    """A string or a value of another type named plainly, not as the union's members."""
    if (isinstance(v, str) and v not in ("none", "auto", "required")) or not isinstance(v, (str, dict)):
        raise ValueError(f"got {v!r}; tool_choice is 'none', 'auto', 'required' or "
                         '{"type": "function", "function": {"name": ...}}')
    return v


ToolChoice = Annotated[Literal["none", "auto", "required"] | NamedToolChoice, BeforeValidator(_choice_kind)]


class ToolCallFunction(_Strict):
    name: Annotated[str, Field(max_length=64)]
    arguments: Annotated[str, Field(max_length=Limits.ARGUMENTS_CHARS)]


class ToolCall(_Strict):
    """A call as an assistant message carries it back in the next turn."""

    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"]
    function: ToolCallFunction

    def for_template(self) -> dict[str, Any]:
        """HF chat templates expect ``arguments`` as an object; a non-JSON string stays as it is."""
        try:
            args: Any = json.loads(self.function.arguments)
        except ValueError:
            args = self.function.arguments
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": args}}


ToolCalls = Annotated[list[ToolCall], Field(min_length=1, max_length=Limits.TOOL_CALLS)]
Tools = Annotated[list[Tool], Field(min_length=1, max_length=Limits.TOOLS)]
