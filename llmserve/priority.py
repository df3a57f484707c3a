"""A request's priority: one parser for the gateway, the instance server and the engine.

A priority is an integer and lower runs first: the engine's scheduler orders by
it and preempts running requests of a larger number for a smaller one. The
names are levels: ``"realtime"`` is 0 and ``"batch"`` is 1. The gateway queues
by class only: a priority <= 0 is realtime, > 0 is batch (the engine's
``is_batch_class`` draws the same line).

Every caller parses with a :class:`PriorityRange` and turns the ``ValueError`` into
its own 400 (param ``priority``); the range is what that caller accepts, not a
clamp. Digit strings are measured before ``int()`` so a 5,000-digit value costs
nothing and never reaches Python's own digit limit (a ValueError of another kind).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

REALTIME = 0
BATCH = 1
_NAMES = {"realtime": REALTIME, "batch": BATCH}


class PriorityClass(enum.IntEnum):
    """The gateway's two queues; a smaller value is dispatched first."""

    REALTIME = 0
    BATCH = 1

    @classmethod
    def of(cls, priority: int) -> PriorityClass:
        return cls.REALTIME if priority <= REALTIME else cls.BATCH

    @property
    def level(self) -> int:
        """The priority a request of this class carries when it names no integer."""
        return REALTIME if self is PriorityClass.REALTIME else BATCH


@dataclass(frozen=True, slots=True)
class PriorityRange:
    """Integer priorities ``min`` (most urgent) to ``max`` (least), both included."""

    min: int
    max: int

    def __post_init__(self) -> None:
        for v in (self.min, self.max):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"a priority range needs integers, got {v!r}")
            if not WIRE_MIN <= v <= WIRE_MAX:
                raise ValueError(f"priority range bound {v} is outside [{WIRE_MIN}, {WIRE_MAX}]")
        if self.min > self.max:
            raise ValueError(f"priority range [{self.min}, {self.max}] is empty")

    def __contains__(self, priority: int) -> bool:
        return self.min <= priority <= self.max

    def __str__(self) -> str:
        return f"[{self.min}, {self.max}]"


# A signed 32-bit integer: what any caller may accept at all.
WIRE_MIN, WIRE_MAX = -(2**31), 2**31 - 1
WIRE_RANGE = PriorityRange(WIRE_MIN, WIRE_MAX)
# Only the two named levels: what an instance accepts unless configured wider.
NAMED_RANGE = PriorityRange(REALTIME, BATCH)
_MAX_CHARS = len(str(WIRE_MIN))  # sign and 10 digits


def _error(value: object, allowed: PriorityRange) -> ValueError:
    if isinstance(value, int) and value.bit_length() > 64:
        shown = f"an integer of {value.bit_length()} bits"  # repr() of a huge int raises
    else:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
    return ValueError(f"priority must be 'realtime', 'batch' or an integer in {allowed}, got {shown}")


def parse_priority(value: object, allowed: PriorityRange = WIRE_RANGE) -> int | None:
    """``"realtime"`` → 0, ``"batch"`` → 1 (any case, spaces around ignored), an
    integer or a string of one as given. ``None`` (not given) stays None: the
    caller's default applies. Anything else, or an integer outside ``allowed``,
    raises ValueError; nothing else is ever raised.
    """
    if value is None:
        return None
    if isinstance(value, bool):  # an int to Python, never a priority to a client
        raise _error(value, allowed)
    if isinstance(value, str):
        text = value.strip()
        named = _NAMES.get(text.lower())
        if named is not None:
            value = named
        else:
            digits = text[1:] if text[:1] in "+-" else text
            # isascii: str.isdigit() also accepts other scripts' digits and superscripts.
            if not (len(text) <= _MAX_CHARS and digits.isascii() and digits.isdigit()):
                raise _error(value, allowed)
            value = int(text)
    if not isinstance(value, int):
        raise _error(value, allowed)
    if value not in allowed:
        raise _error(value, allowed)
    return int(value)
