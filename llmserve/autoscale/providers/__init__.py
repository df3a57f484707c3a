"""Where instances run: local subprocesses (the default) or Ray actors.

The controller only sees :class:`InstanceProvider`; ``local`` and ``ray`` are two
implementations. ``ray`` is imported lazily (it is an optional extra).
"""

from llmserve.autoscale.providers.base import InstanceHandle, InstanceProvider, InstanceSpec, RunState, RunStatus
from llmserve.autoscale.providers.local import LocalProvider, LocalProviderConfig

__all__ = ["InstanceHandle", "InstanceProvider", "InstanceSpec", "LocalProvider", "LocalProviderConfig",
           "RunState", "RunStatus"]
