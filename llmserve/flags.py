"""Command-line flags generated from a pydantic config model.

The model is the one source of a setting's name, type, default and help: a field
``max_num_seqs`` becomes ``--max-num-seqs``, a ``bool`` a ``--x / --no-x`` pair, a
field ending ``_s`` (seconds) drops the suffix (``--drain-timeout``). Where a flag's
name or unit differs from the field (vLLM's ``--kv-cache-memory`` for
``kv_cache_memory_bytes``, milliseconds on the command line), a :class:`Flag` in the
field's ``Annotated`` metadata says so. A ``Literal`` field's values are its choices;
a field holding a nested model (a section: ``AutoscaleConfig.bounds``) is no flag, its
own fields are (``add_flags(group, BoundsConfig)``).

Flags default to "not given" (``argparse.SUPPRESS``), so :func:`config_from` passes
only what the user typed and every default comes from the model itself; a bad value
is refused once, by the model, and :func:`flag_error` names it by its flag.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError


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
    const: Any = None                # nargs="?": the value of the bare flag ("--plot" alone)
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: tuple[str, ...] | str | None = None
    show: Callable[[Any], Any] | None = None  # the default as the help writes it, in the flag's syntax


_UNITS = {"": 1, "K": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4,
          "KI": 1024, "MI": 1024 ** 2, "GI": 1024 ** 3, "TI": 1024 ** 4}


def byte_size(text: str) -> int:
    """``"2G"``, ``"512MiB"``, ``"1.5GB"`` or plain bytes -> bytes (K/M/G/T decimal, Ki/Mi/Gi/Ti binary)."""
    s = str(text).strip().upper().removesuffix("B")
    num = s.rstrip("KMGTI")
    unit = s[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a size (bytes, or a number with K, M, G, T, Ki, Mi, Gi, Ti)") from None
    return int(value)


def _flag_of(info) -> Flag:
    return next((m for m in info.metadata if isinstance(m, Flag)), Flag())


def _base_type(annotation: Any) -> Any:
    """``int | None`` -> ``int``; ``list[str]`` stays ``list[str]``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return annotation


def _is_flag(info) -> bool:
    """Not marked ``skip``, and not a section (a nested model without a :class:`Flag`)."""
    spec = next((m for m in info.metadata if isinstance(m, Flag)), None)
    if spec is not None:
        return not spec.skip
    base = _base_type(info.annotation)
    return not (isinstance(base, type) and issubclass(base, BaseModel))


def flag_name(field: str, spec: Flag) -> str:
    if spec.name:
        return spec.name
    stem = field[:-2] if field.endswith("_s") else field
    return "--" + stem.replace("_", "-")


def add_flags(group, model: type[BaseModel], *, skip: frozenset[str] = frozenset(),
              defaults: Mapping[str, Any] | None = None) -> None:
    """Add one flag per field of ``model`` to an argparse parser or group. ``defaults``:
    the ones the caller puts under what is given, in place of the model's in the help."""
    for field, info in model.model_fields.items():
        spec = _flag_of(info)
        if not _is_flag(info) or field in skip:
            continue
        kw: dict[str, Any] = dict(dest=field, default=argparse.SUPPRESS)
        help_ = info.description or ""
        default = (defaults or {}).get(field, None if info.is_required()
                                       else info.get_default(call_default_factory=True))
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
                if spec.const is not None:
                    kw["const"] = spec.const
            elif typing.get_origin(base) is list and spec.parse is None:  # parse: one value, its own shape
                kw["nargs"] = "+"
            kw["type"] = spec.type or _scalar_type(base)
            choices = spec.choices or (typing.get_args(base) if typing.get_origin(base) is typing.Literal else None)
            if choices:
                kw["choices"] = choices
            if spec.metavar or not choices:  # else argparse shows the choices
                kw["metavar"] = spec.metavar or flag_name(field, spec)[2:].upper().replace("-", "_")
            shown = default
            if default is not None and spec.show:
                shown = spec.show(default)
            elif default is not None and spec.scale:
                shown = default / spec.scale
            if shown not in (None, [], ""):
                help_ = f"{help_} (default: {shown})".strip()
        group.add_argument(flag_name(field, spec), help=help_ or None, **kw)


def _scalar_type(base: Any) -> Callable[[str], Any]:
    if typing.get_origin(base) is list:
        (item,) = typing.get_args(base) or (str,)
        return item
    if base in (int, float, str):
        return base
    if typing.get_origin(base) is typing.Literal:
        return type(typing.get_args(base)[0])
    if typing.get_origin(base) is dict or base is dict:
        return json.loads
    return str


def given(model: type[BaseModel], args: argparse.Namespace, *,
          skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The fields of ``model`` whose flags were given, converted to the field's units
    (a field that is no flag, or skipped as in :func:`add_flags`, is never read, whatever
    else sets that name)."""
    out: dict[str, Any] = {}
    for field, info in model.model_fields.items():
        if not hasattr(args, field) or not _is_flag(info) or field in skip:
            continue
        value, spec = getattr(args, field), _flag_of(info)
        if spec.scale is not None and value is not None:
            value = value * spec.scale
        if spec.parse is not None and value is not None:
            try:
                value = spec.parse(value)
            except ValueError as e:  # named by its flag, as a model's refusal is (flag_error)
                flag = flag_name(field, spec)
                raise ValueError(str(e) if str(e).startswith(flag) else f"{flag}: {e}") from None
        out[field] = value
    return out


def config_from(model: type[BaseModel], args: argparse.Namespace, **overrides: Any):
    """``model`` built from the given flags (and ``overrides``), validated once."""
    return model(**{**given(model, args), **overrides})


def flag_error(e: ValidationError, *models: type[BaseModel]) -> str:
    """``e`` in one line, each bad value named by its flag (``--num-prompts: ...``):
    pydantic's own text is several lines per error and names the field."""
    # (only the flags' own models: a config file's key ``port`` is no ``--port``)
    flags = {f: flag_name(f, _flag_of(info)) for m in models if m.__name__ == e.title
             for f, info in m.model_fields.items() if _is_flag(info)}
    out = []
    for err in e.errors(include_url=False):
        loc, msg = err["loc"], err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":  # (its input is the parent mapping, defaults and all)
            msg = "is required"
        elif err["type"] != "value_error":  # a constraint's message leaves the value out
            msg = f"{msg}, got {err['input']!r}"
        where = flags.get(loc[0], ".".join(map(str, loc))) if loc else ""  # type: ignore[call-overload]
        out.append(f"{where}: {msg}" if where else msg)
    return "; ".join(out)
