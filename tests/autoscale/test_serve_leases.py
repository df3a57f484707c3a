"""Which replica decides a canary: the leader of one pool every replica names alike."""

from __future__ import annotations

from llmserve.serve.leases import canary_pool

POOLS = ["chat/v1", "chat/v2", "org/model/a", "org/model/b"]


def test_the_canary_versions_pool_decides():
    assert canary_pool("chat", "v2", POOLS) == "chat/v2"


def test_without_a_canary_pool_the_models_first_one_does():
    assert canary_pool("chat", "v9", list(reversed(POOLS))) == "chat/v1"
    assert canary_pool("org/model", None, POOLS) == "org/model/a"  # a name with a slash
    assert canary_pool("other", "v2", POOLS) is None


def test_what_a_killed_replica_left_listed_is_stopped_after_the_set(tmp_path):
    import subprocess
    import sys

    from llmserve.autoscale.providers.registry import ProcessRegistry, Registered, process_start
    from llmserve.serve.leases import registry_dir, stop_listed

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reg = ProcessRegistry(registry_dir(tmp_path))
        reg.record(Registered("v1-t1-1", "chat/v1", proc.pid, process_start(proc.pid), 1, "http://x:1", "", 1))
        assert stop_listed(tmp_path, grace_s=5.0) == 1
        assert proc.wait(10) == -15  # asked to drain, not killed
        assert reg.live() == []
    finally:
        proc.kill()
        proc.wait()
