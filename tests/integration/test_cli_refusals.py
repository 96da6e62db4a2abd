"""Configuration errors of stream partitions and clusters met by the admin commands are one line and exit
code 2, never a traceback: another stream partition count than the deployment recorded, for
`engram-admin replay`, `dead-letters`, `redrive --all` and `discard --all`; a cluster addressed as one
Redis (`redis://`, its MovedError) says to use `redis+cluster://`; and next to
`ENGRAM_REDIS_CLUSTER=N make run` the commands default to its cluster."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from services.admin import cli, server_env
from shared.partitions import FIELD, LAYOUT
from tests.integration.test_cli_admin import env_for

COMMANDS = [("replay",), ("dead-letters",), ("redrive", "--all"), ("discard", "--all")]


async def invoke(*args: str):
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), catch_exceptions=False)


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
async def test_another_partition_count_is_one_line_and_exit_2(args, settings, redis, monkeypatch):
    # a deployment of this layout that recorded 16 partitions
    await redis.hset(settings.keys.meta, mapping={"layout": LAYOUT, "sealed": 0, FIELD: 16})
    env_for(monkeypatch, settings)
    monkeypatch.setenv("ENGRAM_STREAM_PARTITIONS", "8")
    out = await invoke(*args)
    assert out.exit_code == 2, out.output
    line = one_line(out.stderr)
    assert "ENGRAM_STREAM_PARTITIONS=8" in line and "started with 16 stream partitions" in line, line
    assert line.split(":")[0].endswith(args[0])  # names the command


async def test_a_bad_setting_is_one_line_and_exit_2(settings, monkeypatch):
    env_for(monkeypatch, settings)
    monkeypatch.setenv("ENGRAM_STREAM_PARTITIONS", "many")
    out = await invoke("dead-letters")
    assert out.exit_code == 2, out.output
    assert "ENGRAM_STREAM_PARTITIONS" in one_line(out.stderr)


async def test_a_cluster_addressed_as_one_redis_says_redis_cluster(
    cluster_settings, cluster_redis, monkeypatch
):
    await cluster_redis.initialize()
    owner = cluster_redis.get_node_from_key(cluster_settings.keys.dead_letters)
    other = next(n for n in cluster_redis.get_primaries() if n.name != owner.name)
    env_for(monkeypatch, cluster_settings)
    monkeypatch.setenv("REDIS_URL", f"redis://{other.host}:{other.port}/0")  # MOVED to the owner
    out = await invoke("dead-letters")
    assert out.exit_code == 2, out.output
    assert "redis+cluster://" in one_line(out.stderr)


def test_next_to_a_make_run_cluster_the_default_url_is_the_cluster():
    env = server_env({"ENGRAM_REDIS_CLUSTER": "3", "ENGRAM_REDIS_PORT": "47200"})
    assert env["REDIS_URL"] == "redis+cluster://127.0.0.1:47200"
    assert server_env({"ENGRAM_REDIS_CLUSTER": "0"})["REDIS_URL"] == "redis://127.0.0.1:6390/0"
    given = {"ENGRAM_REDIS_CLUSTER": "3", "REDIS_URL": "redis://elsewhere:1/0"}
    assert server_env(given)["REDIS_URL"] == "redis://elsewhere:1/0"  # what is set wins
