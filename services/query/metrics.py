"""Prometheus metrics of one app instance (its own registry: two apps in one process never collide)."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.consolidator.metrics import summarizer_failures
from services.query.problems import route_of
from shared import tracing

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "engram_http_requests_total",
            "HTTP requests by route, method and status",
            ("route", "method", "status"),
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "engram_http_request_seconds",
            "HTTP request latency by route",
            ("route",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.recall_seconds = Histogram(
            "engram_recall_seconds",
            "Recall latency (embedding + search + scoring)",
            ("mode",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.embed_seconds = Histogram(
            "engram_query_embed_seconds",
            "Query embedding latency",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.recall_candidates = Histogram(
            "engram_recall_candidates",
            "Candidates re-ranked per recall",
            buckets=(0, 1, 3, 6, 10, 20, 50, 100, 200, 500, 1000),
            registry=self.registry,
        )
        self.published = Counter(
            "engram_http_published_events_total",
            "Events published over HTTP",
            ("type",),
            registry=self.registry,
        )
        self.embed_truncations = Counter(
            "engram_query_embed_truncations_total",
            "Query texts cut to the embedder window",
            registry=self.registry,
        )
        self._truncations_seen = 0
        # read from Redis at each scrape (services.query.views.operations.consolidation); NaN: unknown
        self.dead_letters = Gauge(
            "engram_stream_dead_letters",
            "Entries in the dead-letter stream (the consolidator gave up on them: `engram-admin dead-letters`)",
            registry=self.registry,
        )
        self.lag = Gauge(
            "engram_stream_lag",
            "Entries published and not yet delivered to the consolidator's group (all partitions)",
            registry=self.registry,
        )
        self.summarizer_failures = summarizer_failures(self.registry)  # on-demand POST /v1/consolidate

    def count_truncations(self, total: int) -> None:
        """Add what the embedder's running count of cut texts (`total`) grew by since the last call: the
        counter is the embedder's, shared by every request, so each delta is counted once."""
        self.embed_truncations.inc(max(0, total - self._truncations_seen))
        self._truncations_seen = max(self._truncations_seen, total)

    def middleware(self):
        """Middleware counting and timing each request by its route's template, within a server span
        named by it when tracing is on (`shared.tracing`): ids live in paths, never the path itself."""

        @web.middleware
        async def middleware(request: web.Request, handler) -> web.StreamResponse:
            route, method = route_of(request), request.method
            status: int | None = None  # None: the handler raised (counted as a 500)
            with tracing.span(
                f"{method} {route}", kind="server", **{"http.request.method": method, "http.route": route}
            ) as span:
                start = time.perf_counter()
                try:
                    response = await handler(request)
                    status = response.status
                    return response
                except web.HTTPException as exc:
                    status = exc.status
                    raise
                finally:
                    if span is not None and status is not None:
                        span.set_attribute("http.response.status_code", status)
                    counted = route_of(request, "<unmatched>")
                    self.requests.labels(counted, method, str(status or 500)).inc()
                    self.request_seconds.labels(counted).observe(time.perf_counter() - start)

        return middleware
