"""Chat templates: Jinja programs shipped inside model files, rendered in a sandbox.

A chat template comes from a GGUF file or a ``tokenizer_config.json``, that is from
whoever published the model, so it is untrusted code. It runs in Jinja's
``ImmutableSandboxedEnvironment`` (no dunder attributes, no mutating lists or
dicts, bounded ``range``), with the helpers and options ``transformers`` provides
so real templates render the same here as there. On top of the sandbox:

- an unsafe attribute raises at once instead of quietly rendering as empty;
- ``*``, ``**`` and ``+`` refuse to build huge strings, lists or numbers, and the
  output is capped (memory bombs); other ways to burn CPU remain, so callers
  should still bound rendering time;
- ``namespace`` refuses underscore names.

Every failure, from a syntax error to ``raise_exception('...')`` called by the
template itself, comes out as ``ChatTemplateError`` (a ``ValueError``), which the
server turns into a 400 response.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_LENGTH = 16_000_000  # longest string or list a template may build with `*` or `+`, or output
MAX_INT_BITS = 4096  # largest integer a template may build with `*` or `**`


class ChatTemplateError(ValueError):
    """A chat template is missing, does not compile, or failed or was refused while rendering."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which would change prompts.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that rejects underscore attributes (a door to object internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: self in args
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not set the attribute {name!r} on a namespace")


class _GenerationTag(jinja2.ext.Extension):
    """Accept ``{% generation %}...{% endgeneration %}`` (a training-time marker) and render its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object "
                            "is not allowed in a chat template")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        sized = (str, list, tuple)
        if operator == "+" and isinstance(left, sized) and isinstance(right, sized):
            if len(left) + len(right) > MAX_LENGTH:
                raise SecurityError(f"a chat template may not build a sequence longer than {MAX_LENGTH}")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, sized) and isinstance(n, int) and len(seq) * n > MAX_LENGTH:
                    raise SecurityError(f"a chat template may not build a sequence longer than {MAX_LENGTH}")
            if isinstance(left, int) and isinstance(right, int) and \
                    left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise SecurityError("a chat template may not compute such a large number")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and right * abs(left).bit_length() > MAX_INT_BITS:
                raise SecurityError("a chat template may not compute such a large number")
        return super().call_binop(context, operator, left, right)


def _environment() -> _Sandbox:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True,
                   extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=_Namespace)
    return env


class ChatTemplate:
    """A compiled chat template; ``render`` turns a conversation into prompt text."""

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._template = _environment().from_string(source)
        except TemplateError as e:
            raise ChatTemplateError(f"the model's chat template does not compile: {e}") from e

    @functools.cached_property
    def _ast(self) -> jinja2.nodes.Template:
        return self._template.environment.parse(self.source)  # (milliseconds: once, not per request)

    @functools.cached_property
    def _variables(self) -> frozenset[str]:
        import jinja2.meta

        return frozenset(jinja2.meta.find_undeclared_variables(self._ast))

    def literal_text(self) -> str:
        """The template's own text and string constants, NUL-joined (to spot tokens it writes)."""
        parts = {n.data for n in self._ast.find_all(jinja2.nodes.TemplateData)}
        parts |= {n.value for n in self._ast.find_all(jinja2.nodes.Const) if isinstance(n.value, str)}
        return "\0".join(sorted(parts))

    def reads(self, name: str) -> bool:
        """Whether the template uses the variable ``name`` (e.g. ``tools``) given by the caller."""
        return name in self._variables

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
               **variables: Any) -> str:
        """Render ``messages``; ``variables`` (bos_token, eos_token, tools, ...) reach the template."""
        try:
            out, size = [], 0
            for chunk in self._template.generate(messages=list(messages),
                                                 add_generation_prompt=add_generation_prompt, **variables):
                size += len(chunk)
                if size > MAX_LENGTH:
                    raise SecurityError(f"a chat template may not render more than {MAX_LENGTH} characters")
                out.append(chunk)
            return "".join(out)
        except SecurityError as e:
            raise ChatTemplateError(f"the chat template attempted a forbidden operation: {e}") from e
        except TemplateError as e:
            raise ChatTemplateError(f"the chat template failed: {e}") from e
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, RecursionError) as e:
            raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e
