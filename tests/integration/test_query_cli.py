"""`engram` CLI against a real query service (the CLI runs in a worker thread with its own loop)."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from services.cli import cli
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
    await put(redis, prefix, "ns-a", episode("path/with\\slash", task="rotate the api keys", agent_id="ops",
                                             category="security", reward=1.0))
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

    out = await run(tenants, "forget", "--episode", "path/with\\slash", key=KEY_A)
    assert out.exit_code == 0, out.output
    out = await run(tenants, "forget", "--user", "u:1", key=KEY_A)
    assert out.exit_code == 0, out.output
    events = [decode(e.payload) for e in await streams.read_range(redis, Keys(prefix).stream)]
    assert [type(e).__name__ for e in events] == ["EpisodeCompleted", "EpisodeCompleted", "EpisodeForgotten",
                                                 "UserForgotten"]
    assert events[2].episode_id == "path/with\\slash" and events[3].user_id == "u:1"
    assert {e.namespace for e in events} == {"ns-a"}


async def test_cli_errors(tenants, tmp_path):
    out = await run(tenants, "recall", "x")
    assert out.exit_code == 1 and "401" in out.output
    out = await run(tenants, "recall", "   ", key=KEY_A)
    assert out.exit_code == 1 and "query: must not be empty or blank" in out.output
    out = await run(tenants, "forget", key=KEY_A)
    assert out.exit_code == 2
    file = tmp_path / "bad.json"
    file.write_text(json.dumps({"task": "t"}), encoding="utf-8")
    out = await run(tenants, "publish", str(file), key=KEY_A)
    assert out.exit_code == 1 and "outcome" in out.output
