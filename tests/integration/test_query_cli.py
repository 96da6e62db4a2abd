"""`engram` CLI against a real query service (the CLI runs in a worker thread with its own loop)."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from engram_episodic.cli import cli
from shared import streams
from shared.codec import decode
from shared.keys import Keys
from tests.integration.test_query_support import KEY_A, episode, put

pytest_plugins = ["tests.integration.test_query_support"]


async def run(client, *args: str, key: str | None = None):
    base = ["--url", str(client.make_url(""))] + (["--api-key", key] if key else [])
    result = await asyncio.to_thread(CliRunner().invoke, cli, [*base, *args], catch_exceptions=False)
    return result


async def test_cli_recall_publish_skills_forget(tenants, redis, prefix, tmp_path):
    await put(
        redis,
        prefix,
        "ns-a",
        episode(
            "path/with\\slash", task="rotate the api keys", agent_id="ops", category="security", reward=1.0
        ),
    )
    out = await run(tenants, "recall", "rotate the api keys", "--agent-id", "ops", "--top-k", "2", key=KEY_A)
    assert out.exit_code == 0, out.output
    assert "path/with\\slash" in out.output and "success" in out.output
    out = await run(tenants, "recall", "rotate", "--json", key=KEY_A)
    assert json.loads(out.output)["results"][0]["episode"]["episode_id"] == "path/with\\slash"
    assert json.loads(out.output)["mode"] == "hybrid", "without --mode the CLI uses the service's default"

    file = tmp_path / "eps.json"
    file.write_text(json.dumps({"episodes": [episode("new-1"), episode("new-2")]}), encoding="utf-8")
    out = await run(tenants, "publish", str(file), key=KEY_A)
    assert out.exit_code == 0 and out.output.count("accepted") == 2

    out = await run(tenants, "skills", "--agent-id", "ops", key=KEY_A)
    assert out.exit_code == 0 and out.output.startswith("security")
    for command in ("skills", "curve"):  # an empty scope is said, not an empty screen
        out = await run(tenants, command, "--agent-id", "nobody", key=KEY_A)
        assert out.exit_code == 0 and out.output == "no completed episodes in this scope\n", out.output

    out = await run(tenants, "forget", "--episode", "path/with\\slash", key=KEY_A)
    assert out.exit_code == 0, out.output
    out = await run(tenants, "forget", "--user", "u:1", key=KEY_A)
    assert out.exit_code == 0, out.output
    events = [decode(e.payload) for e in await streams.read_range(redis, Keys(prefix).stream)]
    assert [type(e).__name__ for e in events] == [
        "EpisodeCompleted",
        "EpisodeCompleted",
        "EpisodeForgotten",
        "UserForgotten",
    ]
    assert events[2].episode_id == "path/with\\slash" and events[3].user_id == "u:1"
    assert {e.namespace for e in events} == {"ns-a"}


async def test_cli_errors(tenants, tmp_path):
    out = await run(tenants, "recall", "x")
    assert out.exit_code == 1 and "401" in out.output and "--api-key or ENGRAM_API_KEY" in out.output
    out = await run(tenants, "recall", "x", key="not-a-key")
    assert (
        out.exit_code == 1
        and "401" in out.output
        and "not one of the service's ENGRAM_API_KEYS" in out.output
    )
    out = await run(tenants, "recall", "   ", key=KEY_A)
    assert out.exit_code == 1 and "query: must not be empty or blank" in out.output
    out = await run(tenants, "forget", key=KEY_A)
    assert out.exit_code == 2
    file = tmp_path / "bad.json"
    file.write_text(json.dumps({"task": "t"}), encoding="utf-8")
    out = await run(tenants, "publish", str(file), key=KEY_A)
    assert out.exit_code == 1 and "outcome" in out.output


async def test_cli_context_facts_curve_and_the_default_url(tenants, redis, prefix, monkeypatch):
    for i, outcome in enumerate(["success", "failure", "success"]):
        await put(
            redis,
            prefix,
            "ns-a",
            episode(
                f"c{i}",
                task=f"upgrade the postgres cluster {i}",
                agent_id="ops",
                outcome=outcome,
                reward=1.0 if outcome == "success" else 0.0,
                completed_at=1_700_000_000.0 + i,
            ),
        )
    out = await run(tenants, "context", "upgrade the postgres cluster", "--agent-id", "ops", key=KEY_A)
    assert out.exit_code == 0 and "upgrade the postgres cluster" in out.output, out.output
    out = await run(tenants, "curve", "--agent-id", "ops", key=KEY_A)
    assert out.exit_code == 0 and [line.split()[0] for line in out.output.splitlines()] == ["1", "2", "3"]
    assert "cumulative 2.00" in out.output.splitlines()[-1]
    out = await run(tenants, "curve", "--agent-id", "ops", "--json", key=KEY_A)
    assert [p["episode_id"] for p in json.loads(out.output)["results"]] == ["c0", "c1", "c2"]
    out = await run(tenants, "facts", "postgres", key=KEY_A)
    assert out.exit_code == 0 and "no facts in this scope" in out.output  # none consolidated yet

    port = tenants.make_url("").port
    monkeypatch.setenv("ENGRAM_PORT", str(port))  # no --url: the default follows ENGRAM_PORT
    monkeypatch.setenv("ENGRAM_API_KEY", KEY_A)
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["skills"], catch_exceptions=False)
    assert result.exit_code == 0 and result.output.startswith("debugging  "), result.output


async def test_cli_record_with_ttl_or_expires_at(tenants, redis, prefix):
    """`engram record` takes `--ttl` / `--expires-at` as the API takes `ttl` / `expires_at`."""
    import time

    before = time.time()
    common = ("--outcome", "success", "--json")
    out = await run(tenants, "record", "keep a day", "--episode-id", "t1", "--ttl", "1d", *common, key=KEY_A)
    assert out.exit_code == 0, out.output
    out = await run(
        tenants, "record", "keep an hour", "--episode-id", "t2", "--ttl", "3600", *common, key=KEY_A
    )
    assert out.exit_code == 0, out.output
    at = "2999-01-01T00:00:00Z"
    out = await run(
        tenants, "record", "until 2999", "--episode-id", "t3", "--expires-at", at, *common, key=KEY_A
    )
    assert out.exit_code == 0, out.output
    out = await run(
        tenants,
        "record",
        "until 2999 too",
        "--episode-id",
        "t4",
        "--expires-at",
        "32472144000",
        *common,
        key=KEY_A,
    )
    assert out.exit_code == 0, out.output
    events = {
        e.episode.episode_id: e.episode
        for e in (decode(x.payload) for x in await streams.read_range(redis, Keys(prefix).stream))
    }
    after = time.time()
    assert before + 86400 <= events["t1"].expires_at <= after + 86400
    assert before + 3600 <= events["t2"].expires_at <= after + 3600
    assert events["t3"].expires_at == events["t4"].expires_at == 32472144000.0
    for bad, said in (
        (("--ttl", "soon"), "ttl: must be a positive duration"),
        (("--expires-at", "tomorrow"), "expires_at: 'tomorrow' is not ISO 8601"),
        (("--ttl", "1d", "--expires-at", at), "ttl: give expires_at or ttl, not both"),
        (("--expires-at", "2000-01-01T00:00:00Z"), "expires_at: must be after"),
    ):
        out = await run(tenants, "record", "bad", "--outcome", "success", *bad, key=KEY_A)
        assert out.exit_code == 1 and said in out.output, (bad, out.output)
    assert len(await streams.read_range(redis, Keys(prefix).stream)) == 4  # nothing more was sent
