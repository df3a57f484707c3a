"""A stand-in leader for the fencing test, in its own process so it can be SIGSTOPped.

``python -m tests.autoscale.fenced_actor REDIS_URL REGISTRY LOG_DIR`` takes the pool's
lease, starts one stand-in instance through a fenced local provider and prints
``{"started": ...}``; then, for each line on stdin, tries one more start and a stop
of its instance (what a leader resumed mid-step would do) and prints what happened.
"""

from __future__ import annotations

import asyncio
import json
import sys

from llmserve.autoscale.providers.base import InstanceSpec
from llmserve.autoscale.providers.fenced import FencedProvider, StaleLeader
from llmserve.autoscale.providers.local import LocalProvider, LocalProviderConfig
from llmserve.state.lease import Lease, LeaseConfig
from llmserve.state.redis_conn import connect

POOL = "m/v1"
TTL = LeaseConfig(ttl_s=1.0, renew_s=0.3)


def standin(iid: str) -> InstanceSpec:
    return InstanceSpec(iid, command=(sys.executable, "-m", "tests.autoscale.standin_server", "--host", "{host}",
                                      "--port", "{port}", "--model", "m"))


async def attempt(what, action) -> str:
    try:
        await action
        return f"{what}: done"
    except StaleLeader as e:
        return f"{what}: refused ({e})"


async def main(url: str, registry: str, log_dir: str) -> None:
    r = await connect(url)
    lease = Lease(r, POOL, TTL, holder="old")
    assert (await lease.hold()).token is not None
    provider = FencedProvider(LocalProvider(LocalProviderConfig(log_dir=log_dir, registry_dir=registry)), lease, POOL)
    handle = await provider.start(standin("old-1"))
    print(json.dumps({"started": handle.instance_id, "pid": handle.ref["pid"], "token": lease.token}), flush=True)
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, sys.stdin.readline):
        # No lease.hold() first: the leader's own loop is not what protects the pool.
        out = [await attempt("start", provider.start(standin("old-2"))),
               await attempt("stop", provider.stop(handle, 1.0))]
        print(json.dumps({"results": out, "refused": provider.refused}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
