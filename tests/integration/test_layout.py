"""The key layout is recorded by a deployment's first process and checked by every start
(`shared.partitions.LAYOUT`): a prefix written by an older Engram — data without the record — is refused
by the worker, the query service, a replay and a publisher, with one line saying what to do, and nothing
is written to it."""

from __future__ import annotations

import pytest

from engram_episodic.errors import ConfigError
from services.consolidator.replay import replay
from services.query.app import make_app
from shared import partitions
from shared.embedding import HashingEmbedder
from shared.keys import Keys
from shared.sdk import EngramClient
from tests.helpers import spawn_consolidator
from tests.integration.test_consolidator import drain, episode, make_worker

OLDER = "was written by an older Engram layout: replay its episodes into a fresh prefix \\(ENGRAM_PREFIX="


async def older(redis, prefix: str) -> None:
    """`prefix` as an Engram of an older layout left it: meta hash without `layout`, a stream entry."""
    keys = Keys(prefix)
    await redis.hset(
        keys.meta, mapping={"generation": 1, "g1:embedder": "hashing-64", "stream_partitions": 1}
    )
    await redis.xadd(keys.stream, {"e": b"an event of an older build"})


async def snapshot(redis, prefix: str) -> dict[bytes, bytes]:
    """Every key of `prefix` with its DUMP: what a refused start must leave as it was."""
    return {key: await redis.dump(key) async for key in redis.scan_iter(match=f"{prefix}*")}


async def test_a_fresh_prefix_records_the_layout_and_starts_again(settings, redis):
    """Entries a publisher without the SDK wrote first are no older layout."""
    keys = Keys(settings.prefix)
    await redis.xadd(keys.stream, {"e": b"not an event"})
    await EngramClient(redis, namespace="ns", prefix=settings.prefix).record(episode("e1"))
    assert await redis.hget(keys.meta, "layout") == str(partitions.LAYOUT).encode()
    assert await redis.hget(keys.meta, "sealed") == b"0"
    await drain(make_worker(settings, redis))
    await drain(make_worker(settings, redis))  # a second start finds its own record


async def test_an_older_layout_is_refused_by_every_start(settings, redis, aiohttp_client):
    """A meta hash as a build before the layout record left it (an index generation, its embedder, P)."""
    await older(redis, settings.prefix)
    before = await snapshot(redis, settings.prefix)
    with pytest.raises(ConfigError, match=OLDER) as refused:
        await make_worker(settings, redis).setup()
    assert "\n" not in str(refused.value) and settings.prefix in str(refused.value)
    with pytest.raises(ConfigError, match=OLDER):
        await EngramClient(redis, namespace="ns", prefix=settings.prefix).record(episode("e1"))
    with pytest.raises(ConfigError, match=OLDER):
        await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    with pytest.raises(ConfigError, match=OLDER):
        await aiohttp_client(make_app(settings, redis=redis, embedder=HashingEmbedder(settings.embed_dim)))
    assert await snapshot(redis, settings.prefix) == before


async def test_a_newer_layout_is_refused(settings, redis):
    await redis.hset(
        Keys(settings.prefix).meta, mapping={"layout": partitions.LAYOUT + 1, "stream_partitions": 1}
    )
    with pytest.raises(
        ConfigError, match=f"has key layout '{partitions.LAYOUT + 1}'.*run the Engram that wrote it"
    ):
        await make_worker(settings, redis).setup()


async def test_the_worker_process_exits_2_with_the_line_to_follow(settings, redis):
    await older(redis, settings.prefix)
    proc = spawn_consolidator(settings)
    try:
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    assert code == 2, err[-2000:]
    assert [line for line in err.splitlines() if "older Engram layout" in line], err[-2000:]
