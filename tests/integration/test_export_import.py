"""`engram export` / `engram import`: a namespace through JSONL into a fresh stack recalls the same."""

from __future__ import annotations

import json
import uuid

from shared import streams
from shared.codec import peek_identity
from shared.keys import Keys
from tests.integration.test_cli_admin import BAR
from tests.integration.test_query_cli import run
from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import KEY_A, KEY_B, auth
from tests.integration.test_reliability import running_worker

pytest_plugins = ["tests.integration.test_query_support"]

AS_OF = "2026-06-01T00:00:00Z"
QUERIES = ["renew the tls certificate", "migrate the orders table", "flaky login test"]


def batch() -> list[dict]:
    tasks = [
        ("renew the tls certificate of host {i}", "ops", "success"),
        ("migrate the orders table shard {i}", "db", "failure"),
        ("fix the flaky login test number {i}", "testing", "partial"),
    ]
    out = []
    for i in range(12):
        text, category, outcome = tasks[i % 3]
        out.append(
            {
                "episode_id": f"ep-{i}",
                "task": {"description": text.format(i=i), "category": category},
                "outcome": outcome,
                "agent_id": f"agent-{i % 2}",
                "user_id": f"user-{i % 4}",
                "session_id": f"s-{i % 3}",
                "started_at": 1_770_000_000 + 3600 * i,
                "completed_at": 1_770_000_000 + 3600 * i + 120,
                "feedback": {
                    "reward": (i % 5) / 4,
                    "message": f"note {i}",
                    "tests_passed": i,
                    "tests_total": 12,
                },
                "importance": 1 + i % 10,
                "metadata": {"n": i, "tags": ["a", "b"]},
                "actions": [
                    {"action_type": "run", "input": f"cmd {i}", "timestamp": 1_770_000_000 + 3600 * i + 60},
                ],
                "solution": f"solution {i}",
            }
        )
    return out


async def recalls(api, key):
    out = []
    for q in QUERIES:
        body = {"query": q, "top_k": 10, "as_of": AS_OF}
        resp = await api.post("/v1/recall", json=body, headers=auth(key))
        assert resp.status == 200, await resp.text()
        out.append([(r["episode"], round(r["priority"], 9)) for r in (await resp.json())["results"]])
    return out


async def test_export_then_import_into_a_fresh_stack_recalls_the_same(make_client, settings, redis, tmp_path):
    source = await make_client(api_keys={KEY_A: "team-a"})
    await source.post("/v1/episodes", json={"episodes": batch()}, headers=auth(KEY_A))
    await drain(settings, redis)
    before = await recalls(source, KEY_A)
    assert all(before)

    file = tmp_path / "memory.jsonl"
    out = await run(source, "export", "--out", str(file), key=KEY_A)
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
    assert [e["episode_id"] for e in lines] == [f"ep-{i}" for i in range(12)]  # oldest first
    assert lines[3]["actions"][0]["timestamp"] == 1_770_000_000 + 3600 * 3 + 60  # epoch s, exact
    assert lines[3]["completed_at"] == 1_770_000_000 + 3600 * 3 + 120
    one_user = await run(source, "export", "--user-id", "user-1", key=KEY_A)
    assert [json.loads(x)["episode_id"] for x in one_user.stdout.splitlines()] == ["ep-1", "ep-5", "ep-9"]

    # a fresh stack: another prefix (its own stream, index, documents), another namespace
    fresh = settings.with_(prefix=f"t{uuid.uuid4().hex[:10]}:")
    try:
        target = await make_client(prefix=fresh.prefix, api_keys={KEY_B: "team-b"})
        for flag in ("--progress", "--no-progress"):  # importing twice changes nothing
            out = await run(target, "import", str(file), flag, key=KEY_B)
            assert out.exit_code == 0, out.output
            await drain(fresh, redis)
            bars = [m.groups() for m in BAR.finditer(out.stderr)]
            assert (("12", "12") in bars) == (flag == "--progress"), out.stderr  # rate and ETA drawn
        assert "imported 12 episodes" in out.output
        after = await recalls(target, KEY_B)
        assert after == before
        listed = await (await target.get("/v1/episodes", params={"limit": 100}, headers=auth(KEY_B))).json()
        assert len(listed["results"]) == 12
        assert await redis.xlen(Keys(fresh.prefix).stream) == 24  # two imports, one event per episode each
        assert len(await streams.read_range(redis, Keys(fresh.prefix).stream)) == 24
    finally:
        for name in await redis.execute_command("FT._LIST"):
            if name.decode().startswith(fresh.prefix):
                await redis.execute_command("FT.DROPINDEX", name)
        async for key in redis.scan_iter(match=f"{fresh.prefix}*", count=1000):
            await redis.unlink(key)


