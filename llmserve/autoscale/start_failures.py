"""When a pool stops starting instances, purely (Ray Serve's DEPLOY_FAILED).

Instances that fail before they ever get ready hold further starts for a doubling
back-off (:class:`~llmserve.autoscale.executor.Executor`). After ``limit`` of them in
a row, with none of the pool's instances serving, another start will not do better
(a corrupt model file, a bad engine flag): the pool gives up, says why once, and
fails its requests at once with that reason, until an operator retries it
(``POST /admin/autoscale/retry``). An instance that gets ready ends the run and
clears it; ``limit`` 0 never gives up (back-off only, as Kubernetes' CrashLoopBackOff).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GaveUp:
    """A pool that stopped starting instances: how many failed in a row, the last one's reason."""

    failures: int
    last_failure: str
    at_wall: float

    def message(self, pool: str) -> str:
        return (f"pool {pool} failed: {self.failures} instances in a row failed before getting ready "
                f"(the last: {self.last_failure}); no more are started until an operator retries it")

    def view(self, pool: str) -> dict:
        return {"failures": self.failures, "last_failure": self.last_failure, "since": self.at_wall,
                "message": self.message(pool)}


def gives_up(failures: int, limit: int, serving: int) -> bool:
    """``failures`` instances in a row failed before getting ready: stop starting more?
    Never while ``serving`` instances prove the pool can run (Ray Serve's rule too)."""
    return limit > 0 and failures >= limit and serving == 0
