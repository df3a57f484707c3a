"""What a JSON schema constraint can guarantee: the keywords refused (pure), and, on the
grammar itself, that the ones accepted are enforced (an xgrammar upgrade that changes
either side fails here)."""

from __future__ import annotations

import json

import pytest

from llmserve.engine.schema_support import unsupported

REFUSED = [
    ({"not": {"type": "string"}}, "'not'"),
    ({"type": "object", "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, "'if'"),
    ({"type": "number", "multipleOf": 0.5}, "'multipleOf'"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "'allOf'"),
    ({"type": "object", "properties": {}, "required": ["x"], "additionalProperties": False}, "required 'x'"),
    ({"$ref": "http://example.com/x.json"}, "'$ref'"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "'uniqueItems'"),
    ({"type": "object", "patternProperties": {"^a": {"type": "integer"}}}, "'patternProperties'"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"not": {}}}}}, "properties.a.items: 'not'"),
    ({"anyOf": [{"type": "integer"}, {"type": "object", "dependentRequired": {"a": ["b"]}}]}, "anyOf[1]"),
    ({"$defs": {"x": {"type": "number", "multipleOf": 3}}, "$ref": "#/$defs/x"}, "$defs.x"),
]


@pytest.mark.parametrize("schema,says", REFUSED)
def test_keywords_the_grammar_would_not_enforce_are_named_with_their_place(schema, says):
    why = unsupported(schema)
    assert why is not None and says in why


# Accepted schemas, each with an answer that matches and one that does not: the grammar
# must take the first and refuse the second (so accepting them is honest).
ENFORCED = [
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, '{"a": 1}', "{}"),
    ({"type": "integer", "multipleOf": 2}, "4", "3"),
    ({"type": "string", "pattern": "^a+$"}, '"aa"', '"b"'),
    ({"type": "string", "minLength": 2, "maxLength": 3}, '"ab"', '"abcd"'),
    ({"type": "integer", "minimum": 1, "exclusiveMaximum": 3}, "2", "3"),
    ({"type": "number", "minimum": 0.5}, "0.6", "0.4"),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, '"a"', "null"),
    ({"allOf": [{"type": "string"}]}, '"a"', "1"),
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"}, "1", '"a"'),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, "[1]", "[1, 2]"),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, '{"b": 1}', '{"b": "x"}'),
    ({"type": "string", "format": "date"}, '"2020-01-02"', '"zz"'),
]


@pytest.mark.parametrize("schema,good,bad", ENFORCED)
def test_what_is_accepted_the_grammar_enforces(schema, good, bad):
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from llmserve.engine.grammar import schema_ebnf

    assert unsupported(schema) is None
    grammar = xgr.Grammar.from_ebnf(schema_ebnf(xgr, json.dumps(schema)))
    assert accepts(grammar, good) and not accepts(grammar, bad)
