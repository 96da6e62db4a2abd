"""Security over HTTP: query injection never widens a scope (extends C12), tenants learn nothing of each
other on any route, API keys never reach a log, bodies over the limit are 413 on every body route."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import pytest
from yarl import URL

from deploy.embedded_redis import free_port
from services.consolidator.worker import Worker
from shared.embedding import HashingEmbedder
from shared.index import Scope, count
from shared.keys import Keys
from shared.tags import BLAKE2B
from tests.helpers import spawn_query_service, wait_until
from tests.integration.test_query_support import (
    KEY_A,
    KEY_B,
    METRICS_KEY,
    TableEmbedder,
    auth,
    episode,
    fully_indexed,
    ids,
    put,
)

pytest_plugins = ["tests.integration.test_query_support"]

ROOT = Path(__file__).resolve().parents[2]

KEY_C = "key-for-c-empty-5555555555"
THREE = {KEY_A: "ns-a", KEY_B: "ns-b", KEY_C: "ns-c"}

# Values that are query syntax in RediSearch (tags, text, KNN, parameters) or close to it.
HOSTILE = [
    "@namespace:{ns-b}",
    "x} @namespace:{ns-b",
    "ns-b} | @namespace:{ns-b",
    "*",
    "-ns-a",
    "-",
    "(a|b)",
    "a|b",
    "|",
    "=>[KNN 100 @vector $BLOB]",
    "$BLOB",
    "$",
    "@",
    "ns-b",
    "{",
    "}",
    "\\",
    "\\*",
    "a\\|b",
    '"quoted"',
    "'",
    "%fuzzy%",
    "~opt",
    "a:b",
    "[1 2]",
    "@agent_id:{*}",
    "*=>[KNN 10 @vector $v]",
]


async def seed_two_tenants(redis, prefix: str) -> None:
    """ns-a: one episode per hostile value (id, scope keys and category all equal to it).
    ns-b: the same ids with B's secret text, plus b-only episodes and a broad decoy set."""
    for i, value in enumerate(HOSTILE):
        common = dict(agent_id=value, user_id=value, session_id=value, category=value, strategy_used=value)
        await put(redis, prefix, "ns-a", episode(value, task=f"shared task of tenant a {i}", **common))
        await put(redis, prefix, "ns-b", episode(value, task=f"shared task secret of tenant b {i}", **common))
    for i in range(5):
        await put(
            redis,
            prefix,
            "ns-b",
            episode(
                f"b-only-{i}",
                task="shared task secret of tenant b",
                agent_id="ns-a",
                user_id="b-user",
                category="debugging",
            ),
        )
    await wait_until(lambda: fully_indexed(redis, prefix), message="index backfill")


async def ok_json(resp, status: int = 200) -> Any:
    assert resp.status == status, await resp.text()
    return await resp.json()


async def ok_json_text(resp, status: int = 200) -> str:
    text = await resp.text()
    assert resp.status == status, text
    return text


def enc(path_value: str) -> str:
    return quote(path_value, safe="")


