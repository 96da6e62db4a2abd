"""A request `Content-Encoding` on both HTTP servers (the query API and the consolidator's operations
port), served by the runners the processes use: refused with 415 problem+json before any handler
reads the body, and never a traceback in the log (`shared.content_coding`)."""

from __future__ import annotations

import gzip
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from deploy.embedded_redis import free_port
from services.consolidator.health import Health, start_operations
from services.consolidator.metrics import WorkerMetrics

pytestmark = pytest.mark.slow  # starts servers: `make test-fast` skips it

pytest_plugins = ["tests.integration.test_query_support"]

BODY = b'{"query": "flaky migration test"}'
CODINGS = ("gzip", "deflate", "br", "x-anything")


def no_traceback(caplog) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [(r.name, r.getMessage()[:200]) for r in bad]


async def assert_refused(resp: aiohttp.ClientResponse, coding: str) -> None:
    assert resp.status == 415, await resp.text()
    assert resp.content_type == "application/problem+json"
    assert resp.headers["Accept-Encoding"] == "identity"
    body = await resp.json()
    assert body["status"] == 415 and "Content-Encoding" in body["detail"] and coding in body["detail"]


@pytest.mark.parametrize("coding", CODINGS)
async def test_the_query_service_refuses_a_content_encoding_with_415_and_no_traceback(api, caplog, coding):
    caplog.set_level(logging.DEBUG)
    headers = {"Content-Encoding": coding, "Content-Type": "application/json"}
    for method, path in (("GET", "/healthz"), ("POST", "/v1/recall"), ("POST", "/v1/episodes")):
        await assert_refused(await api.request(method, path, data=BODY, headers=headers), coding)
    resp = await api.post("/v1/recall", data=gzip.compress(BODY), headers={"Content-Encoding": "gzip"})
    await assert_refused(resp, "gzip")  # a real gzip body too: bodies are taken as sent
    # the connection drained the unread bodies (where the traceback was logged) before this answer
    assert (await api.get("/healthz")).status == 200
    no_traceback(caplog)
    assert (await api.post("/v1/recall", data=BODY, headers={"Content-Encoding": "identity"})).status == 200


@pytest.fixture
async def operations_port() -> AsyncIterator[str]:
    """The consolidator's operations port as the process serves it (no worker yet: /healthz is 503)."""
    port = free_port()
    runner = await start_operations(Health(stall=5), WorkerMetrics().registry, host="127.0.0.1", port=port)
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.parametrize("coding", CODINGS)
async def test_the_operations_port_refuses_a_content_encoding_with_415_and_no_traceback(
    operations_port, caplog, coding
):
    caplog.set_level(logging.DEBUG)
    async with aiohttp.ClientSession() as s:
        for path in ("/healthz", "/metrics"):
            async with s.get(operations_port + path, data=BODY, headers={"Content-Encoding": coding}) as resp:
                await assert_refused(resp, coding)
        async with s.get(operations_port + "/metrics") as resp:
            assert resp.status == 200
    no_traceback(caplog)


async def test_a_coding_in_any_of_several_headers_or_a_list_is_refused(api):
    """`Content-Encoding` may come as several headers or one comma-separated list (RFC 9110 §5.3):
    identity then gzip is gzip either way."""
    from multidict import CIMultiDict

    headers = CIMultiDict([("Content-Encoding", "identity"), ("Content-Encoding", "gzip")])
    await assert_refused(await api.post("/v1/recall", data=BODY, headers=headers), "gzip")
    await assert_refused(
        await api.post("/v1/recall", data=BODY, headers={"Content-Encoding": "identity, gzip"}), "gzip"
    )
    listed = {"Content-Encoding": "identity, IDENTITY"}
    assert (await api.post("/v1/recall", data=BODY, headers=listed)).status == 200
