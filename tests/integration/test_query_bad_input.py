"""Inputs that used to give 500s: deep nesting, lone surrogates, huge integers.

Each must be a 4xx naming where the problem is, through HTTP and through the SDK alike.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import quote

import pytest

from deploy.embedded_redis import free_port
from engram_episodic.errors import InvalidEpisode
from shared.sdk import EngramClient
from tests.helpers import spawn_query_service, wait_until

pytest_plugins = ["tests.integration.test_query_support"]
ROOT = Path(__file__).resolve().parents[2]

EP = '{"task": "t", "outcome": "success", %s}'
NESTED: list = [1]
for _ in range(40):
    NESTED = [NESTED]


async def post(client, path: str, raw: str):
    resp = await client.post(path, data=raw.encode(), headers={"Content-Type": "application/json"})
    return resp.status, await resp.json()


def fields(body) -> dict[str, str]:
    return {e["field"]: e["reason"] for e in body.get("errors", [])}


@pytest.mark.parametrize(
    "raw, status, field, reason",
    [
        (EP % ('"metadata": ' + '{"a":' * 500 + "1" + "}" * 500), 422, "metadata", "nested deeper"),
        ("[" * 5000 + "]" * 5000, 400, None, "nested too deeply"),
        ('{"query": "\\ud800"}', 422, "query", "lone surrogate"),
        (EP % '"agent_id": "\\udc00"', 422, "agent_id", "lone surrogate"),
        ('{"task": "bad \\ud800 text", "outcome": "success"}', 422, "task", "lone surrogate"),
        (EP % '"metadata": {"k": 1000000000000000000000000000000}', 422, "metadata.k", "64-bit"),
        (EP % ('"importance": ' + "9" * 300), 422, "importance", "64-bit"),
        (EP % ('"iterations": ' + "9" * 5000), 400, None, "too many digits"),
    ],
)
async def test_bad_inputs_are_4xx_naming_the_field(make_client, raw, status, field, reason):
    client = await make_client()
    path = "/v1/recall" if raw.startswith('{"query"') else "/v1/episodes"
    got, body = await post(client, path, raw)
    assert got == status, body
    if field is None:
        assert reason in body["detail"]
    else:
        found = {k: v for k, v in fields(body).items() if k == field or k.startswith(field + ".")}
        assert found and all(reason in v for v in found.values()), body
    ok, _ = await post(client, "/v1/recall", '{"query": "still alive"}')
    assert ok == 200


@pytest.mark.parametrize(
    "episode, field",
    [
        ({"task": "bad \ud800 text"}, "task.description"),
        ({"task": "t", "agent_id": "\udc00"}, "agent_id"),
        ({"task": "t", "metadata": {"k": 10**30}}, "metadata.k"),
        ({"task": "t", "context": {"deep": NESTED}}, "context.deep"),
        ({"task": "t", "importance": 10**400}, "importance"),
    ],
)
async def test_sdk_raises_invalid_episode_not_a_raw_error(redis, prefix, episode, field):
    client = EngramClient(redis, namespace="ns", prefix=prefix)
    with pytest.raises(InvalidEpisode) as info:
        await client.record({**episode, "outcome": "success"})
    assert any(path.startswith(field) for path, _ in info.value.errors), info.value.errors


async def test_own_vector_of_the_wrong_dimension_is_422_at_ingest(make_client, settings):
    client = await make_client()
    resp = await client.post(
        "/v1/episodes",
        json={
            "episodes": [
                {"task": "ok", "outcome": "success", "vector": [0.5] * settings.embed_dim},
                {"task": "bad", "outcome": "success", "vector": [1.0, 2.0, 3.0]},
            ]
        },
    )
    body = await resp.json()
    assert resp.status == 422, body
    assert fields(body) == {
        "episodes[1].vector": f"has 3 dimensions; this index expects {settings.embed_dim}"
    }


async def test_a_range_that_is_not_an_object_names_no_internal_class(api):
    resp = await api.post("/v1/recall", json={"query": "x", "reward": 5})
    assert resp.status == 422
    body = await resp.json()
    assert {"field": "reward", "reason": "must be a JSON object"} in body["errors"]
    assert "NumRange" not in json.dumps(body)


async def test_ids_with_edge_whitespace_are_refused_everywhere(api):
    """RediSearch trims TAG values: ' lead' would match 'lead', so a forget could erase another user."""
    resp = await api.delete("/v1/users/%20lead")
    assert resp.status == 422 and "whitespace" in json.dumps(await resp.json())
    resp = await api.post("/v1/recall", json={"query": "x", "agent_id": "trail "})
    assert resp.status == 422 and "agent_id" in json.dumps(await resp.json())
    resp = await api.post("/v1/episodes", json={"task": "t", "user_id": " lead"})
    assert resp.status == 422 and "user_id" in json.dumps(await resp.json())


# instants an offset carries past the calendar once in UTC: they used to be a 500 on recall and facts
# search (formatting `as_of` back), and accepted on ingest only to be dead-lettered by the consolidator
PAST_THE_CALENDAR = ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", 253402300800]


@pytest.mark.parametrize("instant", PAST_THE_CALENDAR)
@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/recall", {"query": "x"}, "as_of"),
        ("/v1/recall", {"query": "x"}, "since"),
        ("/v1/recall", {"query": "x"}, "until"),
        ("/v1/facts/search", {}, "as_of"),
        ("/v1/facts/search", {}, "since"),
        ("/v1/facts/search", {}, "until"),
    ],
)
async def test_instants_outside_the_calendar_are_422_on_queries(api, path, body, field, instant):
    resp = await api.post(path, json={**body, field: instant})
    got = await resp.json()
    assert resp.status == 422, got
    assert field in fields(got) and "outside years 1..9999" in fields(got)[field], got


@pytest.mark.parametrize("instant", PAST_THE_CALENDAR)
async def test_instants_outside_the_calendar_are_422_on_ingest(api, redis, prefix, instant):
    from shared.keys import Keys

    resp = await api.post(
        "/v1/episodes",
        json={
            "episodes": [
                {"task": "t", "outcome": "success", "completed_at": instant},
                {"task": "t", "outcome": "success", "started_at": instant},
                {
                    "task": "t",
                    "outcome": "success",
                    "actions": [{"action_type": "edit", "timestamp": instant}],
                },
            ]
        },
    )
    got = await resp.json()
    assert resp.status == 422, got
    assert set(fields(got)) == {
        "episodes[0].completed_at",
        "episodes[1].started_at",
        "episodes[2].actions[0].timestamp",
    }, got
    assert all("outside years 1..9999" in reason for reason in fields(got).values())
    assert await redis.exists(Keys(prefix).stream) == 0  # nothing published, nothing to dead-letter


# query-string numbers: int() and float() took whitespace and any script's digits ("１" was a threshold
# of 1.0, "١٠" a window of 10) and int() failed on "²" with Python's own message
@pytest.mark.parametrize(
    "path, field",
    [
        ("/v1/skills?threshold=%EF%BC%91", "threshold"),
        ("/v1/skills?threshold=%200.5", "threshold"),
        ("/v1/skills?threshold=0.5%20", "threshold"),
        ("/v1/skills?threshold=NaN", "threshold"),
        ("/v1/skills?threshold=", "threshold"),
        ("/v1/skills?threshold=1e999", "threshold"),
        ("/v1/skills?threshold=0_5", "threshold"),
        ("/v1/learning-curve?window=%D9%A1%D9%A0", "window"),
        ("/v1/learning-curve?window=%205", "window"),
        ("/v1/learning-curve?limit=%C2%B2", "limit"),
        ("/v1/learning-curve?limit=" + "9" * 5000, "limit"),
        ("/v1/skills?=x", "<query>"),
        ("/v1/skills?threshold=0.5&threshold=0.6", "threshold"),
    ],
)
async def test_query_parameters_are_ascii_numbers_or_a_422_naming_them(api, path, field):
    resp = await api.get(path)
    got = await resp.json()
    assert resp.status == 422, got
    assert list(fields(got)) == [field], got
    assert "int()" not in json.dumps(got) and "literal" not in json.dumps(got)


@pytest.mark.parametrize(
    "query, threshold",
    [
        ("threshold=1e-5", 1e-5),
        ("threshold=.5", 0.5),
        ("threshold=1", 1.0),
        ("threshold=0.25", 0.25),
        ("threshold=0E0", 0.0),
    ],
)
async def test_query_numbers_spelled_as_numbers_are_accepted(api, query, threshold):
    resp = await api.get(f"/v1/skills?{query}")
    assert resp.status == 200 and (await resp.json())["threshold"] == threshold


@pytest.mark.parametrize(
    "raw_path",
    [
        "/v1/episodes/%FF%FE",  # a path id: left undecoded, it would be the id "%FF%FE" (= %25FF%25FE)
        "/v1/episodes/ok%C3",  # a cut multi-byte character
        "/v1/episodes?agent_id=%FF%FE",  # a query value: decoded to U+FFFD, %FF and %FE would be one id
        "/v1/learning-curve?agent_id=a%80b",
    ],
)
async def test_percent_escapes_that_are_not_utf8_are_a_400(api, raw_path):
    from yarl import URL

    resp = await api.get(URL(raw_path, encoded=True))
    assert resp.status == 400, await resp.text()
    assert "not UTF-8" in (await resp.json())["detail"]


async def test_utf8_escapes_and_escaped_percent_signs_are_ids_as_usual(api):
    for eid in ("é-ü", "%FF%FE", "50%"):  # the second and third: literal percent signs, sent escaped
        resp = await api.post("/v1/episodes", json={"episode_id": eid, "task": "t", "outcome": "success"})
        assert resp.status == 202, await resp.text()
        resp = await api.get(f"/v1/episodes/{quote(eid, safe='')}")
        assert resp.status == 200, (eid, await resp.text())


# --- trailing slashes, empty ids, options a route does not take --------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "body", "location"),
    [
        ("POST", "/v1/recall/", {"query": "flaky login"}, "../recall"),
        ("GET", "/v1/skills/?agent_id=a", None, "../skills?agent_id=a"),
        ("POST", "/v1/facts/search/", {"query": "x"}, "../search"),  # `/v1/facts/{fact_id}` is GET only
        ("POST", "/v1/forget/", {"episode_ids": ["e"]}, "../forget"),  # `/v1/forget/{job_id}` is GET only
        ("POST", "/v1/episodes/", {"task": "t", "outcome": "success"}, "../episodes"),
        ("GET", "/healthz/", None, "../healthz"),
        ("GET", "/openapi.json/", None, "../openapi.json"),
    ],
)
async def test_a_trailing_slash_is_a_308_to_the_route_keeping_method_and_body(
    api, method, path, body, location
):
    """They were 404s. 308 (not 301) so a client resends the same method and body; relative, so a path
    prefix a proxy added stays."""
    resp = await api.request(method, path, json=body, allow_redirects=False)
    assert resp.status == 308 and resp.headers["Location"] == location, await resp.text()
    followed = await api.request(method, path, json=body)
    answer = await followed.json()
    # the route's own answer (`POST /v1/forget` of an unknown id is its documented 404), not "no route"
    assert followed.url.path == path.partition("?")[0].rstrip("/")
    assert followed.status in (200, 202) or "none of these episodes" in answer["detail"], (path, answer)


async def test_a_redirected_post_is_the_same_call(api):
    followed = await api.post("/v1/recall/", json={"query": "flaky login", "top_k": 2})
    assert followed.status == 200 and "results" in await followed.json()
    # redirected only to a route of the same method: GET /v1/recall is none
    wrong = await api.get("/v1/recall/", allow_redirects=False)
    assert wrong.status == 404 and "Location" not in wrong.headers
    for unknown in ("/v1/nothing/", "/docs//", "/v1//episodes"):
        assert (await api.get(unknown, allow_redirects=False)).status == 404, unknown


EMPTY_ID_ROUTES = [
    ("GET", "/v1/episodes/", "episode_id"),
    ("PATCH", "/v1/episodes/", "episode_id"),
    ("DELETE", "/v1/episodes/", "episode_id"),
    ("DELETE", "/v1/users/", "user_id"),
    ("DELETE", "/v1/agents/", "agent_id"),
    ("DELETE", "/v1/sessions/", "session_id"),
    ("GET", "/v1/forget/", "job_id"),
    ("GET", "/v1/facts/", "fact_id"),
]


@pytest.mark.parametrize(("method", "path", "field"), EMPTY_ID_ROUTES)
async def test_an_empty_path_id_is_a_422_naming_it(api, method, path, field):
    """`DELETE /v1/agents/` was a bare 404 (no route); a blank id (`%20`) was already a 422."""
    body = {"importance": 3} if method == "PATCH" else None
    resp = await api.request(method, path, json=body, allow_redirects=False)
    assert resp.status == 422, await resp.text()
    assert [e["field"] for e in (await resp.json())["errors"]] == [field]


@pytest.mark.parametrize(("method", "path", "field"), [(m, p, f) for m, p, f in EMPTY_ID_ROUTES])
async def test_an_id_holding_a_newline_reaches_its_handler(api, method, path, field):
    """schemathesis found `DELETE /v1/sessions/%0A%3B...` a 404: the route pattern's `.` stopped at the decoded
    newline, so no route matched; the handler refuses the control character with a 422 naming the id."""
    body = {"importance": 3} if method == "PATCH" else None
    resp = await api.request(method, path + "a%0Ab", json=body, allow_redirects=False)
    assert resp.status == 422, await resp.text()
    assert [e["field"] for e in (await resp.json())["errors"]] == [field]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "/v1/agents/a?dry_run=1", None),
        ("DELETE", "/v1/episodes/e?dry_run=1", None),
        ("DELETE", "/v1/users/u?dry_run=1", None),
        ("POST", "/v1/forget?dry_run=1", {"episode_ids": ["e"]}),
        ("POST", "/v1/recall?dry_run=1", {"query": "q"}),
        ("GET", "/v1/facts/f?dry_run=1", None),
        ("GET", "/v1/forget/j?dry_run=1", None),
    ],
)
async def test_a_query_parameter_a_route_does_not_take_is_a_422_and_nothing_is_published(
    api, redis, prefix, method, path, body
):
    """They were ignored: `DELETE /v1/agents/a?dry_run=1` forgot the agent's episodes."""
    from shared.keys import Keys

    resp = await api.request(method, path, json=body)
    assert resp.status == 422, await resp.text()
    assert (await resp.json())["errors"] == [{"field": "dry_run", "reason": "is not a known query parameter"}]
    assert not await redis.exists(Keys(prefix).stream)


