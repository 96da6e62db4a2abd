"""The consolidator as a real process: kill -9 mid-batch loses nothing; SIGTERM acks its batch."""

from __future__ import annotations

import signal
import subprocess

import pytest

from shared import streams
from shared.index import Scope, count
from shared.keys import Keys
from shared.sdk import EngramClient
from shared.tags import BLAKE2B
from tests.helpers import spawn_consolidator, wait_until

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it


def spawn_worker(settings, name: str, **env) -> subprocess.Popen:
    return spawn_consolidator(settings, ENGRAM_CONSUMER_NAME=name, **env)


def stop_gracefully(proc: subprocess.Popen, timeout: float = 30) -> int:
    """SIGTERM and wait; a worker that ignores it is killed (never left running) and the test fails."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"the worker ignored SIGTERM for {timeout}s: "
            f"{proc.stderr.read().decode(errors='replace')[-2000:]}"
        ) from None


async def publish_many(redis, settings, n: int) -> None:
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    from engram_episodic.events import Episode, EpisodeCompleted, Task

    events = [
        EpisodeCompleted(
            namespace="ns",
            episode_id=f"e{i}",
            occurred_at=float(i),
            episode=Episode(
                episode_id=f"e{i}",
                outcome="success",
                completed_at=float(i),
                task=Task(description=f"episode number {i} " + "text " * 200),
            ),
        )
        for i in range(n)
    ]
    for start in range(0, n, 100):
        await client.publish(events[start : start + 100])


async def indexed(redis, keys) -> int:
    return await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns"))


async def test_kill_9_mid_batch_second_worker_finishes(settings, redis):
    keys = Keys(settings.prefix)
    n = 3000
    await publish_many(redis, settings, n)
    first = spawn_worker(settings, "doomed")
    try:
        await wait_until(
            lambda: _exists_and_positive(redis, keys), timeout=60, message="first worker progress"
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        first.stderr.close()
    done_by_first = await indexed(redis, keys)
    info = await streams.StreamGroup(redis, keys.stream, settings.consumer_group).info()
    assert done_by_first < n and info["pending"] + info["lag"] > 0, "kill came too late to test anything"
    second = spawn_worker(settings, "rescuer", ENGRAM_LEASE_MS="300")
    try:
        await wait_until(lambda: _indexed_is(redis, keys, n), timeout=90, message=f"{n} episodes indexed")
        await wait_until(lambda: _pending_zero(redis, keys, settings), timeout=30, message="nothing pending")
    finally:
        code = stop_gracefully(second)
        second.stderr.close()
    assert code == 0
    assert await indexed(redis, keys) == n  # none lost, none doubled (one document per episode id)


async def test_sigterm_finishes_and_acks_batch(settings, redis):
    keys = Keys(settings.prefix)
    await publish_many(redis, settings, 1500)
    worker = spawn_worker(settings, "graceful")
    await wait_until(lambda: _exists_and_positive(redis, keys), timeout=60, message="worker progress")
    code = stop_gracefully(worker)
    assert code == 0, worker.stderr.read().decode()[-2000:]
    worker.stderr.close()
    consumers = await redis.xinfo_consumers(keys.stream, settings.consumer_group)
    mine = [c for c in consumers if c["name"] in (b"graceful", "graceful")]
    # it acked its batch in hand (nothing pending) and, holding nothing, removed itself from the group
    group = streams.StreamGroup(redis, keys.stream, settings.consumer_group)
    assert mine == [] and (await group.info())["pending"] == 0
    assert await indexed(redis, keys) > 0


async def _exists_and_positive(redis, keys) -> bool:
    from shared.index import index_exists

    return await index_exists(redis, keys.episode_index_alias) and await indexed(redis, keys) > 0


async def _indexed_is(redis, keys, n) -> bool:
    return await indexed(redis, keys) == n


async def _pending_zero(redis, keys, settings) -> bool:
    return (await streams.StreamGroup(redis, keys.stream, settings.consumer_group).info())["pending"] == 0
