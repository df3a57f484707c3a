"""What every llmserve HTTP server refuses from its clients, at the connection level.

Both servers run uvicorn with the protocol below, whichever way they are started:
``run_server`` (``llmserve engine``, which every instance provider runs, spawned,
forked from the template or in a Ray actor), ``run_gateway`` and ``llmserve
serve``. ``uvicorn_options(limits)`` gives the keyword arguments.

Why one parser, forced: uvicorn's ``h11_max_incomplete_event_size`` only bounds a
head that is still *incomplete*, so a 40 KB header that arrives in one read
passes; its httptools protocol has no cap at all, and no header or body read
timeout (``timeout_keep_alive`` only runs between requests). So the guard is a
small subclass of uvicorn's httptools protocol (llhttp, the faster of the two),
and ``http=`` names it on every start path; h11 is never used.

It adds, per connection: a URL cap (414) and a header cap (431), counted as
llhttp hands over URL pieces and header pairs, plus a cap on raw bytes of a head
still being read (llhttp buffers a header value until it ends, so a dribbled
endless value must be cut by bytes); a header timeout (from connect, or from the
next request's first byte on a kept-alive connection) and a body timeout (from
the end of the head to the end of the body), both answered 408 and closed; and a
send timeout: a client that takes no bytes for that long, while the response waits
on it, is dropped. The open-connection cap is uvicorn's ``limit_concurrency``; a
request beyond it gets 503 as OpenAI's error JSON, answered here. A refused
connection closes lingering (the answer, a FIN, then the client's late bytes dropped
for ``LINGER_S``), so a client still uploading reads its answer instead of a reset.

Per request it costs an addition and a compare on each parser callback; besides
the one header timer a new connection gets, a timer is armed only while a head or
body is still incomplete at the end of a read, so a request that arrives in one
read arms none.
"""

from __future__ import annotations

import asyncio
import enum
import json
import socket
import struct
from typing import Annotated, Any, ClassVar

import httptools
from pydantic import BaseModel, ConfigDict, Field
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from llmserve.api.errors import error_body, error_type


Count = Annotated[int, Field(ge=1)]
Seconds = Annotated[float, Field(gt=0.0)]