async def test_query_syntax_in_ids_never_widens_scope_or_breaks_a_query(make_client, redis, prefix):
    """Case C12: ids and queries holding query syntax never reach another tenant's data nor cause an error."""
    client = await make_client(api_keys=THREE)
    await seed_two_tenants(redis, prefix)
    a = auth(KEY_A)
    for value in HOSTILE:
        for name in ("agent_id", "user_id", "session_id"):
            for mode in ("vector", "keyword", "hybrid"):
                body = await ok_json(
                    await client.post(
                        "/v1/recall",
                        json={"query": "shared task", name: value, "mode": mode, "top_k": 100},
                        headers=a,
                    )
                )
                assert ids(body) == [value], (name, mode, value)
                assert all("tenant a" in r["episode"]["task"]["description"] for r in body["results"])
        for name in ("category", "strategy"):
            body = await ok_json(
                await client.post(
                    "/v1/recall", json={"query": "shared task", name: [value], "top_k": 100}, headers=a
                )
            )
            assert ids(body) == [value], (name, value)
        # the hostile text as the query itself: answers (maybe nothing), never B's data, never an error
        for mode in ("vector", "keyword", "hybrid"):
            body = await ok_json(
                await client.post("/v1/recall", json={"query": value, "mode": mode, "top_k": 100}, headers=a)
            )
            assert all("tenant a" in r["episode"]["task"]["description"] for r in body["results"]), (
                mode,
                value,
            )
        got = await ok_json(await client.get(URL(f"/v1/episodes/{enc(value)}", encoded=True), headers=a))
        assert got["episode"]["episode_id"] == value and "tenant a" in got["episode"]["task"]["description"]
        skills = await ok_json(await client.get("/v1/skills", params={"agent_id": value}, headers=a))
        assert [(s["category"], s["episodes"]) for s in skills["results"]] == [(value, 1)], value
        curve = await ok_json(
            await client.get("/v1/learning-curve", params={"user_id": value, "category": value}, headers=a)
        )
        assert [p["episode_id"] for p in curve["results"]] == [value]
        for path in ("/v1/suggest", "/v1/strategy", "/v1/context"):
            await ok_json(await client.post(path, json={"task": value, "agent_id": value}, headers=a))
        facts = await ok_json(
            await client.post(
                "/v1/facts/search", json={"query": value, "agent_id": value, "category": [value]}, headers=a
            )
        )
        assert facts["results"] == []
    # B's b-only ids and its agent named "ns-a" stay invisible to A whatever the filter says
    body = await ok_json(
        await client.post(
            "/v1/recall",
            json={"query": "secret", "agent_id": "ns-a", "mode": "hybrid", "top_k": 100},
            headers=a,
        )
    )
    assert ids(body) == []


async def test_forget_with_hostile_user_id_deletes_exactly_that_user(make_client, settings, redis, prefix):
    client = await make_client(api_keys=THREE)
    await seed_two_tenants(redis, prefix)
    keys = Keys(prefix)
    before_b = await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns-b"))
    for value in ("*", "a|b", "@namespace:{ns-b}", "-ns-a"):
        resp = await client.delete(URL(f"/v1/users/{enc(value)}", encoded=True), headers=auth(KEY_A))
        assert resp.status == 202
    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="security")
    await worker.setup()
    while await worker.turn():
        pass
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns-b")) == before_b
    remaining = await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns-a"))
    assert remaining == len(HOSTILE) - 4
    for value in ("*", "a|b"):
        assert (
            await client.get(URL(f"/v1/episodes/{enc(value)}", encoded=True), headers=auth(KEY_A))
        ).status == 404
        assert (
            await client.get(URL(f"/v1/episodes/{enc(value)}", encoded=True), headers=auth(KEY_B))
        ).status == 200


def _stable(body: Any) -> Any:
    """A response with the fields that vary per call (instants, ids echoed back) removed."""
    if isinstance(body, dict):
        return {k: _stable(v) for k, v in body.items() if k not in ("as_of", "detail", "generation")}
    if isinstance(body, list):
        return [_stable(v) for v in body]
    return body


