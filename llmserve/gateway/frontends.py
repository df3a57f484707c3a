"""The gateway's /v1/responses, /v1/messages, /v1/files and /v1/batches, put together.

The API fronts (``llmserve.api.frontends``) translate onto the gateway's own chat
path; stored responses and batches live in the state folder (``state.dir``), so a
restart keeps both; with ``state.redis_url`` stored responses live in Redis instead,
shared by every replica (batches stay in the folder of the replica that took them). The batch runner is a gateway service: started and stopped
with it, sending lines back into the app this builds the fronts for.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp

from llmserve.api.frontends import Frontends
from llmserve.api.response_store import ResponseStore, SQLiteResponseStore
from llmserve.gateway.batches.routes import BatchRoutes, owner_of
from llmserve.gateway.batches.runner import BatchRunner
from llmserve.gateway.batches.share import batch_room
from llmserve.gateway.batches.store import BatchStore
from llmserve.gateway.config import GatewayConfig
from llmserve.gateway.events import GatewayService, RequestObserver
from llmserve.state.response_store import RedisResponseStore


def gateway_frontends(app: ASGIApp, config: GatewayConfig, authorize: Callable[[str | None], object],
                      services: list[GatewayService], observers: list[RequestObserver] | None = None) -> Frontends:
    state = config.state
    store = BatchStore(state.path("batches.db"))
    runner = BatchRunner(store, config.batches, state.path("batches.lock"))
    runner.observers = observers if observers is not None else []  # told each model's batch need
    runner.app = app
    runner.budget_keys = {owner_of(k.key.get_secret_value().encode()): k.name for k in config.auth.keys if k.name}
    gateway = getattr(app, "gateway", None)
    if gateway is not None:  # lines in flight scale with the instances that can take them
        runner.ready_instances = lambda: sum(i.ready and i.accepting for p in gateway.pools() for i in p.instances())
        runner.batch_room = lambda: batch_room((i.report.max_num_seqs if i.report is not None else 0,
                                                p.picker.concurrency)
                                               for p in gateway.pools() for i in p.instances() if i.ready and i.accepting)
    services.append(runner)
    routes = BatchRoutes(store, config.batches, runner)
    responses: ResponseStore
    if state.redis_url is not None:  # replicas share stored responses; batches stay in the state folder
        responses = RedisResponseStore(state.redis_url, state.redis_password_file)
        services.insert(0, responses)  # connected before the batch runner starts, closed after it
    else:
        responses = SQLiteResponseStore(state.path("responses.db"))
    return Frontends(app, responses, authorize,
                     config.limits.max_body_bytes, extra={"/v1/files": routes.files, "/v1/batches": routes.batches},
                     extra_body_bytes=config.batches.upload_body_bytes)
