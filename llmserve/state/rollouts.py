"""Who holds a model's rollout: this process alone, or every replica through the store.

The gateway drives its canaries through one of two :class:`Rollouts`:

- :class:`LocalRollouts` (no ``state.redis_url``): the analysis lives in this
  process, exactly as a single gateway has always kept it;
- :class:`SharedRollouts`: the rollout is a shared document (``rollout_doc.py``)
  that every replica adopts as it changes (``replica.py``), so the weights, the
  stage and the history are the same on every replica. A look or an admin action
  is applied locally and written by compare-and-set: when two replicas act at once
  exactly one wins and the other adopts the winner's rollout. Which replicas may
  look at all is ``may_decide`` (every replica by default; the leader alone with a
  lease).

Degrade, never fail: while the store is away every replica routes on the last
rollout it adopted, takes no look and refuses admin actions (``Frozen``, a 503): no
promote and no roll back without the store. The outcomes seen meanwhile stay
evidence for the look taken when the store returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from llmserve.gateway.canary import Action, CanaryAnalysis
from llmserve.state.replica import Frozen, Replica
from llmserve.state.rollout_doc import adopt, rollout_doc


class Rollout(Protocol):
    """What a rollout driver needs of a model's runtime (``gateway/runtime.py``)."""

    name: str
    canary: CanaryAnalysis | None

    def tick(self, now: float) -> Action: ...

    def canary_action(self, action: str, reason: str) -> None: ...

    def apply_weights(self) -> None: ...


class Rollouts(Protocol):
    async def tick(self, rt: Rollout, now: float) -> None: ...

    async def refresh(self, rt: Rollout) -> None:
        """Bring ``rt`` up to date before it is shown."""

    async def act(self, rt: Rollout, action: str, reason: str) -> None:
        """Apply an admin action; raises InvalidTransition or Frozen."""


class LocalRollouts:
    """One process: the analysis is the truth."""

    async def tick(self, rt: Rollout, now: float) -> None:
        rt.tick(now)

    async def refresh(self, rt: Rollout) -> None:
        return None

    async def act(self, rt: Rollout, action: str, reason: str) -> None:
        rt.canary_action(action, reason)


class RolloutDocument:
    """A model's rollout as a shared document. Its evidence stays this replica's."""

    role = "peer"

    def __init__(self, rt: Rollout) -> None:
        assert rt.canary is not None
        # One document per rollout pair: a new canary in the config is a new rollout.
        self.key = f"rollout:{rt.name}/{rt.canary.canary}/{rt.canary.stable}"
        self.rt = rt
        self.canary: CanaryAnalysis = rt.canary

    def snapshot(self) -> dict[str, Any]:
        return rollout_doc(self.canary)

    def adopt(self, value: dict[str, Any]) -> None:
        adopt(self.canary, value)

    def checkpoint(self) -> Any:
        return rollout_doc(self.canary), self.canary.evidence

    def restore(self, checkpoint: Any) -> None:
        doc, evidence = checkpoint
        adopt(self.canary, doc)
        self.canary.evidence = evidence  # the step's outcomes, kept for the next look

    def settle(self) -> None:
        self.rt.apply_weights()


class SharedRollouts:
    """Rollouts as documents of ``replica``."""

    def __init__(self, replica: Replica, models: Iterable[Rollout], *,
                 may_decide: Callable[[], bool] = lambda: True) -> None:
        self.replica = replica
        self.may_decide = may_decide
        self._docs = {rt.name: RolloutDocument(rt) for rt in models if rt.canary is not None}
        replica.add(self._docs.values())

    async def tick(self, rt: Rollout, now: float) -> None:
        doc = self._docs.get(rt.name)
        if doc is None or self.replica.frozen or not self.may_decide():
            return  # evidence keeps accumulating; the look waits for the store
        if not doc.canary.look_due(now):
            rt.tick(now)  # samples the canary pool's capacity; changes nothing shared
            return
        try:
            await self.replica.change(doc, lambda: rt.tick(now))
        except Frozen:
            pass  # taken back; looked at again once the store returns

    async def refresh(self, rt: Rollout) -> None:
        if rt.name in self._docs:
            await self.replica.refresh(self._docs[rt.name])

    async def act(self, rt: Rollout, action: str, reason: str) -> None:
        await self.replica.change(self._docs[rt.name], lambda: rt.canary_action(action, reason))
