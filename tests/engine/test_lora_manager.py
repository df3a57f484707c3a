"""The adapters' bookkeeping without a model run: slots for a step (pure), the prefix cache keyed
by adapter, the scheduler's cap on adapters in flight, and the manager's levels (registered,
loaded least recently used out, resident) with unload while requests still run."""

from __future__ import annotations

import pytest
import torch

from llmserve.engine.kv_cache import KVCacheManager
from llmserve.engine.lora.manager import AdapterUnavailable, LoraManager, UnknownAdapter
from llmserve.engine.lora.residency import assign_slots
from llmserve.engine.request import Request, RequestStatus
from llmserve.engine.sampling_params import SamplingParams
from llmserve.engine.scheduler import Scheduler, SchedulerConfig
from llmserve.models.lora.adapter import LoraError
from llmserve.models.lora.slots import LoraSlots
from tests.engine.conftest import make_tiny
from tests.lora_adapters import make_adapter


def test_assign_slots_keeps_resident_fills_free_then_evicts_least_recent():
    assert assign_slots([None, None], {7}, {}) == {0: 7}
    assert assign_slots([7, None], {7, 8}, {}) == {1: 8}  # 7 stays where it is
    assert assign_slots([7, 8], {9, 8}, {7: 5, 8: 3}) == {0: 9}  # 8 is wanted: 7 goes
    assert assign_slots([7, 8, 6], {9}, {7: 5, 8: 3, 6: 4}) == {1: 9}  # least recently used
    with pytest.raises(ValueError):
        assign_slots([None], {1, 2}, {})


def _req(rid: str, tokens: list[int], lora_id: int = 0) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), 4, lora_id=lora_id)


def test_prefix_cache_never_shares_blocks_between_adapters():
    kv = KVCacheManager(32, 4, enable_prefix_caching=True)
    first = _req("a", list(range(13)), lora_id=1)
    assert kv.allocate_slots(first, 13, admitting=True)
    first.num_computed_tokens = 13
    kv.cache_computed_blocks(first)
    kv.free(first)
    assert kv.get_computed_blocks(_req("b", list(range(13)), lora_id=2))[1] == 0
    assert kv.get_computed_blocks(_req("c", list(range(13))))[1] == 0
    assert kv.get_computed_blocks(_req("d", list(range(13)), lora_id=1))[1] == 12


def test_scheduler_runs_at_most_max_loras_adapters_at_once():
    kv = KVCacheManager(64, 4, enable_prefix_caching=False)
    sch = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_loras=2), kv)
    for i, lora in enumerate([1, 2, 3, 0, 1]):
        sch.add_request(_req(str(i), [5, 6, 7], lora))
    plan = sch.schedule()
    assert sorted(s.request.request_id for s in plan.scheduled) == ["0", "1", "3", "4"]  # 3 waits for a slot
    sch.finish_request("1", RequestStatus.FINISHED_ABORTED)
    plan = sch.schedule()
    assert "2" in {s.request.request_id for s in plan.scheduled}
    assert len({r.lora_id for r in sch.running if r.lora_id}) <= 2


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    t = make_tiny(seed=1)
    root = tmp_path_factory.mktemp("mgr")
    for i, r in enumerate((4, 8, 8)):
        make_adapter(t.hf, root / f"a{i}", r, ["q_proj", "down_proj"], seed=i)
    return t.config, root


def test_manager_levels_and_unload_while_running(adapters):
    config, root = adapters
    slots = LoraSlots(config, 2, 8)
    m = LoraManager(config, slots, 8, max_cpu_loras=2)
    ids = [m.add(m.read(f"a{i}", str(root / f"a{i}"))) for i in range(3)]
    assert m.loaded() == ["a1", "a2"]  # a0 evicted from memory: least recently used, unused
    assert m.acquire("r0", "a0") == ids[0]  # read again from its file
    with pytest.raises(LoraError, match="already loaded"):
        m.add(m.read("a1", str(root / "a1")))
    assert m.activate({ids[0], ids[1]}) == {ids[0]: 0, ids[1]: 1}
    assert m.resident() == ["a0", "a1"]
    m.remove("a0")  # a request still runs on it: new ones are refused, its slot stays
    with pytest.raises(UnknownAdapter):
        m.acquire("r1", "a0")
    assert slots.stacks[0]["qkv"].a[0].abs().sum() > 0
    m.release("r0")  # its last request ended: slot and memory freed
    assert slots.stacks[0]["qkv"].a[0].abs().sum() == 0
    assert m.resident() == ["a1"] and "a0" not in m.paths()
    with pytest.raises(UnknownAdapter):
        m.remove("a0")