async def test_tenant_a_learns_nothing_of_b_on_any_route(make_client, settings, redis, prefix):
    """Every read of A over B's data answers exactly what a tenant with no data at all (C) gets."""
    client = await make_client(api_keys=THREE, metrics_key=METRICS_KEY)
    for i in range(8):  # a cluster B can consolidate into facts
        await put(
            redis,
            prefix,
            "ns-b",
            episode(
                f"b-{i}",
                task="rotate the database credentials nightly",
                agent_id="agent-b",
                user_id="user-b",
                category="ops",
                reward=0.9,
                strategy_used="iterative",
            ),
        )
    await wait_until(lambda: fully_indexed(redis, prefix), message="index backfill")
    made = await ok_json(await client.post("/v1/consolidate", json={}, headers=auth(KEY_B)))
    assert any(r["status"] == "published" for r in made["results"]), made
    facts_b = await ok_json(await client.post("/v1/facts/search", json={}, headers=auth(KEY_B)))
    assert facts_b["results"], "B must have a fact for this test to mean anything"
    fact_id = facts_b["results"][0]["fact_id"]

    task = {"task": "rotate the database credentials nightly"}
    reads = [
        ("POST", "/v1/recall", {"query": task["task"], "top_k": 100, "mode": "hybrid"}),
        ("POST", "/v1/recall", {"query": "rotate", "agent_id": "agent-b", "user_id": "user-b"}),
        ("POST", "/v1/context", task),
        ("POST", "/v1/strategy", {**task, "category": "ops"}),
        ("POST", "/v1/suggest", {**task, "category": "ops"}),
        ("GET", "/v1/skills", None),
        ("GET", "/v1/learning-curve", None),
        ("POST", "/v1/facts/search", {"query": task["task"]}),
        ("POST", "/v1/facts/search", {}),
        ("GET", "/v1/episodes/b-0", None),
        ("GET", "/v1/episodes/b-404", None),
        ("GET", f"/v1/facts/{fact_id}", None),
        ("GET", "/v1/facts/no-such-fact", None),
    ]
    for method, path, body in reads:
        answers = []
        for key in (KEY_A, KEY_C):
            resp = await client.request(method, path, json=body, headers=auth(key))
            answers.append((resp.status, _stable(await resp.json())))
        assert answers[0] == answers[1], (method, path, answers)
        assert "b-0" not in json.dumps(answers[0]) and "agent-b" not in json.dumps(answers[0])
    b0 = await (await client.get("/v1/episodes/b-0", headers=auth(KEY_A))).json()
    missing = await (await client.get("/v1/episodes/b-404", headers=auth(KEY_A))).json()
    assert b0["detail"].replace("b-0", "X") == missing["detail"].replace("b-404", "X")

    # writes by A never touch B: forgetting B's ids or B's user, consolidating A's namespace
    assert (await client.delete("/v1/episodes/b-0", headers=auth(KEY_A))).status == 404
    assert (await client.delete("/v1/users/user-b", headers=auth(KEY_A))).status == 202
    made_a = await ok_json(await client.post("/v1/consolidate", json={}, headers=auth(KEY_A)))
    assert all(r["status"] != "published" for r in made_a["results"])
    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="tenancy")
    await worker.setup()
    while await worker.turn():
        pass
    assert await count(redis, Keys(prefix).episode_index_alias, Scope(tags=BLAKE2B, namespace="ns-b")) == 8
    again = await ok_json(await client.post("/v1/facts/search", json={}, headers=auth(KEY_B)))
    assert [f["fact_id"] for f in again["results"]] == [f["fact_id"] for f in facts_b["results"]]
    metrics = await ok_json_text(await client.get("/metrics", headers=auth(METRICS_KEY)))
    assert "ns-b" not in metrics and "user-b" not in metrics and "agent-b" not in metrics


async def test_api_keys_never_logged(make_client, redis, prefix, caplog):
    caplog.set_level(logging.DEBUG)
    client = await make_client(api_keys=THREE, max_body_bytes=4096)
    await put(redis, prefix, "ns-a", episode("a-1"))
    calls = [
        ("POST", "/v1/recall", {"query": "x"}),
        ("POST", "/v1/recall", {"query": ""}),
        ("POST", "/v1/episodes", episode("a-2")),
        ("POST", "/v1/episodes", {"task": "x"}),
        ("GET", "/v1/episodes/a-1", None),
        ("GET", "/v1/episodes/none", None),
        ("DELETE", "/v1/episodes/a-1", None),
        ("GET", "/v1/skills?threshold=2", None),
        ("POST", "/v1/context", {"task": "x" * 10_000}),
        ("GET", "/nowhere", None),
        ("PATCH", "/v1/recall", None),
        ("POST", "/v1/consolidate", {}),
    ]
    for key in (KEY_A, KEY_B, KEY_A + "-wrong", f"{KEY_B} trailing", ""):
        for scheme in ("Bearer", "bearer", "Basic"):
            for method, path, body in calls:
                resp = await client.request(
                    method, path, json=body, headers={"Authorization": f"{scheme} {key}"}
                )
                text = await resp.text()
                assert resp.status < 500, (method, path, text)
                if key:
                    assert key not in text
    assert caplog.records, "nothing was logged: the assertion below would be vacuous"
    for key in (KEY_A, KEY_B):
        assert key not in caplog.text
        assert all(key not in json.dumps(getattr(r, "__dict__", {}), default=str) for r in caplog.records)


