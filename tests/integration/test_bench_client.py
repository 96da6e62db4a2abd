"""The benchmarks' HTTP plumbing on the typed client (bench.common): the status a load generator records
for each outcome (sent once, never retried), and ClientPool's bound on requests in flight."""

from __future__ import annotations

import asyncio

from aiohttp import web

from bench.common import ClientPool, status_of, wait_http_ready
from deploy.embedded_redis import free_port
from engram_episodic import AsyncEngram
from engram_episodic.client import Calls
from tests.helpers import EMPTY_RECALL


async def stand_in(aiohttp_server, state: dict):
    """/v1/recall answers from `state["script"]` (a status, or "hang"); counts requests and the peak in flight."""
    state.update(count=0, in_flight=0, peak=0)

    async def recall(request: web.Request) -> web.StreamResponse:
        state["count"] += 1
        state["in_flight"] += 1
        state["peak"] = max(state["peak"], state["in_flight"])
        try:
            step = state["script"].pop(0) if state["script"] else 200
            if step == "hang":  # until the test releases it (or the server's teardown cancels it)
                await state.setdefault("released", asyncio.Event()).wait()
            elif step != 200:
                return web.json_response(
                    {"title": "no", "status": step},
                    status=step,
                    headers={"Retry-After": "0"},
                    content_type="application/problem+json",
                )
            await asyncio.sleep(state.get("delay", 0))
            return web.json_response(EMPTY_RECALL)
        finally:
            state["in_flight"] -= 1

    async def ingest(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return web.json_response(
            {
                "accepted": 1,
                "results": [{"episode_id": body["episode_id"], "event_id": "e"}],
                "episode_id": body["episode_id"],
                "event_id": "e",
            },
            status=202,
        )

    async def readyz(request: web.Request) -> web.StreamResponse:
        state["probes"] = state.get("probes", 0) + 1
        ok = state["probes"] > 2
        return web.json_response(
            {"status": "ready" if ok else "not ready", "checks": {}}, status=200 if ok else 503
        )

    app = web.Application()
    app.router.add_post("/v1/recall", recall)
    app.router.add_post("/v1/episodes", ingest)
    app.router.add_get("/readyz", readyz)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}"


async def test_status_of_records_each_outcome_once(aiohttp_server):
    state: dict = {"script": []}
    base = await stand_in(aiohttp_server, state)
    recall = Calls.recall("q", top_k=5).as_json()
    async with ClientPool(base, 4, 10.0, max_retries=0) as pool:
        assert await status_of(pool, recall, 200, 5.0) == 200
        assert (
            await status_of(pool, Calls.record_parts({"task": "t", "outcome": "success"}, {})[1][0], 202, 5.0)
            == 202
        )
        for status in (429, 503, 422):  # a 429/503 is an error of the step: recorded, not retried
            state["count"], state["script"] = 0, [status]
            assert await status_of(pool, recall, 200, 5.0) == status
            assert state["count"] == 1
        state["script"] = ["hang"]
        assert await status_of(pool, recall, 200, 0.3) == 0  # not answered within the total timeout
        state["released"].set()
    nobody = f"http://127.0.0.1:{free_port()}"
    async with AsyncEngram(nobody, max_retries=0) as memory:
        assert await status_of(memory, recall, 200, 5.0) == 0  # refused


async def test_client_pool_bounds_requests_in_flight_and_reuses_connections(aiohttp_server):
    state: dict = {"script": [], "delay": 0.05}
    base = await stand_in(aiohttp_server, state)
    async with ClientPool(base, 3, 10.0, max_retries=0) as pool:
        calls = [pool.call(Calls.recall(f"q{i}").as_json()) for i in range(12)]
        answers = await asyncio.gather(*calls)
    assert all(a["mode"] == "hybrid" for a in answers)
    assert state["count"] == 12 and state["peak"] == 3


async def test_wait_http_ready_polls_until_200(aiohttp_server):
    state: dict = {"script": []}
    base = await stand_in(aiohttp_server, state)

    class Alive:
        def poll(self):
            return None

    await wait_http_ready(base, Alive(), timeout=10)  # type: ignore[arg-type]
    assert state["probes"] == 3