def test_an_evicted_adapter_read_again_from_changed_or_missing_files(adapters, tmp_path):
    """Other weights under the same path get a new id (the prefix cache keys KV by it, so the old
    weights' KV is never reused); a file gone unregisters the name, and only that request fails."""
    import shutil

    config, root = adapters
    m = LoraManager(config, LoraSlots(config, 1, 8), 8, max_cpu_loras=1)
    shutil.copytree(root / "a1", tmp_path / "x")
    first = m.add(m.read("x", str(tmp_path / "x")))
    m.add(m.read("a0", str(root / "a0")))  # x is evicted from memory
    assert m.loaded() == ["a0"]
    assert m.acquire("r0", "x") == first  # the same files: the same id, its cached KV still good
    m.release("r0")
    m.add(m.read("a2", str(root / "a2")))
    assert "x" not in m.loaded()
    shutil.rmtree(tmp_path / "x")
    shutil.copytree(root / "a2", tmp_path / "x")
    second = m.acquire("r1", "x")
    assert second != first and "x" in m.loaded()
    m.release("r1")
    m.add(m.read("a1", str(root / "a1")))
    shutil.rmtree(tmp_path / "x")
    with pytest.raises(AdapterUnavailable, match="could not be read again"):
        m.acquire("r2", "x")
    assert "x" not in m.paths()
    with pytest.raises(UnknownAdapter):
        m.acquire("r3", "x")


def test_rank_over_the_maximum_is_refused(adapters):
    config, root = adapters
    m = LoraManager(config, LoraSlots(config, 1, 4), 4, 1)
    with pytest.raises(LoraError, match="rank 8 is over the maximum LoRA rank 4"):
        m.read("a1", str(root / "a1"))


def test_a_resident_adapter_has_one_copy_its_slot(adapters):
    """On the CPU the slot is the adapter's memory: its loaded tensors are dropped while it is
    resident and come back, bit for bit, when another adapter takes the slot."""
    config, root = adapters
    m = LoraManager(config, LoraSlots(config, 1, 8), 8, max_cpu_loras=2)
    a0, a1 = (m.read(f"a{i}", str(root / f"a{i}")) for i in range(2))
    fresh = m.read("a0", str(root / "a0")).deltas
    ids = [m.add(a0), m.add(a1)]
    m.activate({ids[0]})
    assert a0.nbytes == 0 and a1.nbytes > 0
    m.activate({ids[1]})
    assert a1.nbytes == 0 and m.loaded() == ["a0", "a1"]
    assert sorted(a0.deltas) == sorted(fresh)
    assert all(torch.equal(a0.deltas[k][i], fresh[k][i]) for k in fresh for i in (0, 1))


def test_the_factors_dtype_follows_the_weights_and_a_bad_one_is_refused():
    """``--lora-dtype auto``: fp16 beside int8 weights where the kernel reads it, fp32 beside
    float weights (the PEFT-exact path); an unknown value is refused when the config is read."""
    from pydantic import ValidationError

    from llmserve.engine.config import EngineConfig
    from llmserve.engine.lora.ops import lora_dtype
    from llmserve.models import kernels

    int8 = torch.float16 if kernels.load() is not None else torch.float32
    assert lora_dtype(EngineConfig(dtype="int8")) == int8
    assert lora_dtype(EngineConfig(dtype="fp32")) == lora_dtype(EngineConfig(dtype="bf16")) == torch.float32
    assert lora_dtype(EngineConfig(dtype="int8", lora_dtype="float32")) == torch.float32
    assert lora_dtype(EngineConfig(dtype="fp32", lora_dtype="fp16")) == torch.float16
    with pytest.raises(ValidationError, match="lora_dtype must be one of"):
        EngineConfig(lora_dtype="int4")
