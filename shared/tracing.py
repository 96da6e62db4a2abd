"""Optional OpenTelemetry tracing (the `otel` extra: opentelemetry-sdk and the OTLP/HTTP exporter).

Off unless an entry point calls `configure(service, env)` with `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set and the SDK installed; then spans go there by OTLP/HTTP.
Off, `span()` returns one shared no-op context manager and `traceparent()` None, importing nothing.
The spans are listed in docs/architecture.md (Metrics). Tests pass an exporter; the provider is
this module's own, never OpenTelemetry's global one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_NOOP = contextlib.nullcontext()
_state: dict[str, Any] = {"tracer": None, "provider": None}


def configure(service: str, env: Mapping[str, str], *, exporter: Any = None) -> bool:
    """Turn tracing on for this process as `service` (OpenTelemetry `service.name`), exporting to
    `exporter` (tests; spans sent one by one) or, when `OTEL_EXPORTER_OTLP_ENDPOINT` /
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, by OTLP/HTTP in batches. Returns whether it is on
    (False: no endpoint and no exporter, or the SDK is not installed)."""
    if exporter is None and not (
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        return False
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _state.update(tracer=provider.get_tracer("engram"), provider=provider)
    return True


def shutdown() -> None:
    """Flush and stop the exporter; tracing is off afterwards."""
    provider = _state["provider"]
    _state.update(tracer=None, provider=None)
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _state["tracer"] is not None


def span(
    name: str, *, kind: str = "internal", parent: str | None = None, links: Sequence[str] = (), **attributes
):
    """A context manager: the span `name` with `attributes` as the current span (no-op when off).
    `kind`: internal, server, producer or consumer; `parent`: a W3C traceparent to continue instead of
    the current span; `links`: traceparents to link to (a batch to the entries it consumed)."""
    tracer = _state["tracer"]
    if tracer is None:
        return _NOOP
    return _start(tracer, name, kind, parent, links, attributes)


@contextlib.contextmanager
def _start(
    tracer, name: str, kind: str, parent: str | None, links: Sequence[str], attributes
) -> Iterator[Any]:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    propagator = TraceContextTextMapPropagator()
    context = propagator.extract({"traceparent": parent}) if parent else None
    linked = []
    for tp in links:
        linked_span = trace.get_current_span(propagator.extract({"traceparent": tp}))
        if linked_span.get_span_context().is_valid:
            linked.append(trace.Link(linked_span.get_span_context()))
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=getattr(trace.SpanKind, kind.upper()),
        links=linked,
        attributes={k: v for k, v in attributes.items() if v is not None},
    ) as current:
        yield current


def traceparent() -> str | None:
    """The W3C traceparent of the current span (to carry in a stream entry), None when off or outside
    any span."""
    if _state["tracer"] is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")