async def _raw_request(host: str, port: int, path: str, *, declared: int, sent: bytes):
    """A POST whose body stops short of its Content-Length: (reader, writer) of the open connection.
    It asks `Expect: 100-continue` and sends the body once the service answered `100 Continue`, i.e.
    once the request reached its handler (so a close after that is a close mid-body)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
        f"Content-Length: {declared}\r\n\r\n".encode()
    )
    await writer.drain()
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 100")
    writer.write(sent)
    await writer.drain()
    return reader, writer


async def test_a_body_that_never_finishes_is_a_408_that_closes_the_connection(make_client):
    """A body that stops short of its Content-Length must not hold a connection (it held one 200 s)."""
    client = await make_client(body_timeout=0.5)
    reader, writer = await _raw_request(client.host, client.port, "/v1/recall", declared=100, sent=b'{"q')
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(
        next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")).split(b":")[1]
    )
    body = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
    writer.close()
    assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head, head
    assert body["detail"] == "the request body did not arrive within 0.5 s"


@pytest.mark.timeout(120)
async def test_a_client_gone_mid_body_is_not_a_server_error(redis_url, prefix, tmp_path):
    """A client that closed the socket mid-body made `python -m services.query` log an unhandled
    error and answer 500 (the test server cancels such a handler instead, so this runs the process).
    It is the client's doing: one INFO line and a 400, whether the client closes or resets."""
    port, log = free_port(), tmp_path / "query.log"
    proc = spawn_query_service(redis_url, prefix, port, log, ENGRAM_EMBED_DIM="64", ENGRAM_METRICS_PORT="0")
    try:
        await wait_until(lambda: "query service ready" in log.read_text(), timeout=60, message="ready")
        for n, path in enumerate(("/v1/recall", "/v1/episodes", "/v1/context"), start=1):
            reader, writer = await _raw_request("127.0.0.1", port, path, declared=100, sent=b'{"task": ')
            if n % 2:
                writer.close()
            else:
                writer.transport.abort()
            await wait_until(
                lambda n=n: log.read_text().count("client closed the connection mid-body") >= n,
                message=f"request {n} handled",
            )
        text = log.read_text()
        assert text.count('" 400 ') >= 3, text
        assert "unhandled error" not in text and " ERROR " not in text and '" 500 ' not in text, text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_two_authorization_headers_are_refused_whatever_their_order(make_client):
    """A request with two keys was answered for the first one's tenant: it is refused instead."""
    key_a, key_b = "key-a-0123456789abcdef", "key-b-0123456789abcdef"
    client = await make_client(api_keys={key_a: "ns-a", key_b: "ns-b"})
    for first, second in ((key_a, key_b), (key_b, key_a), (key_a, key_a)):
        headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]
        resp = await client.get("/v1/skills", headers=headers)
        assert resp.status == 400, await resp.text()
        assert "one Authorization header" in (await resp.json())["detail"]
    assert (await client.get("/v1/skills", headers={"Authorization": f"Bearer {key_a}"})).status == 200
