"""Finished spans as OTLP protobuf bytes (``ExportTraceServiceRequest``), written directly.

The SDK's encoder (``encode_spans``) builds a protobuf message object for every span,
attribute and value and then serialises the tree: about 25 µs of CPU per span, in a
thread that holds the GIL against the serving event loop. Most of what a request's
spans carry repeats from request to request (the resource, the scope, attribute keys,
names, models, versions), so this encoder writes the wire format itself and keeps the
bytes of what repeats; a span is then a few joins. Anything it does not write (events,
links, a value of another type) goes through the SDK's own code, and a test checks that
both give the same message (tests/tracing/test_otlp_wire.py).

Field numbers: opentelemetry/proto/{collector/trace,trace,common,resource}/v1/*.proto.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.common._internal import _encode_value
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind

_log = logging.getLogger(__name__)

_LEN, _VARINT, _I64, _I32 = 2, 0, 1, 5
_CACHE_MAX = 8192  # distinct (key, value) pairs kept; a unique value (a request id) only passes through
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags


def _varint_slow(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64: two's complement, ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint_slow(n) for n in range(1 << 14)]  # lengths and counts: one lookup


def _varint(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < 16384 else _varint_slow(n)


def _tag(field: int, wire: int) -> bytes:
    return _SMALL[field << 3 | wire]


_LEN_TAG = [_tag(f, _LEN) for f in range(17)]


def _field(field: int, payload: bytes) -> bytes:
    """A length-delimited field: a string, bytes or an embedded message."""
    n = len(payload)
    return _LEN_TAG[field] + (_SMALL[n] if n < 16384 else _varint_slow(n)) + payload


_T_TRACE_ID, _T_SPAN_ID, _T_PARENT = _tag(1, _LEN) + b"\x10", _tag(2, _LEN) + b"\x08", _tag(4, _LEN) + b"\x08"
_T_START, _T_END, _T_FLAGS = _tag(7, _I64), _tag(8, _I64), _tag(16, _I32)
_KIND = {k: _tag(6, _VARINT) + _varint(k.value + 1) for k in SpanKind}  # OTLP's numbers: the SDK's + 1
_FLAGS_LOCAL = _T_FLAGS + struct.pack("<I", _HAS_IS_REMOTE)
_FLAGS_REMOTE = _T_FLAGS + struct.pack("<I", _HAS_IS_REMOTE | _IS_REMOTE)
_TRUE, _FALSE = _tag(2, _VARINT) + b"\x01", _tag(2, _VARINT) + b"\x00"
_T_INT, _T_DOUBLE = _tag(3, _VARINT), _tag(4, _I64)
_pack_q, _pack_d = struct.Struct("<Q").pack, struct.Struct("<d").pack


def _any_value(v: object) -> bytes:
    """An ``AnyValue``'s bytes (the SDK's checks, in its order)."""
    if isinstance(v, bool):
        return _TRUE if v else _FALSE
    if isinstance(v, str):
        return _field(1, v.encode())
    if isinstance(v, int):
        return _T_INT + _varint(v)
    if isinstance(v, float):
        return _T_DOUBLE + _pack_d(v)
    if isinstance(v, list | tuple):
        return _field(5, b"".join(_field(1, _any_value(x)) for x in v))
    return _encode_value(v).SerializeToString()  # bytes, a mapping, None: the SDK's way


class OTLPTraceEncoder:
    """Encodes batches of finished spans; keeps the bytes of repeated parts. One per
    exporter (its export thread is the only caller)."""

    def __init__(self) -> None:
        self._kv: dict[tuple[str, type, object], bytes] = {}  # (key, type, value) -> KeyValue, its length first
        self._keys: dict[str, bytes] = {}  # key -> KeyValue's key field
        self._names: dict[str, bytes] = {}
        self._statuses: dict[tuple, bytes] = {}  # (code, description) -> Status field
        self._heads: dict[int, tuple[object, bytes, bytes]] = {}  # id -> (resource or scope, before, after)

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        if any(s.events or s.links for s in spans):
            return encode_spans(spans).SerializePartialToString()
        tree: dict[int, dict[int, list[bytes]]] = {}  # resource -> scope -> spans, as the SDK groups them
        for s in spans:
            r, sc = s.resource, s.instrumentation_scope
            tree.setdefault(self._head(r, self._resource), {}).setdefault(
                self._head(sc, self._scope), []).append(_field(2, self._span(s)))
        heads = self._heads
        out = b"".join(_field(1, heads[r][1] + b"".join(_field(2, heads[sc][1] + b"".join(ss) + heads[sc][2])
                                                        for sc, ss in scopes.items()) + heads[r][2])
                       for r, scopes in tree.items())
        if len(heads) > 64:  # (objects gone: forget them now and then)
            heads.clear()
        return out

    def _head(self, obj, encode) -> int:
        """``id(obj)``, its encoding cached (with the object, so the id stays its own)."""
        key = id(obj)
        if key not in self._heads:
            url = getattr(obj, "schema_url", None)
            self._heads[key] = (obj, encode(obj), _field(3, url.encode()) if url else b"")
        return key

    def _resource(self, r) -> bytes:
        """Its field in ResourceSpans (its schema URL goes after the spans, as field 3)."""
        return _field(1, self._attributes(r.attributes, 1))

    def _scope(self, sc) -> bytes:
        if sc is None:
            return _field(1, b"")
        body = (_field(1, sc.name.encode()) if sc.name else b"") + (
            _field(2, sc.version.encode()) if sc.version else b"") + self._attributes(sc.attributes, 3)
        return _field(1, body)

    def _attributes(self, attrs, field: int) -> bytes:
        """``attrs`` as repeated KeyValue ``field``."""
        if not attrs:
            return b""
        kv, keys, tag = self._kv, self._keys, _LEN_TAG[field]
        out = []
        for k, v in attrs.items():
            t = type(v)
            cacheable = t is str or t is int or t is bool  # (floats are durations: seldom twice the same)
            if cacheable:
                got = kv.get((k, t, v))
                if got is not None:
                    out += (tag, got)
                    continue
            elif v is None:  # (the SDK's attributes drop None too)
                continue
            key = keys.get(k)
            if key is None:
                key = keys[k] = _field(1, k.encode())
            try:
                one = key + _field(2, _any_value(v))
            except Exception:  # noqa: BLE001 - as the SDK: an attribute it cannot encode is left out
                continue
            one = _varint(len(one)) + one
            if cacheable:
                if len(kv) >= _CACHE_MAX:
                    kv.clear()
                kv[(k, t, v)] = one
            out += (tag, one)
        return b"".join(out)

    def _span(self, s: ReadableSpan) -> bytes:
        c, parent, attrs = s.context, s.parent, s.attributes
        name = self._names.get(s.name)
        if name is None:
            name = self._names[s.name] = _field(5, s.name.encode())
        st = s.status
        status = self._statuses.get((st.status_code, st.description))
        if status is None:
            if len(self._statuses) >= _CACHE_MAX:
                self._statuses.clear()
            status = self._statuses[(st.status_code, st.description)] = _status(st)
        parts = [_T_TRACE_ID, c.trace_id.to_bytes(16, "big"), _T_SPAN_ID, c.span_id.to_bytes(8, "big")]
        if c.trace_state:
            parts.append(_field(3, ",".join(f"{k}={v}" for k, v in c.trace_state.items()).encode()))
        if parent is not None:
            parts += (_T_PARENT, parent.span_id.to_bytes(8, "big"))
        parts += (name, _KIND[s.kind], _T_START, _pack_q(s.start_time), _T_END, _pack_q(s.end_time),
                  self._attributes(attrs, 9))
        if type(attrs) is not dict and s.dropped_attributes:  # (a plain dict drops nothing)
            parts.append(_tag(10, _VARINT) + _varint(s.dropped_attributes))
        parts += (status, _FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        return b"".join(parts)


def _status(st) -> bytes:
    code = st.status_code.value
    body = (_field(2, st.description.encode()) if st.description else b"") + (
        _tag(3, _VARINT) + _varint(code) if code else b"")
    return _field(15, body)


class OTLPWireExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP exporter (its HTTP client: headers, compression, retries with
    back-off) with this module's encoder in place of ``encode_spans``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._encoder = OTLPTraceEncoder()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            data = self._encoder.encode(spans)
        except Exception:  # noqa: BLE001 - a bad batch is dropped, as the SDK's exporter does
            _log.exception("could not encode %d spans", len(spans))
            return SpanExportResult.FAILURE
        # ``_client`` is the SDK exporter's own sender (pinned: opentelemetry-exporter-otlp-proto-http
        # 1.45; the OTLP receiver test sends through it).
        return SpanExportResult.SUCCESS if self._client.export(data).success else SpanExportResult.FAILURE