async def test_import_names_a_bad_line(api, tmp_path):
    file = tmp_path / "bad.jsonl"
    file.write_text('{"task": "ok", "outcome": "success"}\nnot json\n', encoding="utf-8")
    out = await run(api, "import", str(file))
    assert out.exit_code == 1 and "bad.jsonl:2 is not JSON" in out.output
    file.write_text('{"task": "ok", "outcome": "great"}\n', encoding="utf-8")
    out = await run(api, "import", str(file))
    assert out.exit_code == 1 and "outcome" in out.output
    file.write_bytes(b'{"task": "ok", "outcome": "success"}\n\xff\xfe\n')
    out = await run(api, "import", str(file))
    assert out.exit_code == 1 and "bad.jsonl:2 is not UTF-8" in out.output and "Traceback" not in out.output


async def test_import_checks_every_line_before_it_sends_any(api, settings, redis, tmp_path):
    """An episode too large for one request on line 604 was named `episodes[103]` (its
    place in the second batch of 500), after the first 500 lines were published. Every line is now
    checked first and named by its line, an episode_id on two lines too, and nothing is sent."""
    good = [{"episode_id": f"g{i}", "task": "t", "outcome": "success"} for i in range(600)]
    lines = [json.dumps(e) for e in good]
    lines.append(
        json.dumps({"episode_id": "huge", "task": "t", "outcome": "success", "solution": "x" * 70_000})
    )
    lines.append(json.dumps({"episode_id": "g7", "task": "again", "outcome": "success"}))
    lines.insert(300, json.dumps({"task": "t", "outcome": "great"}))
    file = tmp_path / "mixed.jsonl"
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = await run(api, "--max-body-bytes", "65536", "import", str(file), "--no-progress")
    assert out.exit_code == 1, out.output
    assert "nothing imported" in out.output
    assert "mixed.jsonl:301: outcome: must be one of" in out.output
    assert "mixed.jsonl:602: solution: is 70,002 bytes" in out.output
    assert "mixed.jsonl:603: episode_id 'g7' is on line 8 too" in out.output
    await drain(settings, redis)
    assert await redis.xlen(Keys(settings.prefix).stream) == 0


