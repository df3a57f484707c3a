"""``llmserve serve`` among replicas: one lease per pool in the shared store.

With ``gateway.state.redis_url`` set, each pool's controller is a
:class:`~llmserve.autoscale.leadership.LeaderController` over a
:class:`~llmserve.autoscale.providers.fenced.FencedProvider`, the local provider
lists its instances in a registry under ``gateway.state.dir`` (so they outlive the
replica that started them), and the canary decisions of a model are taken only by
the replica leading the pool that decides them (:func:`canary_pool`). Without
it, nothing here is used and serve is one process, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmserve.autoscale.providers.base import InstanceProvider
from llmserve.autoscale.providers.fenced import FencedProvider
from llmserve.state.lease import Lease, LeaseConfig


def check_replicas(provider_kind: str, ray_address: str | None, instance_api_key: str | None) -> None:
    """What replicas need of the provider: one place every replica lists the same instances
    from, and one instance key (a leader must probe what another started)."""
    if provider_kind == "ray" and (ray_address is None or instance_api_key is None):
        raise ValueError("with gateway.state.redis_url the ray provider needs provider.ray_address (a cluster "
                         "every replica joins) and instance_api_key (the same key on every replica)")


def registry_dir(state_dir: Path) -> str:
    """Where the local provider lists instances: beside the rest of the replicas' state."""
    return str(Path(state_dir).expanduser() / "instances")


def stop_listed(state_dir: Path, grace_s: float = 10.0) -> int:
    """After every replica of a ``--replicas`` set has exited, no leader is left to stop the
    instances one that was killed still listed: SIGTERM them (they drain), SIGKILL after
    ``grace_s``. How many were still running."""
    import signal
    import time

    from llmserve.autoscale.providers.registry import AdoptedProcess, ProcessRegistry

    folder = Path(registry_dir(state_dir))
    if not folder.is_dir():
        return 0
    registry = ProcessRegistry(folder)
    left = [AdoptedProcess(e) for e in registry.live()]
    for p in left:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in left:
        if p.wait(max(0.0, deadline - time.monotonic())) is None:
            p.kill()
        registry.remove(p.entry.instance_id)
    return len(left)


class PoolLeases:
    """The store's client and one lease per pool, for this replica."""

    def __init__(self, redis_url: str, password_file: Path | None, config: LeaseConfig) -> None:
        from llmserve.state.redis_conn import client

        self.redis = client(redis_url, password_file)
        self.config = config
        self.leases: dict[str, Lease] = {}

    def controller_args(self, provider: InstanceProvider, pool: str) -> dict[str, Any]:
        """What a pool's LeaderController takes beside the PoolController's own arguments."""
        lease = self.leases[pool] = Lease(self.redis, pool, self.config)
        return {"provider": FencedProvider(provider, lease, pool), "lease": lease}

    def leads(self, pool: str) -> bool:
        lease = self.leases.get(pool)
        return lease is not None and lease.leading()


def canary_pool(model: str, canary_version: str | None, pools: Sequence[str]) -> str | None:
    """The pool whose leader decides ``model``'s canary: the canary version's pool (it
    is sized from the canary's share, so one leader sees both), else the model's first
    in name order; every replica picks the same one."""
    mine = sorted(p for p in pools if p.rpartition("/")[0] == model)
    preferred = f"{model}/{canary_version}"
    return preferred if preferred in mine else (mine[0] if mine else None)


def canary_gate(leases: PoolLeases, canaries: dict[str, str | None], pools: Sequence[str]) -> Callable[[str], bool]:
    """``model -> whether this replica takes its canary decisions now``."""
    def decides(model: str) -> bool:
        pool = canary_pool(model, canaries.get(model), pools)
        return pool is not None and leases.leads(pool)
    return decides