BODY_ROUTES = [
    "/v1/recall",
    "/v1/episodes",
    "/v1/context",
    "/v1/strategy",
    "/v1/suggest",
    "/v1/facts/search",
    "/v1/consolidate",
]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_bodies_over_the_limit_are_413_on_every_body_route(make_client, redis, prefix, chunked):
    client = await make_client(api_keys=THREE, max_body_bytes=2048)
    big = json.dumps({"query": "x" * 5000, "task": "y" * 5000}).encode()

    async def chunks():
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    for path in BODY_ROUTES:
        data = chunks() if chunked else big
        resp = await client.post(path, data=data, headers={**auth(KEY_A), "Content-Type": "application/json"})
        assert resp.status == 413, (path, await resp.text())
        assert resp.content_type == "application/problem+json"
    # nothing was published by the rejected ingest
    assert await redis.exists(Keys(prefix).stream) == 0


async def raw_http(client, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as raw bytes (aiohttp's client refuses some hostile headers) and read the answer."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        writer.write(request)
        await writer.drain()
        raw = await reader.read()  # the requests say Connection: close; error answers close anyway
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def get_with_auth(value: bytes, path: bytes = b"/v1/skills") -> bytes:
    return (
        b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + value + b"\r\n\r\n"
    )


@pytest.mark.parametrize(
    "value",
    [
        b"Bearer " + KEY_A.encode() + b"\xa0",  # a lone non-UTF-8 byte: a 500 with a traceback before
        b"Bearer \xa0" + KEY_A.encode(),
        b"Bearer " + KEY_A.encode() + b"\xff\xfe",
        b"Bearer \xe2\x80\x83"
        + KEY_A.encode()
        + b"\xe2\x80\x83",  # U+2003 padding, stripped and accepted before
        b"Bearer " + KEY_A.encode() + b"\xc2\xa0",  # U+00A0
        b"Bearer\xe2\x80\x83" + KEY_A.encode(),
        b"Bearer\xc2\xa0" + KEY_A.encode(),  # not an ASCII separator
    ],
    ids=["xa0", "lead-xa0", "xff", "em-space-pad", "nbsp", "em-space-sep", "nbsp-sep"],
)
async def test_keys_with_non_ascii_bytes_or_unicode_padding_are_401_without_a_traceback(
    make_client, caplog, value
):
    caplog.set_level(logging.DEBUG)
    client = await make_client(api_keys=THREE)
    status, headers, body = await raw_http(client, get_with_auth(value))
    assert status == 401, body
    assert headers["content-type"].startswith("application/problem+json")
    assert json.loads(body)["detail"] == "invalid API key"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    # the same key, sent as configured, still works; ASCII blanks separate and pad it as before
    for ok in (
        b"Bearer " + KEY_A.encode(),
        b"bearer\t" + KEY_A.encode() + b" \t",
        b"BEARER   " + KEY_A.encode(),
    ):
        assert (await raw_http(client, get_with_auth(ok)))[0] == 200, ok


async def test_query_embeddings_are_cached_per_tenant(make_client, settings):
    """A cache hit is faster than embedding: shared across tenants, it would tell A whether B recently
    asked exactly this text. Counted on the embedder, not timed."""
    embedder = TableEmbedder(settings.embed_dim)
    client = await make_client(embedder=embedder, api_keys=THREE)
    for i, (path, field) in enumerate(
        (("/v1/recall", "query"), ("/v1/facts/search", "query"), ("/v1/context", "task"))
    ):
        body = {field: f"rotate the database credentials of payments service {i}"}
        before = embedder.calls
        await ok_json(await client.post(path, json=body, headers=auth(KEY_B)))
        assert embedder.calls == before + 1, path
        await ok_json(await client.post(path, json=body, headers=auth(KEY_A)))  # B's entry is not A's
        assert embedder.calls == before + 2, path
        await ok_json(await client.post(path, json=body, headers=auth(KEY_A)))  # A's own entry: a hit
        await ok_json(await client.post(path, json=body, headers=auth(KEY_B)))
        assert embedder.calls == before + 2, path


KEY_LINE = b"Authorization: Bearer " + KEY_A.encode()
UNPARSEABLE = {
    # a control character in the key's own header, or in another one next to it: aiohttp's parser quoted
    # the raw line (the key) in an ERROR traceback and in the text/plain answer
    "nul-in-key": b"GET /v1/skills HTTP/1.1\r\nHost: x\r\n" + KEY_LINE + b"\x00\r\n\r\n",
    "vt-in-key": b"GET /v1/skills HTTP/1.1\r\nHost: x\r\n" + KEY_LINE + b"\x0b\r\n\r\n",
    "nul-next-to-key": b"GET /v1/skills HTTP/1.1\r\nHost: x\r\n" + KEY_LINE + b"\r\nX-Note: a\x00b\r\n\r\n",
    "vt-before-key": b"GET /v1/skills HTTP/1.1\r\nX-Note: a\x0bb\r\n" + KEY_LINE + b"\r\n\r\n",
    "url-too-long": b"GET /v1/skills?agent_id=" + b"a" * 9000 + b" HTTP/1.1\r\n" + KEY_LINE + b"\r\n\r\n",
    "header-too-long": b"GET /v1/skills HTTP/1.1\r\n" + KEY_LINE + b"\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
    "key-too-long": b"GET /v1/skills HTTP/1.1\r\n" + KEY_LINE + b"c" * 9000 + b"\r\n\r\n",
    "bad-request-line": b"GARBAGE " + KEY_A.encode() + b"\r\n" + KEY_LINE + b"\r\n\r\n",
    "bad-version": b"GET /v1/skills HTTP/9.Z\r\n" + KEY_LINE + b"\r\n\r\n",
    "tls-hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + KEY_A.encode(),
    "bad-header-name": b"GET /v1/skills HTTP/1.1\r\n" + KEY_LINE + b"\r\nBad Name: x\r\n\r\n",
}


@pytest.mark.parametrize("raw", UNPARSEABLE.values(), ids=UNPARSEABLE.keys())
async def test_unparseable_requests_get_a_terse_problem_and_never_log_the_key(make_client, caplog, raw):
    caplog.set_level(logging.DEBUG)
    client = await make_client(api_keys=THREE)
    status, headers, body = await raw_http(client, raw)
    assert status == 400, body
    assert headers["content-type"].startswith("application/problem+json"), headers
    answer = json.loads(body)
    assert answer["status"] == 400 and answer["title"] == "Malformed request", answer
    for leak in (KEY_A.encode(), b"aiohttp", b"\\x", b"bytearray", b"^"):
        assert leak not in body, (leak, body)
    records = [json.dumps(r.__dict__, default=str) for r in caplog.records]
    assert all(KEY_A not in r for r in records) and KEY_A not in caplog.text, caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    assert (await client.get("/v1/skills", headers=auth(KEY_A))).status == 200  # the service carries on


def test_credentials_are_redacted_from_whatever_aiohttp_still_logs(caplog):
    """Defence in depth: a line or traceback an aiohttp logger writes that quotes a request."""
    from services.query.server import install_log_redaction

    install_log_redaction()
    caplog.set_level(logging.DEBUG)
    try:
        raise ValueError(f"Invalid header value char: b'Authorization: Bearer {KEY_A}\\x00'")
    except ValueError:
        logging.getLogger("aiohttp.server").exception("Error handling %s", f"Bearer {KEY_B}")
    logging.getLogger("aiohttp.access").info("got %s", f"authorization:\t{KEY_A}")
    assert KEY_A not in caplog.text and KEY_B not in caplog.text, caplog.text
    assert "[redacted]" in caplog.text and "Error handling" in caplog.text


@pytest.mark.slow  # the service as a process
@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_the_service_process_logs_no_key_and_stops_on_sigterm(redis_url, prefix, tmp_path, log_format):
    """`python -m services.query` itself (serve(), not the test server), logging at DEBUG, in either
    ENGRAM_LOG_FORMAT: with `json` every line is one JSON object and the same redactions hold."""
    port, log_path = free_port(), tmp_path / "query.log"
    proc = spawn_query_service(
        redis_url,
        prefix,
        port,
        log_path,
        ENGRAM_EMBED_DIM="64",
        ENGRAM_API_KEYS=f"{KEY_A}=ns-a",
        ENGRAM_LOG_LEVEL="DEBUG",
        ENGRAM_LOG_FORMAT=log_format,
    )
    try:
        server = SimpleNamespace(host="127.0.0.1", port=port)

        async def ready() -> bool:
            assert proc.poll() is None, log_path.read_text()
            try:
                return (
                    await raw_http(
                        SimpleNamespace(server=server),
                        b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                    )
                )[0] == 200
            except OSError:
                return False

        await wait_until(ready, timeout=60, message="query service ready")
        client = SimpleNamespace(server=server)
        for raw in UNPARSEABLE.values():
            assert (await raw_http(client, raw))[0] == 400
        assert (await raw_http(client, get_with_auth(b"Bearer " + KEY_A.encode() + b"\xa0")))[0] == 401
        assert (await raw_http(client, get_with_auth(b"Bearer " + KEY_A.encode())))[0] == 200
        # ids in paths and query strings never reach the access log (a forgotten user's id did)
        for request in (
            b"DELETE /v1/users/SECRET-USER-path HTTP/1.1\r\n",
            b"GET /v1/learning-curve?user_id=SECRET-USER-query HTTP/1.1\r\n",
            b"GET /v1/episodes/SECRET-EPISODE HTTP/1.1\r\n",
            b"GET /no/SECRET-ROUTE HTTP/1.1\r\n",
        ):
            status = (
                await raw_http(
                    client,
                    request
                    + b"Host: x\r\nAuthorization: Bearer "
                    + KEY_A.encode()
                    + b"\r\nConnection: close\r\n\r\n",
                )
            )[0]
            assert status in (200, 202, 404), (request, status)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    text = log_path.read_text(errors="replace")
    assert code == 0, text
    assert KEY_A not in text and "Traceback" not in text and "SECRET-" not in text, text
    if log_format == "json":
        records = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
        for r in records:
            assert {"time", "level", "logger", "message"} <= set(r), r
            assert r["time"].endswith("+00:00") and "T" in r["time"], r  # UTC ISO 8601
        access = [r for r in records if r["logger"] == "aiohttp.access"]
        assert {"/v1/users/{user_id}", "/v1/learning-curve", "<no route>"} <= {r["route"] for r in access}
        assert all(set(r) >= {"remote", "method", "status", "bytes", "duration_ms"} for r in access)
        text = "\n".join(f"{r['logger']} {r['message']}" for r in records)  # the text checks below
    assert "listening on" in text and "aiohttp.access" in text, text  # it did log, at DEBUG
    assert KEY_A not in text and "Traceback" not in text, text
    assert "SECRET-" not in text, text
    assert '"DELETE /v1/users/{user_id}" 202' in text and '"GET /v1/learning-curve" 200' in text, text
    assert '"GET <no route>" 404' in text, text


async def test_metrics_need_the_metrics_key_when_api_keys_are_set(make_client):
    """/metrics counts every namespace's traffic: a tenant's key must not read it (it was public)."""
    client = await make_client(api_keys=THREE, metrics_key=METRICS_KEY)
    await ok_json(await client.post("/v1/recall", json={"query": "x"}, headers=auth(KEY_B)))
    text = await ok_json_text(await client.get("/metrics", headers=auth(METRICS_KEY)))
    assert 'route="/v1/recall",status="200"} 1.0' in text
    for headers, status in (
        ({}, 401),
        (auth(KEY_A), 403),
        (auth(KEY_B), 403),
        (auth(METRICS_KEY + "x"), 401),
        (auth(f"\u2003{METRICS_KEY}"), 401),
        ({"Authorization": f"Basic {METRICS_KEY}"}, 401),
    ):
        resp = await client.get("/metrics", headers=headers)
        body = await resp.json()
        assert (resp.status, resp.content_type) == (status, "application/problem+json"), (headers, body)
        assert "engram_http" not in json.dumps(body)
    # the metrics key is no API key: it reads no namespace
    assert (await client.post("/v1/recall", json={"query": "x"}, headers=auth(METRICS_KEY))).status == 401
    # without a metrics key configured nobody reads them; single-tenant dev mode keeps them open
    closed = await make_client(api_keys=THREE)
    assert (await closed.get("/metrics", headers=auth(KEY_A))).status == 403
    assert (await closed.get("/metrics")).status == 401
    dev = await make_client()
    assert "engram_http_requests_total" in await ok_json_text(await dev.get("/metrics"))
