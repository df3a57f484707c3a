"""Which JSON Schema keywords an output constraint can guarantee (pure).

xgrammar turns a schema into a grammar, but some keywords it drops or half-applies
(probed on 0.2.9): ``not``, ``if``/``then``/``else``, ``uniqueItems``,
``dependentRequired`` / ``dependentSchemas``, ``allOf`` of more than one schema, a
``multipleOf`` on a non-integer, ``required`` names missing from ``properties``, and
a remote ``$ref`` are ignored (outputs then fail the schema); ``patternProperties``,
``propertyNames`` and ``contains`` make it refuse every object or array. A request whose
answer could not match its schema is refused instead (vLLM falls back to another
backend for such schemas; with one backend, the 400 is the honest answer).
"""

from __future__ import annotations

from typing import Any

# Keywords refused wherever they appear, and why (said in the 400).
_REFUSED = {
    "not": "ignored by the grammar", "if": "ignored by the grammar", "then": "ignored by the grammar",
    "else": "ignored by the grammar", "uniqueItems": "not enforced", "dependentRequired": "not enforced",
    "dependentSchemas": "not enforced", "patternProperties": "not supported",
    "propertyNames": "not supported", "contains": "not supported", "minContains": "not supported",
    "maxContains": "not supported", "additionalItems": "not supported (use prefixItems and items)",
}
# Keywords whose value holds one subschema, or a list / a name -> subschema map of them.
_ONE = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions")


def unsupported(schema: Any, path: str = "") -> str | None:
    """Why ``schema`` cannot be guaranteed (naming the keyword and where), or None."""
    if not isinstance(schema, dict):
        return None
    where = path or "the schema"
    for key, why in _REFUSED.items():
        if key in schema and not (key == "uniqueItems" and schema[key] is False):
            return f"{where}: '{key}' is {why}, so answers could not be guaranteed to match"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return f"{where}: 'allOf' of more than one schema is not supported"
    if "multipleOf" in schema and schema.get("type") != "integer":
        return f"{where}: 'multipleOf' is enforced on integers only"
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return f"{where}: '$ref' {ref!r} is not in the schema (only local references, '#/...')"
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    missing = [r for r in schema.get("required") or [] if isinstance(r, str) and r not in props]
    if missing:
        return f"{where}: required {missing[0]!r} is not in 'properties' (name its schema there)"
    return _inner(schema, path)


def _inner(schema: dict, path: str) -> str | None:
    for key in _ONE:
        if (why := unsupported(schema.get(key), f"{path}.{key}".lstrip("."))) is not None:
            return why
    for key in _LIST:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                if (why := unsupported(sub, f"{path}.{key}[{i}]".lstrip("."))) is not None:
                    return why
    for key in _MAP:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                if (why := unsupported(sub, f"{path}.{key}.{name}".lstrip("."))) is not None:
                    return why
    return None
