"""The consolidator's `/healthz` and `/metrics` (services.consolidator.health): against a running
consolidator process, and in-process for a lane that stops coming round."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess

import aiohttp
import pytest

from deploy.embedded_redis import EmbeddedRedis, free_port
from services.consolidator.health import Health, operations_app
from services.consolidator.metrics import WorkerMetrics
from services.consolidator.worker import Worker
from shared.embedding import HashingEmbedder
from tests.helpers import HeldEmbedder, spawn_consolidator, wait_until
from tests.integration.test_worker_process import publish_many

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it


def spawn(settings, redis_url: str, port: int, **env: str) -> subprocess.Popen:
    return spawn_consolidator(settings, redis_url, ENGRAM_METRICS_PORT=str(port), **env)


async def _get(url: str) -> tuple[int, dict | str]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r,
    ):
        if r.content_type == "application/json":
            return r.status, await r.json()
        return r.status, await r.text()


async def _health(port: int) -> tuple[int, dict] | None:
    try:
        status, body = await _get(f"http://127.0.0.1:{port}/healthz")
    except aiohttp.ClientError:  # not listening yet
        return None
    assert isinstance(body, dict)
    return status, body


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


async def test_a_running_consolidator_is_healthy_reports_its_last_batch_and_serves_metrics(settings, redis):
    port = free_port()
    proc = spawn(settings, settings.redis_url, port)
    try:

        async def healthy():
            got = await _health(port)
            return got if got and got[0] == 200 else None

        _, body = await wait_until(healthy, timeout=60, message="consolidator /healthz 200")
        assert body["status"] == "ok" and body["checks"] == {"loop": True, "redis": True}
        assert body["lanes"] == settings.in_flight and body["last_batch_age_seconds"] is None
        assert 0 <= body["loop_age_seconds"] < 120
        await publish_many(redis, settings, 3)

        async def projected():
            got = await _health(port)
            return got[1] if got and got[1]["processed"] >= 3 else None

        body = await wait_until(projected, timeout=30, message="3 entries processed")
        assert body["status"] == "ok" and 0 <= body["last_batch_age_seconds"] < 30
        status, text = await _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and isinstance(text, str)
        assert 'engram_events_processed_total{result="ok",type="EpisodeCompleted"} 3.0' in text
    finally:
        code = _stop(proc)
    assert code == 0


async def test_healthz_is_503_while_redis_is_unreachable_at_start_and_after(settings, tmp_path):
    server = EmbeddedRedis(port=free_port(), data_dir=tmp_path / "redis")
    port = free_port()
    proc = spawn(settings, server.url, port)  # Redis not started yet: the worker waits for it
    try:

        async def answered():
            return await _health(port)

        status, body = await wait_until(answered, timeout=60, message="consolidator /healthz answers")
        assert status == 503 and body["status"] == "starting" and body["pending"] == ["redis"]
        server.start()

        async def is_(wanted: int, what: str):
            got = await _health(port)
            return got[1] if got and got[0] == wanted and got[1]["status"] == what else None

        await wait_until(lambda: is_(200, "ok"), timeout=60, message="healthy once Redis is up")
        server.kill()
        body = await wait_until(
            lambda: is_(503, "redis unreachable"), timeout=30, message="503 once Redis is gone"
        )
        assert body["checks"]["redis"] is False
        server.start()  # same port and data directory
        await wait_until(lambda: is_(200, "ok"), timeout=60, message="healthy again")
    finally:
        _stop(proc)
        server.kill()


def test_a_taken_metrics_port_stops_the_consolidator_with_a_message(settings):
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        proc = spawn(settings, settings.redis_url, port)
        try:
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.stderr is not None
    said = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    assert code == 2 and f"ENGRAM_METRICS_PORT={port} on 127.0.0.1 is not free" in said


async def test_a_lane_that_stops_coming_round_is_stuck_until_it_moves_again(aiohttp_client, settings, redis):
    embedder = HeldEmbedder(settings.embed_dim)  # a lane embedding a batch stops coming round its loop
    metrics = WorkerMetrics()
    worker = Worker(settings.with_(in_flight=1), redis, embedder, metrics=metrics, name="stalled")
    health = Health(stall=0.5)
    client = await aiohttp_client(operations_app(health, metrics.registry))
    resp = await client.get("/healthz")
    assert resp.status == 503 and (await resp.json())["pending"] == ["embedder"]
    health.worker = worker
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:

        async def status(wanted: str):
            resp = await client.get("/healthz")
            body = await resp.json()
            return body if body["status"] == wanted else None

        await wait_until(lambda: status("ok"), timeout=15, message="healthy while idle")
        await publish_many(redis, settings, 1)  # the lane takes it and waits in the embedder
        body = await wait_until(lambda: status("stuck"), timeout=15, message="stuck")
        assert body["checks"] == {"loop": False, "redis": True} and body["stall_seconds"] == 0.5
        assert body["loop_age_seconds"] > 0.5
        assert (await client.get("/healthz")).status == 503
        embedder.release.set()

        async def projected():
            body = await status("ok")  # ok again from the pass that completed; then the batch is written
            return body if body is not None and body["processed"] == 1 else None

        body = await wait_until(projected, timeout=15, message="healthy again")
        assert body["last_batch_age_seconds"] is not None
    finally:
        embedder.release.set()
        stop.set()
        await running


class PacedEmbedder(HashingEmbedder):
    """A slow model: one text per forward pass, `pass_seconds` each (a busy CPU embedding long texts)."""

    def __init__(self, dim: int, pass_seconds: float):
        super().__init__(dim)
        self.batch_size, self.pass_seconds = 1, pass_seconds

    async def _embed_batch(self, texts):
        await asyncio.sleep(self.pass_seconds)
        return await super()._embed_batch(texts)


async def test_a_lane_embedding_a_long_batch_is_healthy_while_its_passes_complete(
    aiohttp_client, settings, redis
):
    """A 1,000-episode POST must not read as `stuck` (loop age 153 s > the 120 s stall) while the
    worker embeds it at 94% CPU: a lane counts as turning after each forward pass. Here 12 passes of 0.15 s
    make one batch last ~4x the 0.5 s stall, and /healthz stays ok throughout."""
    embedder = PacedEmbedder(settings.embed_dim, 0.15)
    metrics = WorkerMetrics()
    worker = Worker(settings.with_(in_flight=1), redis, embedder, metrics=metrics, name="paced")
    health = Health(stall=0.5)
    health.worker = worker
    client = await aiohttp_client(operations_app(health, metrics.registry))
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    seen: list[tuple[str, float | None]] = []
    try:

        async def done() -> bool:
            body = await (await client.get("/healthz")).json()
            seen.append((body["status"], body["loop_age_seconds"]))
            return body["processed"] >= 12

        await wait_until(lambda: any(s == "ok" for s, _ in seen) or done(), message="running")
        seen.clear()
        await publish_many(redis, settings, 12)
        await wait_until(done, timeout=30, interval=0.05, message="the batch projected")
        statuses = {s for s, _ in seen}
        assert statuses == {"ok"}, seen
        assert len(seen) > 20, "too few probes during the batch for the test to mean anything"
    finally:
        stop.set()
        await running