class HttpLimits(BaseModel):
    """The limits, in the units the protocol checks, validated once by this model.

    Both servers' configs are this model: the instance's ``ServerConfig`` (its fields
    are its flags) and the gateway's ``limits:`` section, each with its own defaults
    (the ones here are the instance's); :meth:`http_limits` gives the limits alone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # All header names and values of one request together. The gateway forwards a few
    # small headers, so 16 KiB is far above any legitimate request's to an instance.
    max_header_bytes: Count = 16 << 10
    max_url_bytes: Count = 8 << 10  # the request target, query string included; nginx's line cap
    # To receive a request's whole head, then its whole body: the gateway, over a local
    # network, sends each in one go; a 4 MiB body at 30 s needs only ~140 KB/s.
    header_timeout_s: Seconds = 10.0
    body_timeout_s: Seconds = 30.0
    # Longest a response may wait on a client that reads nothing (nginx's send_timeout is 60 s).
    send_timeout_s: Seconds = 30.0
    # Idle time between requests on one connection: above the gateway's upstream keep-alive
    # expiry (4 s), so it never reuses a connection the instance is closing.
    keep_alive_timeout_s: Seconds = 5.0
    # Open connections served, a request beyond gets 503: the gateway's pool plus direct
    # clients, with room above the request queue and the running batch.
    max_connections: Count = 1024

    def http_limits(self) -> HttpLimits:
        """The limits alone (a server config holds more)."""
        return HttpLimits(**{name: getattr(self, name) for name in HttpLimits.model_fields})


def uvicorn_options(limits: HttpLimits) -> dict[str, Any]:
    """``uvicorn.run`` / ``uvicorn.Config`` keyword arguments that enforce ``limits``."""
    return {"http": GuardedHttpToolsProtocol.with_limits(limits), "ws": "none",
            "limit_concurrency": limits.max_connections,
            "timeout_keep_alive": limits.keep_alive_timeout_s}


class _Phase(enum.Enum):
    HEAD = "head"  # a request's head is expected or arriving
    BODY = "body"  # its head is in, its body is arriving
    DONE = "done"  # the request is in; the app answers, or the connection idles
    LINGER = "linger"  # refused and answered: what the client still sends is read and dropped


# After a refusal, how long a client that is still sending is read from before the close.
LINGER_S = 2.0


class _Refused(Exception):
    """Raised in a parser callback to refuse the request (llhttp wraps it)."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with size caps and read and send timeouts."""

    limits: ClassVar[HttpLimits]
    _head_cap: ClassVar[int]

    @classmethod
    def with_limits(cls, limits: HttpLimits) -> type[GuardedHttpToolsProtocol]:
        # uvicorn builds the protocol itself, so the limits travel on a subclass.
        return type(cls.__name__, (cls,), {"limits": limits,
                                           "_head_cap": limits.max_url_bytes + limits.max_header_bytes + 1024})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _Phase.HEAD
        self._head_bytes = 0  # raw bytes read while a head was incomplete
        self._header_bytes = 0
        self._refusal: tuple[int, str, str] | None = None
        self._read_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None

    # ---- connection events ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase is _Phase.LINGER:
            return
        if self._phase is not _Phase.BODY:
            self._head_bytes += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(*self._refusal)
            else:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._phase is _Phase.HEAD and self._head_bytes > self._head_cap:
            self._refuse(431, f"request head over {self._head_cap} bytes", "headers_too_large")
        elif self._phase is not _Phase.DONE and self._read_timer is None:
            self._arm_read()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    # ---- parser callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _Phase.HEAD
        self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_url_bytes:
            self._refusal = (414, f"request URL over {self.limits.max_url_bytes} bytes", "url_too_long")
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self.limits.max_header_bytes:
            self._refusal = (431, f"request headers over {self.limits.max_header_bytes} bytes",
                             "headers_too_large")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        # uvicorn's own check (limit_concurrency), made first so the answer is OpenAI's error
        # JSON with a Retry-After, not uvicorn's plain-text 503
        if len(self.connections) >= self.limits.max_connections or len(self.tasks) >= self.limits.max_connections:
            self._refusal = (503, f"the server is at its limit of {self.limits.max_connections} open "
                                  "connections; retry shortly", "server_overloaded")
            raise _Refused
        self._phase = _Phase.BODY
        self._head_bytes = 0
        self._cancel_read()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _Phase.DONE
        self._cancel_read()
        super().on_message_complete()

    # ---- timers and refusals ----------------------------------------------------------------
    def _arm_read(self) -> None:
        lim = self.limits
        delay = lim.header_timeout_s if self._phase is _Phase.HEAD else lim.body_timeout_s
        self._read_timer = self.loop.call_later(delay, self._read_timed_out)

    def _cancel_read(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing() or self._phase is _Phase.DONE:
            return
        if self.flow.read_paused:  # we stopped reading (a pipelined request waits): not the client's fault
            self._arm_read()
            return
        if self._phase is _Phase.HEAD and self._head_bytes == 0:
            self.transport.close()  # nothing of a request arrived: close quietly, as keep-alive does
            return
        what = "headers" if self._phase is _Phase.HEAD else "body"
        timeout = self.limits.header_timeout_s if self._phase is _Phase.HEAD else self.limits.body_timeout_s
        self._refuse(408, f"the request {what} did not arrive within {timeout:g} s", "request_timeout")

    def _send_timed_out(self) -> None:
        self._send_timer = None
        self.logger.info("%s stopped reading for %g s; dropped", self.client, self.limits.send_timeout_s)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # a reset: a plain close leaves the kernel holding the unsent bytes for minutes
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()  # close() would wait to flush bytes it never takes

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer ``status`` with an OpenAI-shaped error and close the connection."""
        self.logger.info("refused %s: %d %s", self.client, status, message)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            started = cycle.response_started
            cycle.disconnected = True  # the app's receive() sees a disconnect, its sends are dropped
            cycle.message_event.set()
            if started:  # its head is out: nothing more can be said on this connection
                self.transport.abort()
                return
        elif cycle is not None and self._phase is _Phase.BODY:  # answered early (a 413): just stop
            self._close_lingering()
            return
        body = json.dumps(error_body(message, error_type(status), code=code)).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        if status == 503:
            head.append(b"retry-after: 1\r\n")
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                    % len(body))
        self.transport.write(b"".join(head) + body)
        self._close_lingering()

    def _close_lingering(self) -> None:
        """Close a connection whose client may still be sending (nginx's lingering close).
        Closing with its bytes unread in our buffer sends a reset, and a reset can destroy
        the answer in the client's buffer before it reads it: so the answer goes out with
        a FIN, and what still comes is read and dropped for a moment before the close."""
        self._phase = _Phase.LINGER
        self._cancel_read()
        if self.flow.read_paused:
            self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()  # after the answer's bytes are out
        self.loop.call_later(LINGER_S, self.transport.close)
