"""The instance-provider contract: where engine instances run is not the controller's business.

A provider starts an ``llmserve engine`` (or any OpenAI-compatible server that
answers ``/ready`` and ``/load``) somewhere, says at which base URL it listens,
stops it, and says whether it is still there. Everything that crosses this
boundary is plain data (strings, numbers, lists), so a provider can hand it to
another process or machine (a subprocess's argv, a Ray actor's arguments)
without pickling live objects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What to run: the engine's flags, minus where it listens (the provider picks that).

    ``engine_args`` go to ``llmserve engine`` verbatim (``--model``, ``--threads``,
    ``--startup-delay``...). ``instance_id`` is the controller's name for it; the
    provider passes it on as ``--instance-id`` so the engine's ``/load`` reports
    carry the same name.
    """

    instance_id: str
    engine_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # A foreign OpenAI-compatible server instead of ``llmserve engine``: its argv, with
    # ``{host}``, ``{port}`` and ``{instance_id}`` for the provider to fill in.
    command: tuple[str, ...] = ()
    # "on_demand" or "spot" (autoscale/capacity_classes.py); a provider that cannot give
    # spot raises SpotUnavailable, and the controller starts it on-demand instead.
    capacity_class: str = "on_demand"
    # With replicas: the pool it belongs to and the fencing token of the leader that
    # asks for it (providers/fenced.py), kept in the provider's own listing.
    pool: str = ""
    token: int | None = None

    def __post_init__(self) -> None:
        if not self.instance_id:
            raise ValueError("instance spec: instance_id must not be empty")
        if self.command and self.engine_args:
            raise ValueError("instance spec: a command takes no engine_args")
        for a in self.engine_args:
            if a in ("--host", "--port", "--instance-id"):
                raise ValueError(f"instance spec: {a} is chosen by the provider, not the spec")


@dataclass(frozen=True, slots=True)
class InstanceHandle:
    """A started instance: its id, where it listens, and the provider's own plain-data ref."""

    instance_id: str
    url: str
    provider: str
    ref: dict[str, Any] = field(default_factory=dict)


class SpotUnavailable(RuntimeError):
    """The provider has no spot capacity for this start (refused, or none offered)."""


class RunState(str, enum.Enum):
    RUNNING = "running"    # the process or actor is alive (it may still be loading)
    EXITED = "exited"      # it ended; ``exit_code`` says how
    VANISHED = "vanished"  # the provider lost it (actor died, node gone) without an exit code
    UNKNOWN = "unknown"    # the provider could not tell this time (a slow remote call)


@dataclass(frozen=True, slots=True)
class RunStatus:
    state: RunState
    exit_code: int | None = None
    detail: str = ""
    # Unix time at which the provider will take the instance (a spot reclaim notice).
    reclaim_at: float | None = None

    @property
    def gone(self) -> bool:
        return self.state in (RunState.EXITED, RunState.VANISHED)


@runtime_checkable
class InstanceProvider(Protocol):
    """Starts, stops and watches instances. All methods are called on the controller's loop.

    Contract:
    - ``start`` returns once the instance has a base URL (the server may still be
      loading: the controller watches ``/ready``); it raises on a start that failed
      outright (no binary, no resources within the provider's timeout);
    - ``stop`` asks the instance to drain and exit (SIGTERM for an engine), waits up
      to ``grace_s``, then forces it; it returns the exit code when there is one and
      is safe to call on an instance that is already gone;
    - ``status`` never raises: a provider that cannot tell answers ``UNKNOWN``; a
      provider that learns the instance will be taken (a spot reclaim) says when in
      ``reclaim_at``, and takes it then;
    - a provider may offer ``reclaim(handle, notice_s)`` (the local one does, to
      simulate reclaims): notice now, the instance killed after ``notice_s``;
    - ``log_tail`` is for people (failure reasons), best effort;
    - ``close`` stops whatever is left and releases the provider's own resources.
    """

    name: str

    async def start(self, spec: InstanceSpec) -> InstanceHandle: ...

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None: ...

    async def status(self, handle: InstanceHandle) -> RunStatus: ...

    async def log_tail(self, handle: InstanceHandle, lines: int = 20) -> str: ...

    async def close(self) -> None: ...
