"""A loopback OpenTelemetry collector: takes OTLP/HTTP protobuf trace exports (``POST
/v1/traces``, as the SDK's exporter sends them) and keeps the spans, decoded with the
protocol's own message types, for tests to read."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class CollectedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    error: bool
    service: str


@dataclass
class Collector:
    url: str
    bodies: list[bytes] = field(default_factory=list)
    spans: list[CollectedSpan] = field(default_factory=list)

    async def wait_for(self, name: str, count: int = 1, within: float = 10.0) -> list[CollectedSpan]:
        """The spans named ``name`` once ``count`` have arrived. Waits without blocking the event
        loop: the spans still open (a call's) end in it."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = [span for span in self.spans if span.name == name]
            if len(found) >= count:
                return found
            await asyncio.sleep(0.02)
        raise AssertionError(f"{count} span(s) named {name} did not arrive; got {[s.name for s in self.spans]}")

    def named(self, name: str) -> list[CollectedSpan]:
        return [span for span in self.spans if span.name == name]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _decode(body: bytes) -> list[CollectedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out: list[CollectedSpan] = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    CollectedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        error=span.status.code == 2,  # STATUS_CODE_ERROR
                        service=str(resource.get("service.name", "")),
                    )
                )
    return out


class _Handler(BaseHTTPRequestHandler):
    collector: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(400)
            self.end_headers()
            return
        try:
            spans = _decode(body)
        except Exception:
            self.send_response(400)
            self.end_headers()
            return
        self.collector.bodies.append(body)
        self.collector.spans.extend(spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return


class running_collector:
    """``with running_collector() as collector:`` a collector on a free loopback port."""

    def __enter__(self) -> Collector:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        host, port = self._server.server_address[:2]
        collector = Collector(url=f"http://{host}:{port}/v1/traces")
        self._server.RequestHandlerClass = type("Handler", (_Handler,), {"collector": collector})
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return collector

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
