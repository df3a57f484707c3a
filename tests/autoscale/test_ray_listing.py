"""Ray actors by name: with ``detached`` actors a provider that did not start an
instance (the next leader's) finds it in the cluster's named actors, adopts it under
its token and stops it. A stand-in server in the actor: no torch."""

from __future__ import annotations

import sys

import pytest

from llmserve.autoscale.providers.base import InstanceSpec

pytestmark = pytest.mark.slow


async def test_a_new_provider_lists_and_adopts_the_pools_actors(tmp_path):
    pytest.importorskip("ray")
    import ray

    from llmserve.autoscale.providers.ray import RayProvider, RayProviderConfig

    cfg = RayProviderConfig(num_cpus=0.5, local_num_cpus=2, detached=True, log_dir=str(tmp_path))
    old = RayProvider(cfg)
    old.connect()
    try:
        cmd = (sys.executable, "-m", "tests.autoscale.standin_server", "--host", "{host}", "--port", "{port}")
        handle = await old.start(InstanceSpec("v1-t1-1", command=cmd, pool="chat/v1", token=1))
        await old.start(InstanceSpec("v2-t1-1", command=cmd, pool="chat/v2", token=1))
        new = RayProvider(cfg)  # knows nothing of them
        [listed] = await new.listing("chat/v1")
        assert (listed.instance_id, listed.url, listed.ref["token"]) == ("v1-t1-1", handle.url, 1)
        assert await new.adopt(listed, 2)
        assert (await new.listing("chat/v1"))[0].ref["token"] == 2
        assert (await new.status(listed)).state.value == "running"
        await new.stop(listed, 5.0)
        assert [h.instance_id for h in await new.listing("chat/v1")] == []
        assert [h.instance_id for h in await old.listing("chat/v2")] == ["v2-t1-1"]
    finally:
        await old.close()
        ray.shutdown()
