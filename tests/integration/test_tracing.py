"""Optional OpenTelemetry tracing (shared.tracing, the `otel` extra): ingest → stream → consolidator →
index is one trace, recall has its steps as spans, OTLP/HTTP export when an endpoint is set, and
nothing when it is off."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from engram_episodic.events import Episode, EpisodeCompleted, Task  # noqa: E402
from services.consolidator.worker import Worker  # noqa: E402
from services.query.app import make_app  # noqa: E402
from shared import codec, tracing  # noqa: E402
from shared.crypto import DataKey  # noqa: E402
from shared.embedding import HashingEmbedder  # noqa: E402
from tests.helpers import wait_until  # noqa: E402


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    assert tracing.configure("engram-test", {}, exporter=exporter)
    yield exporter
    tracing.shutdown()


def _one(spans, name: str):
    found = [s for s in spans.get_finished_spans() if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans.get_finished_spans()])
    return found[0]


async def test_ingest_stream_consolidator_index_is_one_trace_and_recall_has_its_steps(
    aiohttp_client, settings, redis, spans
):
    client = await aiohttp_client(
        make_app(settings, redis=redis, embedder=HashingEmbedder(settings.embed_dim))
    )
    resp = await client.post("/v1/episodes", json={"task": "fix the flaky login test", "outcome": "success"})
    assert resp.status == 202, await resp.text()
    ingest = _one(spans, "POST /v1/episodes")
    assert (
        ingest.attributes["http.route"] == "/v1/episodes"
        and ingest.attributes["http.response.status_code"] == 202
    )

    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="traced")
    await worker.setup()
    while await worker.turn():
        pass
    deliver = _one(spans, "engram.stream.deliver")
    assert deliver.context.trace_id == ingest.context.trace_id  # the trace crossed the stream
    assert deliver.parent.span_id == ingest.context.span_id
    batch = _one(spans, "engram.consolidator.batch")
    assert [link.context.span_id for link in batch.links] == [ingest.context.span_id]
    for step in ("engram.embed", "engram.index.write"):
        assert _one(spans, step).parent.span_id == batch.context.span_id, step

    resp = await client.post("/v1/recall", json={"query": "flaky login test", "mode": "hybrid"})
    assert resp.status == 200 and len((await resp.json())["results"]) == 1
    request = _one(spans, "POST /v1/recall")
    for step in ("engram.recall.embed", "engram.recall.knn", "engram.recall.bm25", "engram.recall.score"):
        found = [s for s in spans.get_finished_spans() if s.name == step]
        assert found and all(s.context.trace_id == request.context.trace_id for s in found), step


def test_sealed_and_plain_envelopes_carry_the_trace_and_decode_as_before(spans):
    event = EpisodeCompleted(
        namespace="ns",
        episode_id="e1",
        occurred_at=1.0,
        episode=Episode(episode_id="e1", outcome="success", completed_at=1.0, task=Task(description="x")),
    )
    key = DataKey.from_bytes(b"k" * 16, b"s" * 32)
    with tracing.span("publish") as current:
        plain, sealed = codec.encode(event), codec.seal(event, b"r" * 16, key)
    ctx = current.get_span_context()
    want = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert codec.trace_of(plain) == want and codec.trace_of(sealed) == want
    assert codec.decode(plain) == event
    assert codec.decode(sealed, lambda ref, kid: key) == event
    assert codec.trace_of(codec.encode(event)) is None  # outside any span
    assert codec.trace_of(b"\xc1 not msgpack") is None


async def test_spans_are_exported_by_otlp_http_when_an_endpoint_is_set(aiohttp_client, monkeypatch):
    received: list[bytes] = []

    async def traces(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(status=200)

    collector = web.Application()
    collector.router.add_post("/v1/traces", traces)
    server = await aiohttp_client(collector)
    endpoint = str(server.make_url("")).rstrip("/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    assert tracing.configure("engram-test", {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    with tracing.span("engram.exported", marker="otlp-check"):
        pass
    await asyncio.to_thread(tracing.shutdown)  # flushes the batch (the exporter posts from its thread)
    await wait_until(lambda: received, timeout=10, message="an OTLP export")
    assert b"engram.exported" in received[0] and b"otlp-check" in received[0]  # protobuf keeps strings


def test_off_costs_a_shared_no_op():
    tracing.shutdown()
    assert not tracing.configure("engram-test", {})  # no endpoint, no exporter: stays off
    first, second = tracing.span("a", x=1), tracing.span("b")
    assert first is second and tracing.traceparent() is None
    with first:
        pass
