"""The HTTP side of ``/v1/files`` and ``/v1/batches``, as OpenAI shapes them.

Routes take the raw scope and the body (already read and size-capped by
``api.frontends``) and return a response; every bad input is an OpenAI 4xx, and a
batch is accepted whole (it and all its lines in one transaction) or not at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope

from llmserve.api.errors import APIError
from llmserve.api.frontends import header
from llmserve.api.limits import bearer_token
from llmserve.api.parse import parse_model
from llmserve.gateway.batches.config import BatchConfig
from llmserve.gateway.batches.lines import ENDPOINTS, batch_model, file_errors, parse_lines
from llmserve.gateway.batches.runner import BatchRunner
from llmserve.gateway.batches.store import BatchStore

WINDOW_S = {"24h": 24 * 3600}


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: Annotated[str, Field(min_length=1, max_length=128)]
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
    completion_window: Literal["24h"]
    metadata: Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                        Field(max_length=16)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("output_expires_after") is not None:  # (the SDK's; files live until deleted)
            raise APIError(400, "output_expires_after is not supported: output files live until deleted",
                           param="output_expires_after", code="unsupported_parameter")
        return v


def owner(scope: Scope) -> str:
    return owner_of(bearer_token(header(scope, b"authorization")))


def owner_of(key: bytes) -> str:
    """Whose files and batches a key's are: a hash, so the store never holds a key."""
    return hashlib.sha256(key).hexdigest()


def _query(scope: Scope, *allowed: str) -> dict[str, str]:
    """The query's parameters; one not in ``allowed`` is a 400 naming it, never dropped."""
    q = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1"),
                                       keep_blank_values=True).items()}
    for k in sorted(q):
        if k not in allowed:
            raise APIError(400, f"query parameter {k!r} is not supported on {scope['path']}", param=k)
    return q


def _limit(q: dict[str, str], default: int, most: int) -> int:
    try:
        limit = int(q.get("limit", str(default)))
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise APIError(400, f"limit must be an integer from 1 to {most}", param="limit")
    return limit


