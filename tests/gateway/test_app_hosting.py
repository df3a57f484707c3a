"""The gateway's background work runs however the app is hosted, lifespan or not."""

from starlette.applications import Starlette
from starlette.routing import Mount

from llmserve.gateway.app import create_app
from llmserve.gateway.config import GatewayConfig
from .app_harness import FAST_POLLING, wait_until
from .fake_upstream import Behaviour, ServerThread, make_app


def _gateway_config(url: str) -> GatewayConfig:
    return GatewayConfig.model_validate({
        "models": [{"name": "chat", "versions": [{"name": "v1", "weight": 1, "upstreams": [url]}]}],
        "polling": FAST_POLLING})


def test_a_gateway_mounted_without_lifespan_still_polls_its_instances():
    """Starlette runs no lifespan for a mounted sub-app: the first request starts it."""
    upstream = ServerThread(make_app(Behaviour("a", tokens=1))).start()
    gateway_app = create_app(_gateway_config(upstream.url))
    outer = Starlette(routes=[Mount("/llm", app=gateway_app)])
    server = ServerThread(outer)
    server.server.config.lifespan = "off"
    server.start()
    gw = gateway_app.gateway
    try:
        import httpx
        with httpx.Client(base_url=server.url, timeout=10) as client:
            assert not gw.started
            client.get("/llm/health")
            wait_until(lambda: all(i.ready for p in gw.pools() for i in p.instances()),
                       what="the monitor marks the upstream ready")
            r = client.post("/llm/v1/chat/completions",
                            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
    finally:
        server.stop()
        upstream.stop()


def test_stopping_the_server_runs_the_gateways_own_stop():
    upstream = ServerThread(make_app(Behaviour("a", tokens=1))).start()
    app = create_app(_gateway_config(upstream.url))
    server = ServerThread(app).start()
    gw = app.gateway
    monitor = next(t for t in gw._tasks if t.get_name() == "monitor")
    assert gw.started and not monitor.done()
    server.stop(force=True)
    upstream.stop()
    assert not gw.started and monitor.cancelled()