async def test_import_splits_by_the_body_limit_and_round_trips_exactly(
    make_client, settings, redis, tmp_path
):
    """`engram import` sent 500 episodes per request whatever their size (413 on a
    6 MB export), an episode grown past one body over re-posts could not be imported at all, and
    actions without an `action_id` came back twice (their timestamps read back rounded to µs). Now
    import sends requests of at most --max-body-bytes, such an episode in parts, and exporting the
    imported namespace gives the same lines, twice imported."""
    limit = 64 * 1024
    api = await make_client(api_keys={KEY_A: "team-a", KEY_B: "team-b"}, max_body_bytes=limit)
    big = "\u4e2d" * 7_000  # 21,000 bytes of UTF-8 per field
    grown = {"episode_id": "grown", "task": "a task that grew", "outcome": "success", "user_id": "u1"}
    anonymous = [
        {"action_type": "run", "input": f"step {i}", "timestamp": 1_770_000_000.1234567 + i} for i in range(3)
    ]
    posts = [
        {**grown, "solution": big, "actions": anonymous},
        {**grown, "thoughts": big},
        {**grown, "observation": big, "actions": anonymous},  # the same actions again: no copies
        {**grown, "result": big},
    ]
    for body in posts:
        assert (await api.post("/v1/episodes", json=body, headers=auth(KEY_A))).status == 202
    many = [
        {"episode_id": f"m{i}", "task": f"task {i}", "outcome": "success", "solution": "s" * 2_000}
        for i in range(60)  # ~125 KB together: more than one request
    ]
    for half in (many[:30], many[30:]):
        assert (await api.post("/v1/episodes", json={"episodes": half}, headers=auth(KEY_A))).status == 202
    await drain(settings, redis)

    source, copy = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert (await run(api, "export", "--out", str(source), key=KEY_A)).exit_code == 0
    exported = source.read_text(encoding="utf-8")
    assert len(exported.encode()) > limit
    [line] = [json.loads(x) for x in exported.splitlines() if '"grown"' in x]
    assert len(line["actions"]) == 3 and len(json.dumps(line, ensure_ascii=False).encode()) > limit
    for key in (KEY_B, KEY_B, KEY_A):  # importing twice changes nothing, nor importing into the source
        out = await run(api, "--max-body-bytes", str(limit), "import", str(source), "--no-progress", key=key)
        assert out.exit_code == 0, out.output
        assert "imported 61 episodes" in out.output
        await drain(settings, redis)
    assert (await run(api, "export", "--out", str(copy), key=KEY_B)).exit_code == 0
    # the same lines (episodes of equal completed_at may list in another order: ties go by a digest of
    # the namespace's document key)
    assert sorted(copy.read_text(encoding="utf-8").splitlines()) == sorted(exported.splitlines())
    assert (await run(api, "export", "--out", str(copy), key=KEY_A)).exit_code == 0
    assert copy.read_text(encoding="utf-8") == exported

    # a client set above the service's limit takes the limit the service's 413 names, and goes on
    out = await run(api, "import", str(source), "--no-progress", key=KEY_B)
    assert out.exit_code == 0 and "imported 61 episodes" in out.output, out.output
    resp = await api.post("/v1/episodes", data=b"[" + b"1," * limit + b"1]", headers=auth(KEY_B))
    problem = await resp.json()
    assert resp.status == 413 and problem["max_body_bytes"] == limit, problem
    assert "ENGRAM_MAX_BODY_BYTES" in problem["detail"]


async def test_import_names_every_bad_line_and_where_a_refused_batch_is(api, tmp_path):
    """Import stopped at the first line that is not JSON (the next bad one showed only once it
    was fixed), and a batch the service refused (a vector of another dimension, which only the service
    knows) was named `episodes[24]` of one request, with no word of what was imported."""
    file = tmp_path / "two.jsonl"
    file.write_text('{"task": "ok", "outcome": "success"}\nnot json\n[1]\n', encoding="utf-8")
    out = await run(api, "import", str(file))
    assert (
        out.exit_code == 1
        and "two.jsonl:2 is not JSON" in out.output
        and "two.jsonl:3 is not an episode" in out.output
    )
    lines = [json.dumps({"episode_id": f"v{i}", "task": "t", "outcome": "success"}) for i in range(30)]
    lines[20] = json.dumps({"episode_id": "v20", "task": "t", "outcome": "success", "vector": [0.5] * 7})
    file = tmp_path / "vector.jsonl"
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = await run(api, "import", str(file), "--no-progress")
    assert out.exit_code == 1 and "vector" in out.output
    assert "imported 0 of 30 episodes; the error is in the batch of lines 1-30 of" in out.output, out.output