def _page(data: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's list shape from ``limit + 1`` rows (the one more says there are more)."""
    page = data[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(data) > limit}


def _not_found(what: str, oid: str) -> APIError:
    return APIError(404, f"no {what} with id {oid!r}", code="not_found")


def _method(scope: Scope, *allowed: str) -> None:
    if scope["method"] not in allowed:
        raise APIError(405, f"{scope['path']} takes {' or '.join(allowed)}", code="method_not_allowed")


class BatchRoutes:
    def __init__(self, store: BatchStore, config: BatchConfig, runner: BatchRunner) -> None:
        self.store, self.config, self.runner = store, config, runner

    # ---- /v1/files ------------------------------------------------------------------------
    async def files(self, scope: Scope, receive: Receive, body: bytes) -> Response:
        who = owner(scope)
        parts = scope["path"].removeprefix("/v1/files").strip("/").split("/") if scope["path"] != "/v1/files" else []
        if not parts:
            _method(scope, "GET", "POST")
            if scope["method"] == "GET":
                return JSONResponse(await self._list_files(scope, who))
            return JSONResponse(await self._upload(scope, body, who))
        fid = parts[0]
        if len(parts) == 2 and parts[1] == "content":
            _method(scope, "GET")
            content = await asyncio.to_thread(self.store.file_content, fid, who)
            if content is None:
                raise _not_found("file", fid)
            return Response(content, media_type="application/jsonl")
        if len(parts) != 1:
            raise APIError(404, f"no route {scope['path']}", code="not_found")
        _method(scope, "GET", "DELETE")
        if scope["method"] == "DELETE":
            if not await asyncio.to_thread(self.store.delete_file, fid, who):
                raise _not_found("file", fid)
            return JSONResponse({"id": fid, "object": "file", "deleted": True})
        obj = await asyncio.to_thread(self.store.get_file, fid, who)
        if obj is None:
            raise _not_found("file", fid)
        return JSONResponse(obj)

    async def _list_files(self, scope: Scope, who: str) -> dict[str, Any]:
        """OpenAI's files list: ``limit`` 1 to 10,000 (default 10,000), ``order`` by created_at
        (default desc), ``after`` a file id to page on from, ``purpose``."""
        q = _query(scope, "purpose", "limit", "order", "after")
        limit, order = _limit(q, 10_000, 10_000), q.get("order", "desc")
        if order not in ("asc", "desc"):
            raise APIError(400, f"order must be 'asc' or 'desc', got {order!r}", param="order")
        data = await asyncio.to_thread(self.store.list_files, who, q.get("purpose"), limit + 1, order, q.get("after"))
        if data is None:  # a cursor that names nothing would silently restart the listing
            raise APIError(400, f"after {q['after']!r} names no file of yours", param="after")
        return _page(data, limit)

    async def _upload(self, scope: Scope, body: bytes, who: str) -> dict[str, Any]:
        if not (header(scope, b"content-type") or "").startswith("multipart/form-data"):
            raise APIError(400, "upload a file as multipart/form-data (fields file and purpose)", param="file")
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        try:
            form = await Request(scope, replay).form(max_files=1, max_fields=4)
        except Exception as e:  # noqa: BLE001 - a malformed multipart body is the client's
            raise APIError(400, f"malformed multipart body: {e}", param="file") from None
        try:
            extra = sorted(set(form.keys()) - {"purpose", "file"})
            if extra:  # e.g. expires_after[anchor]: files here live until deleted
                raise APIError(400, f"{extra[0]} is not supported on /v1/files", param=extra[0],
                               code="unsupported_parameter" if extra[0].startswith("expires_after") else None)
            purpose, upload = form.get("purpose"), form.get("file")
            if purpose != "batch":
                raise APIError(400, f"purpose must be 'batch' (the only one llmserve stores), got {purpose!r}",
                               param="purpose")
            if upload is None or isinstance(upload, str):
                raise APIError(400, "a file field is required", param="file")
            content = await upload.read()
            filename = upload.filename or "upload.jsonl"
        finally:
            await form.close()
        if len(content) > self.config.max_file_bytes:
            raise APIError(413, f"the file is over {self.config.max_file_bytes} bytes", param="file")
        try:
            content.decode("utf-8")
        except UnicodeDecodeError:
            raise APIError(400, "a batch file must be UTF-8 JSONL", param="file") from None
        n = sum(1 for line in content.split(b"\n") if line.strip())
        if n == 0 or n > self.config.max_lines:
            raise APIError(400, f"a batch file holds 1 to {self.config.max_lines} lines, this one {n}", param="file")
        obj = await asyncio.to_thread(self.store.add_file, who, "batch", filename[:256], content,
                                      self.config.max_key_bytes)
        if obj is None:
            raise APIError(413, f"your files would hold over {self.config.max_key_bytes} bytes "
                           "(batches.max_key_bytes); delete files you no longer need", param="file",
                           code="storage_limit_exceeded")
        return obj

    # ---- /v1/batches ----------------------------------------------------------------------
    async def batches(self, scope: Scope, receive: Receive, body: bytes) -> Response:
        who = owner(scope)
        parts = scope["path"].removeprefix("/v1/batches").strip("/").split("/") if scope["path"] != "/v1/batches" \
            else []
        if not parts:
            _method(scope, "GET", "POST")
            return JSONResponse(await (self._list(scope, who) if scope["method"] == "GET" else self._create(body, who)))
        bid = parts[0]
        if len(parts) == 2 and parts[1] == "cancel":
            _method(scope, "POST")
            obj = await asyncio.to_thread(self.store.cancel, bid, who)
            self.runner.wake.set()
        elif len(parts) == 1:
            _method(scope, "GET")
            obj = await asyncio.to_thread(self.store.get_batch, bid, who)
        else:
            raise APIError(404, f"no route {scope['path']}", code="not_found")
        if obj is None:
            raise _not_found("batch", bid)
        return JSONResponse(obj)

    async def _list(self, scope: Scope, who: str) -> dict[str, Any]:
        q = _query(scope, "limit", "after")
        limit = _limit(q, 20, 100)
        data = await asyncio.to_thread(self.store.list_batches, who, limit + 1, q.get("after"))
        if data is None:
            raise APIError(400, f"after {q['after']!r} names no batch of yours", param="after")
        return _page(data, limit)

    async def _create(self, body: bytes, who: str) -> dict[str, Any]:
        req = parse_model(body, CreateBatch)
        described = await asyncio.to_thread(self.store.get_file, req.input_file_id, who)
        content = await asyncio.to_thread(self.store.file_content, req.input_file_id, who)
        if described is None or content is None:
            raise APIError(400, f"input_file_id {req.input_file_id!r} names no file of yours",
                           param="input_file_id", code="not_found")
        if described["purpose"] != "batch":  # e.g. a batch's output file: OpenAI takes only purpose batch
            raise APIError(400, f"input_file_id {req.input_file_id!r} has purpose {described['purpose']!r}; "
                           "a batch's input file must have purpose 'batch'", param="input_file_id")
        assert req.endpoint in ENDPOINTS
        lines = parse_lines(content, req.endpoint)
        errors = file_errors(lines)  # no line to run: failed at once, as OpenAI fails a file that does not validate
        now = int(time.time())
        obj = {"id": f"batch_{uuid.uuid4().hex}", "object": "batch", "endpoint": req.endpoint, "errors": errors,
               "model": batch_model(lines),
               "input_file_id": req.input_file_id, "completion_window": req.completion_window,
               "status": "in_progress" if errors is None else "failed", "output_file_id": None,
               "error_file_id": None, "created_at": now, "in_progress_at": now if errors is None else None,
               "expires_at": now + WINDOW_S[req.completion_window], "finalizing_at": None,
               "completed_at": None, "failed_at": None if errors is None else now, "expired_at": None,
               "cancelling_at": None, "cancelled_at": None, "metadata": req.metadata or {}}
        created = await asyncio.to_thread(self.store.create_batch, who, obj, lines)
        self.runner.wake.set()
        return created
