"""Prometheus metrics of one consolidator process (a registry per process, never the global one)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class WorkerMetrics:
    """Counters and histograms the worker updates; `registry` is served on ENGRAM_METRICS_PORT."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.events = Counter(
            "engram_events_processed_total", "Stream entries processed", ["type", "result"], registry=r
        )
        self.dead_letters = Counter(
            "engram_dead_letters_total", "Entries moved to the dead-letter stream", ["reason"], registry=r
        )
        self.batch_seconds = Histogram("engram_batch_seconds", "Time to project one batch", registry=r)
        self.embed_seconds = Histogram("engram_embed_seconds", "Time to embed one batch of texts", registry=r)
        self.truncations = Counter(
            "engram_embed_truncations_total", "Texts truncated to the embedder's input window", registry=r
        )
        self.lag = Gauge(
            "engram_consumer_lag", "Entries not yet delivered to the group (XINFO GROUPS)", registry=r
        )
        self.partition_lag = Gauge(
            "engram_consumer_partition_lag",
            "Entries not yet delivered to the group, per stream partition (only with more than one)",
            ["partition"],
            registry=r,
        )
        self.pending = Gauge(
            "engram_consumer_pending", "Entries delivered but not acked (XINFO GROUPS)", registry=r
        )
        self.write_conflicts = Counter(
            "engram_projection_conflicts_total",
            "Projection writes retried because another worker added an event",
            registry=r,
        )
        self.summarizer_failures = summarizer_failures(r)


def summarizer_failures(registry: CollectorRegistry) -> Counter:
    """`engram_summarizer_failures_total{reason}`: fact texts the summariser failed to rewrite, in
    `registry` (the consolidator's and the query service's each)."""
    return Counter(
        "engram_summarizer_failures_total",
        "Fact summaries that failed and fell back to the deterministic text",
        ["reason"],
        registry=registry,
    )