async def test_a_forgotten_episode_id_is_not_published_again_by_an_import_or_a_post(
    make_client, settings, redis, tmp_path
):
    """Export, forget two episodes, import the export back: it said "imported 12 episodes", the
    two went back into the stream (text and all) and the consolidator dropped them unseen. The import
    now says which episodes were forgotten, publishes nothing of them, and exits 1 (it exited 0) as
    `engram publish` does: an episode of the file is not in the stack."""
    api = await make_client(api_keys={KEY_A: "team-a"})
    await api.post("/v1/episodes", json={"episodes": batch()}, headers=auth(KEY_A))
    await drain(settings, redis)
    file = tmp_path / "memory.jsonl"
    assert (await run(api, "export", "--out", str(file), key=KEY_A)).exit_code == 0
    for gone in ("ep-3", "ep-7"):
        resp = await api.delete(f"/v1/episodes/{gone}", headers=auth(KEY_A))
        assert resp.status == 202, await resp.text()
    await drain(settings, redis)
    stream = Keys(settings.prefix).stream
    last = (await redis.xrevrange(stream, count=1))[0][0]

    async def published_since() -> list[str]:
        """The episode ids of the events published after the forgets."""
        entries = await streams.read_range(redis, stream, start=b"(" + last, count=10_000)
        return [ident[1] for e in entries if e.payload and (ident := peek_identity(e.payload))]

    out = await run(api, "import", str(file), key=KEY_A)
    assert out.exit_code == 1, out.output
    assert "imported 10 episodes; 2 were not, as the episode_id was forgotten here before" in out.output
    assert "ep-3, ep-7" in out.output
    assert sorted(await published_since()) == sorted(f"ep-{i}" for i in range(12) if i not in (3, 7))
    # for scripts; and a file saved with a byte-order mark (an editor's) reads the same
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + "\n".join(file.read_text().splitlines()[3:4]).encode())
    out = await run(api, "import", str(bom), "--json", key=KEY_A)
    assert out.exit_code == 1, out.output
    assert json.loads(out.stdout) == {"imported": 0, "forgotten": ["ep-3"], "expired": []}
    assert "imported 0 episodes; 1 was not, as the episode_id was forgotten" in out.output
    async with running_worker(settings, "importer"):  # --wait: the two are not a timeout of the import
        out = await run(api, "import", str(file), "--wait", "20", key=KEY_A)
    assert out.exit_code == 1, out.output
    assert "imported 10 episodes; 2 were not" in out.output
    assert {"ep-3", "ep-7"}.isdisjoint(await published_since()) and len(await published_since()) == 20

    resp = await api.post("/v1/episodes", json=batch()[3], headers=auth(KEY_A))
    body = await resp.json()
    assert resp.status == 202 and body["accepted"] == 0 and body["forgotten"] == 1, body
    assert body["event_id"] is None and body["reason"] == "forgotten" and body["projected"] is False
    # with ?wait= at once (nothing to wait for), and the same answer
    resp = await api.post("/v1/episodes?wait=30", json={"episodes": batch()[7:8]}, headers=auth(KEY_A))
    body = await resp.json()
    assert [r["reason"] for r in body["results"]] == ["forgotten"] and body["projected"] is False, body
    assert {"ep-3", "ep-7"}.isdisjoint(await published_since()) and len(await published_since()) == 20
    # a JSON list of episodes is published as one request; a JSONL file is pointed to `engram import`
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(batch()[6:8]), encoding="utf-8")
    out = await run(api, "publish", str(listed), key=KEY_A)
    assert out.exit_code == 1 and "accepted ep-6" in out.output and "not published ep-7" in out.output
    out = await run(api, "publish", str(file), key=KEY_A)
    assert out.exit_code != 0 and "(one episode per line is JSONL: `engram import` reads it)" in out.output
    await drain(settings, redis)
    assert (await api.get("/v1/episodes/ep-3", headers=auth(KEY_A))).status == 404
    one = tmp_path / "one.json"
    one.write_text(json.dumps(batch()[7]), encoding="utf-8")
    out = await run(api, "publish", str(one), key=KEY_A)
    assert "not published ep-7: it was forgotten before" in out.output, out.output
    latin1 = tmp_path / "latin1.json"  # a file that is not UTF-8: one line naming it, no traceback
    latin1.write_bytes(b'{"episode_id": "bad\xff", "task": "x", "outcome": "success"}')
    out = await run(api, "publish", str(latin1), key=KEY_A)
    assert out.exit_code == 1 and "latin1.json is not UTF-8 (invalid start byte)" in out.output, out.output


