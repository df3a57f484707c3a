"""A real tiny engine, and a real gateway process in front of it: the new APIs run on both."""

from __future__ import annotations

import pytest

from tests.helpers import make_tiny_llama
from tests.server.harness import start_engine

KEY = "client-key-for-frontend-tests"


@pytest.fixture(scope="package")
def engine(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model"), max_position_embeddings=2048)
    ep = start_engine(model, tmp_path_factory.mktemp("logs"), "--served-model-name", "tiny")
    yield ep
    ep.stop()


@pytest.fixture(scope="package")
def gateway(engine, tmp_path_factory):
    from tests.api.gateway_process import GatewayProcess

    gw = GatewayProcess(tmp_path_factory.mktemp("gateway"), [engine.url], keys=[KEY])
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture(scope="package", params=["instance", "gateway"])
def host(request, engine):
    """(base URL, API key) of an instance or the gateway."""
    if request.param == "instance":
        return engine.url, "unused"
    gw = request.getfixturevalue("gateway")
    return gw.url, KEY
