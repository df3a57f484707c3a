"""Command-line flags generated from a pydantic config model.

The model is the one source of a setting's name, type, default and help: a field
``max_num_seqs`` becomes ``--max-num-seqs``, a ``bool`` a ``--x / --no-x`` pair, a
field ending ``_s`` (seconds) drops the suffix (``--drain-timeout``). Where a flag's
name or unit differs from the field (vLLM's ``--kv-cache-memory`` for
``kv_cache_memory_bytes``, milliseconds on the command line), a :class:`Flag` in the
field's ``Annotated`` metadata says so.

Flags default to "not given" (``argparse.SUPPRESS``), so :func:`config_from` passes
only what the user typed and every default comes from the model itself.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True, slots=True)
class Flag:
    """How one field appears on the command line, where the default rule does not fit."""

    name: str | None = None          # the flag, e.g. "--kv-cache-memory"
    skip: bool = False               # not a flag (set by code, or by another flag)
    scale: float | None = None       # field value = flag value * scale (ms on the CLI, s in the field)
    parse: Callable[[Any], Any] | None = None  # flag value -> field value
    negate: bool = False             # a bool field set False by a single flag ("--engine-in-thread")
    append: bool = False             # repeatable flag, one item each ("--api-key K --api-key L")
    nargs: int | str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: tuple[str, ...] | str | None = None


def _flag_of(info) -> Flag:
    return next((m for m in info.metadata if isinstance(m, Flag)), Flag())


def _base_type(annotation: Any) -> Any:
    """``int | None`` -> ``int``; ``list[str]`` stays ``list[str]``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return annotation


def flag_name(field: str, spec: Flag) -> str:
    if spec.name:
        return spec.name
    stem = field[:-2] if field.endswith("_s") else field
    return "--" + stem.replace("_", "-")


def add_flags(group, model: type[BaseModel], *, skip: frozenset[str] = frozenset()) -> None:
    """Add one flag per field of ``model`` to an argparse parser or group."""
    for field, info in model.model_fields.items():
        spec = _flag_of(info)
        if spec.skip or field in skip:
            continue
        kw: dict[str, Any] = dict(dest=field, default=argparse.SUPPRESS)
        help_ = info.description or ""
        default = info.get_default(call_default_factory=True)
        base = _base_type(info.annotation)
        if base is bool and spec.negate:
            kw.update(action="store_false")
        elif base is bool:
            kw.update(action=argparse.BooleanOptionalAction)
            help_ = f"{help_} (default: {'on' if default else 'off'})".strip()
        else:
            if spec.append:
                kw["action"] = "append"
            elif spec.nargs is not None:
                kw["nargs"] = spec.nargs
            elif typing.get_origin(base) is list:
                kw["nargs"] = "+"
            kw["type"] = spec.type or _scalar_type(base)
            if spec.choices:
                kw["choices"] = spec.choices
            kw["metavar"] = spec.metavar or flag_name(field, spec)[2:].upper().replace("-", "_")
            if default not in (None, [], ""):
                shown = default / spec.scale if spec.scale else default
                help_ = f"{help_} (default: {shown})".strip()
        group.add_argument(flag_name(field, spec), help=help_ or None, **kw)


def _scalar_type(base: Any) -> Callable[[str], Any]:
    if typing.get_origin(base) is list:
        (item,) = typing.get_args(base) or (str,)
        return item
    if base in (int, float, str):
        return base
    if typing.get_origin(base) is dict or base is dict:
        return json.loads
    return str


def given(model: type[BaseModel], args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``model`` whose flags were given, converted to the field's units."""
    out: dict[str, Any] = {}
    for field, info in model.model_fields.items():
        if not hasattr(args, field):
            continue
        value, spec = getattr(args, field), _flag_of(info)
        if spec.scale is not None and value is not None:
            value = value * spec.scale
        if spec.parse is not None and value is not None:
            value = spec.parse(value)
        out[field] = value
    return out


def config_from(model: type[BaseModel], args: argparse.Namespace, **overrides: Any):
    """``model`` built from the given flags (and ``overrides``), validated once."""
    return model(**{**given(model, args), **overrides})