async def test_an_import_with_wait_says_once_that_an_expired_episode_was_not_imported(
    make_client, settings, tmp_path
):
    """A line whose expires_at had passed, imported with --wait, printed both "imported 0 of 1 episodes;
    the error is in the batch" and "accepted, but exp-1: expired": one says nothing went in, the other
    that it did. Now one message names the episode, its line and its expires_at; the other lines import."""
    api = await make_client(api_keys={KEY_A: "team-a"})
    old = {"started_at": 1_700_000_000, "completed_at": 1_700_000_060, "expires_at": 1_700_000_100}
    lines = [
        {"episode_id": "live-1", "task": "rotate the keys", "outcome": "success"},
        {"episode_id": "exp-1", "task": "renew the certificate", "outcome": "success", **old},
    ]
    file = tmp_path / "expired.jsonl"
    file.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    async with running_worker(settings, "importer"):
        out = await run(api, "import", str(file), "--wait", "20", "--no-progress", key=KEY_A)
    assert out.exit_code == 1, out.output
    assert "imported 1 of 2 episodes; 1 was not, as its expires_at had already passed" in out.output
    assert "expired.jsonl:2, expires_at 2023-11-14T22:15:00Z)" in out.output and "exp-1 (" in out.output
    assert "error is in the batch" not in out.output and "accepted, but" not in out.output, out.output
    assert (await api.get("/v1/episodes/live-1", headers=auth(KEY_A))).status == 200


async def test_an_import_never_sends_a_line_past_its_expires_at(make_client, settings, tmp_path):
    """An expired line sent as an upsert erased the live copy of its episode while the import said it
    was not imported: such lines are not sent at all, with or without --wait, and named (exit 1)."""
    api = await make_client(api_keys={KEY_A: "team-a"})
    old = {"started_at": 1_700_000_000, "completed_at": 1_700_000_060, "expires_at": 1_700_000_100}
    async with running_worker(settings, "importer"):
        live = tmp_path / "live.jsonl"
        live.write_text(
            json.dumps({"episode_id": "kept-1", "task": "renew the certificate", "outcome": "success"}) + "\n"
        )
        out = await run(api, "import", str(live), "--wait", "20", "--no-progress", key=KEY_A)
        assert out.exit_code == 0, out.output
        file = tmp_path / "stale.jsonl"
        lines = [{"episode_id": "kept-1", "task": "renew the certificate", "outcome": "success", **old}]
        lines += [
            {"episode_id": f"stale-{i}", "task": "rotate the keys", "outcome": "success", **old}
            for i in range(2)
        ]
        file.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
        for wait in ((), ("--wait", "5")):
            out = await run(api, "import", str(file), *wait, "--no-progress", "--json", key=KEY_A)
            assert out.exit_code == 1, out.output
            assert json.loads(out.stdout) == {
                "imported": 0,
                "forgotten": [],
                "expired": ["kept-1", "stale-0", "stale-1"],
            }, out.output
            assert (
                "imported 0 of 3 episodes; 3 were not, as their expires_at had already passed" in out.output
            )
            assert (await api.get("/v1/episodes/kept-1", headers=auth(KEY_A))).status == 200
            assert (await api.get("/v1/episodes/stale-0", headers=auth(KEY_A))).status == 404


async def test_an_import_past_its_wait_says_the_batch_was_published(make_client, tmp_path):
    """With no consolidator running, `--wait` ran out: the import said "imported 0 of 2 episodes; the error
    is in the batch" beside "accepted, but not projected", though the service had taken both."""
    api = await make_client(api_keys={KEY_A: "team-a"})
    file = tmp_path / "slow.jsonl"
    lines = [{"episode_id": f"slow-{i}", "task": "rotate the keys", "outcome": "success"} for i in range(2)]
    file.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    out = await run(api, "import", str(file), "--wait", "0.2", "--no-progress", key=KEY_A)
    assert out.exit_code == 1, out.output
    assert "published 2 of 2 episodes, through line 2 of" in out.output, out.output
    assert "accepted, but not projected within 0.2s: slow-0, slow-1" in out.output, out.output
    assert "error is in the batch" not in out.output, out.output
