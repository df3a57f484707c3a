"""The bad-request corpus against a real instance and a real gateway in front of it:
no 5xx, no reset, OpenAI error JSON, and both still serving afterwards."""

from __future__ import annotations

import httpx
import pytest

from llmserve.gateway.app import create_app
from llmserve.gateway.config import GatewayConfig
from tests.gateway.fake_upstream import ServerThread
from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine
from .corpus import CASES, INSTANCE_CASES, Case


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=1024)  # room for a tools prompt
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny",
                      "--max-n", "4")
    yield ep
    ep.stop()


@pytest.fixture(scope="module")
def gateway(instance):
    cfg = GatewayConfig.model_validate({
        "models": [{"name": "tiny", "versions": [{"name": "v1", "weight": 1, "upstreams": [instance.url]}]}],
        "polling": {"load_interval_s": 0.1, "ready_interval_s": 0.2, "timeout_s": 1.0}})
    app = create_app(cfg)
    server = ServerThread(app).start()
    gw = app.gateway
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for _ in range(200):
            if c.get("/ready").status_code == 200:
                break
            import time
            time.sleep(0.05)
    yield server
    server.stop(force=True)


def _send(base: str, case: Case) -> httpx.Response:
    headers = {"content-type": "application/json", **case.headers}
    return httpx.request(case.method, base + case.path, content=case.body or None, headers=headers,
                         timeout=60)


def _check(base: str, cases: list[Case]) -> list[str]:
    bad = []
    for case in cases:
        try:
            r = _send(base, case)
        except httpx.HTTPError as e:  # a reset or a timeout: never acceptable
            bad.append(f"{case.name}: {type(e).__name__}: {e}")
            continue
        if r.status_code not in case.expect:
            bad.append(f"{case.name}: {r.status_code} (expected {sorted(case.expect)}): {r.text[:200]}")
            continue
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                assert set(err) >= {"message", "type", "param", "code"} and err["message"]
            except Exception:  # noqa: BLE001 - any shape but OpenAI's is a failure
                bad.append(f"{case.name}: {r.status_code} without OpenAI error JSON: {r.text[:200]}")
    return bad


def _still_serving(base: str) -> None:
    r = httpx.post(base + "/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert httpx.get(base + "/ready", timeout=10).status_code == 200


def test_corpus_is_big_enough():
    assert len(CASES) + len(INSTANCE_CASES) >= 100
    assert len({c.name for c in CASES}) == len(CASES)


def test_instance_answers_every_bad_request_with_a_4xx(instance):
    bad = _check(instance.url, CASES + INSTANCE_CASES)
    assert not bad, f"{len(bad)} bad results:\n" + "\n".join(bad)
    _still_serving(instance.url)


def test_gateway_answers_every_bad_request_with_a_4xx(gateway, instance):
    bad = _check(gateway.url, CASES)
    assert not bad, f"{len(bad)} bad results:\n" + "\n".join(bad)
    _still_serving(gateway.url)
    _still_serving(instance.url)
