"""ENGRAM_CONTEXT_EPISODES recorded in the deployment's meta (shared.context_setting), against the real
Redis: a replay without the variable keeps the contexts, an explicit other value is refused by a worker,
a replay and the query service, `--change-context-episodes` rebuilds and records, a running worker and
the query service follow the record, and a deployment from before the record is recorded."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from engram_episodic.errors import ConfigError
from services.consolidator.context import CONTEXT_FIELD, CONTEXT_OF_FIELD
from services.consolidator.replay import replay
from services.consolidator.worker import Worker
from shared import context_setting
from shared.embedding import HashingEmbedder
from shared.keys import Keys
from shared.keywords import fold_for_search
from shared.sdk import EngramClient
from tests.helpers import wait_until
from tests.integration.test_cli_admin import env_for, invoke
from tests.integration.test_consolidator import drain, make_worker
from tests.integration.test_context_episodes import TEXTS, stored, turn

pytest_plugins = ["tests.integration.test_query_support"]

E2_CONTEXT = fold_for_search(TEXTS["e1"]).encode()
QUERY = {"query": "how did it feel", "mode": "keyword", "top_k": 5}


async def seed(settings, redis, eids=("e1", "e2"), ns="default") -> None:
    """Publish the turns and drain them with a worker of `settings`."""
    client = EngramClient(redis, namespace=ns, prefix=settings.prefix)
    for i, eid in enumerate(eids):
        await client.record(turn(eid, 10.0 * (i + 1)))
    await drain(make_worker(settings, redis))


async def contexts(redis, keys: Keys, eid: str = "e2", ns: str = "default") -> tuple:
    return (
        await stored(redis, keys, ns, eid, CONTEXT_FIELD),
        await stored(redis, keys, ns, eid, CONTEXT_OF_FIELD),
    )


async def turns(worker: Worker) -> None:
    """Run turns of a worker already set up (a running one: no `setup`, which is a start) until idle."""
    idle = 0
    while idle < 3:
        idle = 0 if await worker.turn() else idle + 1


async def recall_context(api) -> dict | None:
    resp = await api.post("/v1/recall", json=QUERY)
    assert resp.status == 200, await resp.text()
    (e2,) = [r for r in (await resp.json())["results"] if r["episode"]["episode_id"] == "e2"]
    return e2.get("context")


async def test_a_replay_without_the_variable_keeps_every_context(settings, redis, monkeypatch):
    keys = Keys(settings.prefix)
    await seed(settings.with_(context_episodes=1), redis)
    assert await context_setting.recorded(redis, keys) == 1  # the first writer recorded its value
    assert await contexts(redis, keys) == (E2_CONTEXT, b"e1")
    unset = settings.with_(context_episodes=None)
    out = await replay(unset, redis, HashingEmbedder(settings.embed_dim))
    assert out["context_episodes"] == 1 and out["generation"] == 2
    assert await contexts(redis, keys) == (E2_CONTEXT, b"e1"), "a replay in a shell without it stripped them"

    env_for(monkeypatch, settings)  # the command line, ENGRAM_CONTEXT_EPISODES unset
    monkeypatch.delenv("ENGRAM_CONTEXT_EPISODES", raising=False)
    for args in (["replay", "--no-progress"], ["reindex", "--embedder", "hashing", "--no-progress"]):
        result = await invoke(*args)
        assert result.exit_code == 0, result.output
        assert await contexts(redis, keys) == (E2_CONTEXT, b"e1"), args
    # a worker started without it follows the record too
    await EngramClient(redis, namespace="default", prefix=settings.prefix).record(turn("e3", 30.0))
    await drain(make_worker(unset, redis))
    assert await contexts(redis, keys, "e3") == (fold_for_search(TEXTS["e2"]).encode(), b"e2")


async def test_an_explicit_other_value_is_refused_by_workers_replay_and_the_query_service(
    settings, redis, make_client, monkeypatch
):
    keys = Keys(settings.prefix)
    await seed(settings.with_(context_episodes=1), redis)
    off = settings.with_(context_episodes=0)
    with pytest.raises(
        ConfigError, match="ENGRAM_CONTEXT_EPISODES=0 but .* is written with ENGRAM_CONTEXT_EPISODES=1"
    ):
        await make_worker(off, redis).setup()
    with pytest.raises(ConfigError, match="add --change-context-episodes to rebuild every episode under 0"):
        await replay(off, redis, HashingEmbedder(settings.embed_dim))
    with pytest.raises(ConfigError, match="ENGRAM_CONTEXT_EPISODES=0 but"):  # the query service's start
        await make_client(context_episodes=0)
    with pytest.raises(ConfigError, match="needs ENGRAM_CONTEXT_EPISODES set to the new value"):
        await replay(
            settings.with_(context_episodes=None),
            redis,
            HashingEmbedder(settings.embed_dim),
            change_context_episodes=True,
        )
    env_for(monkeypatch, settings)
    monkeypatch.setenv("ENGRAM_CONTEXT_EPISODES", "0")
    result = await invoke("replay", "--no-progress")
    assert result.exit_code == 2, result.output
    assert "--change-context-episodes" in result.output and "Traceback" not in result.output
    assert await context_setting.recorded(redis, keys) == 1
    assert await contexts(redis, keys) == (E2_CONTEXT, b"e1")  # nothing was rebuilt
    await make_worker(settings.with_(context_episodes=1), redis).setup()  # the same value: fine


async def test_change_rebuilds_records_and_running_workers_and_the_query_service_follow(
    settings, redis, make_client, monkeypatch, caplog
):
    keys = Keys(settings.prefix)
    on = settings.with_(context_episodes=1)
    await seed(on, redis)
    running = make_worker(on, redis, name="running")  # started with 1 explicitly, before the change
    await running.setup()
    api = await make_client()  # unset: follows the record
    assert await recall_context(api) == {"previous_episode_id": "e1", "text": E2_CONTEXT.decode()}

    off = settings.with_(context_episodes=0)
    out = await replay(off, redis, HashingEmbedder(settings.embed_dim), change_context_episodes=True)
    assert out["context_episodes"] == 0
    assert await context_setting.recorded(redis, keys) == 0
    assert await contexts(redis, keys) == (None, None)
    assert await stored(redis, keys, "default", "e2", "own_vector") is None

    with caplog.at_level(logging.WARNING, logger="engram.consolidator"):
        await EngramClient(redis, namespace="default", prefix=settings.prefix).record(turn("e3", 30.0))
        await turns(running)  # it switches to the new generation and follows the record
    assert await contexts(redis, keys, "e3") == (None, None), "the running worker kept writing contexts"
    assert any(
        "written with ENGRAM_CONTEXT_EPISODES=0 (was 1); following it: set ENGRAM_CONTEXT_EPISODES=0"
        in r.message
        for r in caplog.records
    ), caplog.text
    with pytest.raises(ConfigError, match="ENGRAM_CONTEXT_EPISODES=1 but"):  # its restart with 1
        await make_worker(on, redis).setup()

    # and back, from the command line: the contexts are rebuilt
    env_for(monkeypatch, settings)
    monkeypatch.setenv("ENGRAM_CONTEXT_EPISODES", "1")
    result = await invoke("replay", "--change-context-episodes", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "written with ENGRAM_CONTEXT_EPISODES=1" in result.stdout
    assert await context_setting.recorded(redis, keys) == 1
    assert await contexts(redis, keys) == (E2_CONTEXT, b"e1")
    await wait_until(lambda: _shows(api), message="the query service follows the record")

    # the module form: refused without the flag, switched with it
    from click.testing import CliRunner

    from services.consolidator.__main__ import cli

    def module(*args: str):
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    monkeypatch.setenv("ENGRAM_CONTEXT_EPISODES", "0")
    result = await asyncio.to_thread(module, "replay")
    assert result.exit_code == 2 and "--change-context-episodes" in result.output, result.output
    result = await asyncio.to_thread(module, "replay", "--change-context-episodes")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["context_episodes"] == 0
    assert await context_setting.recorded(redis, keys) == 0 and await contexts(redis, keys) == (None, None)


async def _shows(api) -> bool:
    return await recall_context(api) is not None


async def test_the_query_service_follows_a_record_written_after_its_start(settings, redis, make_client):
    keys = Keys(settings.prefix)
    api = await make_client()  # first, unset, nothing recorded: it records nothing (it writes nothing)
    assert await context_setting.recorded(redis, keys) is None
    client = EngramClient(redis, namespace="default", prefix=settings.prefix)
    for i, eid in enumerate(("e1", "e2")):
        await client.record(turn(eid, 10.0 * (i + 1)))
    await drain(make_worker(settings.with_(context_episodes=1), redis))  # the first writer records 1
    assert await context_setting.recorded(redis, keys) == 1
    await wait_until(lambda: _shows(api), message="recall hits show the context once recorded")


async def test_a_deployment_from_before_the_record_is_recorded_at_first_start(settings, redis, make_client):
    keys = Keys(settings.prefix)
    await seed(settings.with_(context_episodes=1), redis)
    await redis.hdel(keys.meta, context_setting.FIELD)  # as a deployment from before the record has it
    await make_client(context_episodes=0)  # the query service starts and records nothing
    assert await context_setting.recorded(redis, keys) is None
    await make_worker(settings.with_(context_episodes=1), redis).setup()  # its workers' value
    assert await context_setting.recorded(redis, keys) == 1

    await redis.hdel(keys.meta, context_setting.FIELD)
    out = await replay(settings.with_(context_episodes=None), redis, HashingEmbedder(settings.embed_dim))
    assert out["context_episodes"] == 0  # unset, nothing recorded: 0, as documented
    assert await context_setting.recorded(redis, keys) == 0
    assert await contexts(redis, keys) == (None, None)
