"""``llmserve gateway`` without ``state.dir``: each port keeps its own folder under the
default, so two gateways on one machine do not share files, batches or stored responses,
and a gateway restarted on its port finds its own again."""

from __future__ import annotations

import io

import openai

from tests.api.conftest import KEY
from tests.api.gateway_process import GatewayProcess


def _gateway(folder, upstream: str) -> GatewayProcess:
    gw = GatewayProcess(folder, [upstream], keys=[KEY])
    del gw.config["state"]["dir"]  # the default: a folder per port
    return gw


def _client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)


def test_two_gateways_on_one_machine_keep_their_own_state(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the children's ~ (the default folder's root)
    a, b = _gateway(tmp_path / "a", engine.url), _gateway(tmp_path / "b", engine.url)
    for d in (a.folder, b.folder):
        d.mkdir()
    try:
        a.start()
        b.start()
        line = b'{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny", "prompt": "hi", "max_tokens": 2}}\n'
        uploaded = _client(a).files.create(file=("in.jsonl", io.BytesIO(line)), purpose="batch")
        assert [f.id for f in _client(a).files.list().data] == [uploaded.id]
        assert _client(b).files.list().data == []  # b has a folder of its own
        state = tmp_path / "home" / ".cache" / "llmserve" / "state"
        assert sorted(p.name for p in state.iterdir()) == sorted([f"port-{a.port}", f"port-{b.port}"])
        assert (state / f"port-{a.port}" / "batches.db").exists()
        a.stop()
        a.start()  # the same port: the same folder
        assert [f.id for f in _client(a).files.list().data] == [uploaded.id]
    finally:
        a.stop()
        b.stop()
