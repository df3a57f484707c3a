"""How many draft tokens each decoding request gets this step: a pure decision.

A draft token is worth the chance that it is accepted, and the chance that its
predecessors in the draft were too: with a per-token acceptance rate ``a`` a draft of
``k`` yields ``1 + a + a^2 + ... + a^k`` tokens in the step. It costs a row of the
forward pass (``StepCosts.draft_row_s``) and whatever the proposer spends on it. The
step serves every decoding request, so a draft token pays only if the tokens it adds
per second of step time beat what the step already yields per second: at one stream
almost any likely guess pays, in a batch that is already long (compute-bound) only a
near-certain one does. Drafts are handed out greedily, the most valuable next token of
any request first, while they pay; the values fall along each draft, so this is the
best split for the model.

Each request's rate is learnt from its own drafts (accepted tokens against rejected
drafts, a geometric model), starting from a prior and drifting back to it while the
request does not speculate, so a request that stopped paying is tried again later.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from llmserve.engine.step_cost import StepCosts

# Prior evidence: worth one accepted token and one rejection (a rate of 0.5).
PRIOR_ACCEPTED = 1.0
PRIOR_REJECTED = 1.0
# Weight of older evidence after each verified draft (about the last 10 drafts count):
# recent text predicts the next best.
DECAY = 0.9
# ... and after each decoding step without a draft: halfway back to the prior in ~70 tokens.
IDLE_DECAY = 0.99
# A draft token must beat the step's tokens per second by this much: the rate and the
# costs are estimates, and a guess that only breaks even is not worth the risk.
MARGIN = 1.2
# Upper bounds of the per-request acceptance histogram in /metrics (accepted / proposed).
RATE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(slots=True)
class Acceptance:
    """One request's evidence about its drafts."""

    accepted: float = 0.0  # draft tokens accepted (decayed)
    rejected: float = 0.0  # drafts that ended in a rejection (decayed)
    proposed_total: int = 0  # draft tokens verified, all told (for the metrics)
    accepted_total: int = 0

    @property
    def rate(self) -> float:
        """Estimated chance that the next draft token is accepted, given its predecessors were."""
        return (self.accepted + PRIOR_ACCEPTED) / (self.accepted + self.rejected + PRIOR_ACCEPTED + PRIOR_REJECTED)

    def observe(self, proposed: int, accepted: int) -> None:
        self.accepted = self.accepted * DECAY + accepted
        self.rejected = self.rejected * DECAY + (1 if accepted < proposed else 0)
        self.proposed_total += proposed
        self.accepted_total += accepted

    def idle(self) -> None:
        self.accepted *= IDLE_DECAY
        self.rejected *= IDLE_DECAY


def draft_lengths(rates: list[float], caps: list[int], costs: StepCosts, *, decoding: int,
                  token_cost_s: float = 0.0) -> list[int]:
    """Draft tokens for each request (``rates[i]``, at most ``caps[i]``) in a step of
    ``decoding`` decoding requests; ``token_cost_s``: the proposer's time per draft token."""
    out = [0] * len(rates)
    cost = costs.draft_row_s + token_cost_s
    if cost <= 0:
        return list(caps)
    tokens = float(decoding)
    seconds = costs.base_s + decoding * costs.decode_seq_s
    # (-value, request): the next draft token of each request, most valuable first
    heap = [(-r, i) for i, (r, c) in enumerate(zip(rates, caps)) if c > 0 and r > 0]
    heapq.heapify(heap)
    while heap:
        neg, i = heapq.heappop(heap)
        value = -neg
        if value * seconds <= MARGIN * tokens * cost:  # value / cost vs tokens / seconds: no longer pays
            break
        out[i] += 1
        tokens += value
        seconds += cost
        if out[i] < caps[i]:
            heapq.heappush(heap, (-value * rates[i], i))
    return out
