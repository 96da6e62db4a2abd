"""The SDK publishes real events to the real stream (read back with XRANGE and decoded)."""

from __future__ import annotations

import time

import pytest

from engram_episodic.errors import InvalidEpisode, PublishError
from engram_episodic.events import ActionRecorded, EpisodeCompleted, EpisodeStarted
from shared import streams
from shared.codec import decode
from shared.keys import Keys
from shared.redis_conn import connect
from shared.sdk import EngramClient


async def read_all(redis, prefix):
    return [decode(e.payload) for e in await streams.read_range(redis, Keys(prefix).stream)]


async def test_full_episode_published_and_decoded(redis, prefix):
    client = EngramClient(redis, namespace="ns-a", prefix=prefix)
    async with client.episode(
        task="fix flaky test",
        category="debugging",
        complexity=0.4,
        agent_id="coder",
        user_id="u1",
        session_id="s1",
        context={"repo": "engram"},
        observation="CI red",
    ) as ep:
        await ep.action(
            "run_tests", input="pytest -x", output="1 failed", success=False, error="AssertionError"
        )
        await ep.action("edit", input="conftest.py", success=True)
        await ep.complete(
            "success",
            feedback={"reward": 1.0, "tests_passed": 12, "tests_total": 12},
            solution="pin the clock",
            strategy_used="iterative",
            importance=7,
            iterations=2,
        )
    events = await read_all(redis, prefix)
    assert [type(e) for e in events] == [EpisodeStarted, ActionRecorded, ActionRecorded, EpisodeCompleted]
    assert {e.episode_id for e in events} == {ep.episode_id}
    done = events[-1].episode
    assert done.task.description == "fix flaky test" and done.task.category == "debugging"
    assert done.feedback.pass_rate == 1.0 and done.strategy_used == "iterative" and done.importance == 7
    assert [a.action_type for a in done.actions] == ["run_tests", "edit"]
    assert done.actions[0].action_id == events[1].event_id
    assert done.context == {"repo": "engram"} and done.agent_id == "coder" and done.user_id == "u1"
    assert done.duration_s is not None and done.duration_s >= 0


async def test_exception_completes_as_failure_and_reraises(redis, prefix):
    client = EngramClient(redis, namespace="ns", prefix=prefix)
    with pytest.raises(ZeroDivisionError):
        async with client.episode(task="divide") as ep:
            1 / 0  # noqa: B018
    final = (await read_all(redis, prefix))[-1]
    assert isinstance(final, EpisodeCompleted) and final.episode_id == ep.episode_id
    assert final.episode.outcome == "failure" and "ZeroDivisionError" in final.episode.outcome_details


async def test_record_finished_episode_and_validation(redis, prefix):
    client = EngramClient(redis, namespace="ns", prefix=prefix)
    eid = await client.record(
        {"episode_id": "given-id", "task": "t", "outcome": "partial", "completed_at": "2025-07-25T02:00:00Z"}
    )
    assert eid == "given-id"
    (event,) = await read_all(redis, prefix)
    assert event.episode.completed_at == 1753408800.0
    with pytest.raises(InvalidEpisode, match="importance"):
        await client.record({"task": "t", "outcome": "success", "importance": 99})
    with pytest.raises(InvalidEpisode, match="outcome"):
        await client.record({"task": "t"})
    assert len(await read_all(redis, prefix)) == 1


async def test_retry_keeps_event_ids(redis, prefix, redis_url):
    """A connection dropped mid-publish is retried with the same event ids."""
    client = EngramClient(
        connect(redis_url, retries=0), namespace="ns", prefix=prefix, retries=3, owns_redis=True
    )
    calls = {"n": 0}
    original = streams.publish

    async def flaky(r, stream, payloads, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            await original(r, stream, payloads, **kw)  # accepted by Redis, but the reply is "lost"
            raise ConnectionError("reset by peer")
        return await original(r, stream, payloads, **kw)

    streams.publish = flaky
    try:
        await client.record({"episode_id": "e", "task": "t", "outcome": "success"})
    finally:
        streams.publish = original
        await client.close()
    events = await read_all(redis, prefix)
    assert calls["n"] == 2 and len(events) == 2
    assert events[0].event_id == events[1].event_id  # a harmless duplicate, deduplicated downstream


async def test_unreachable_redis_raises_publish_error_within_timeout(prefix):
    from deploy.embedded_redis import free_port

    client = EngramClient.connect(
        f"redis://127.0.0.1:{free_port()}/0", namespace="ns", prefix=prefix, publish_timeout=0.5, retries=2
    )
    with pytest.raises(PublishError, match="not published"):
        await client.record({"task": "t", "outcome": "success"})
    await client.close()


async def test_unicode_text_is_byte_exact_through_redis(redis, prefix):
    """Case C16: Chinese, Arabic, emoji, NFC and NFD texts come back byte-exact through Redis."""
    client = EngramClient(redis, namespace="名前空間", prefix=prefix)
    texts = ["修复数据库迁移测试", "إصلاح اختبار الترحيل", "🙂🚀", "caf\u00e9", "cafe\u0301"]
    for t in texts:
        await client.record(
            {"episode_id": t, "task": {"description": t, "category": t}, "outcome": "success", "solution": t}
        )
    events = await read_all(redis, prefix)
    assert [e.episode.solution.encode() for e in events] == [t.encode() for t in texts]
    assert all(e.namespace == "名前空間" for e in events)


async def test_backpressure_waits_then_publishes_or_raises(redis, prefix, settings):
    import asyncio

    from engram_episodic.errors import Backpressure
    from services.consolidator.worker import Worker
    from shared.embedding import HashingEmbedder

    keys = Keys(prefix)
    await streams.StreamGroup(redis, keys.stream, "consolidator").ensure()
    filler = EngramClient(redis, namespace="ns", prefix=prefix)
    for i in range(30):
        await filler.record({"episode_id": f"f{i}", "task": "t", "outcome": "success"})
    assert await streams.StreamGroup(redis, keys.stream, "consolidator").lag() == 30
    strict = EngramClient(redis, namespace="ns", prefix=prefix, max_lag=10, wait_on_backpressure=False)
    with pytest.raises(Backpressure) as info:
        await strict.record({"episode_id": "x", "task": "t", "outcome": "success"})
    assert info.value.lag == 30 and info.value.retry_after >= 1
    patient = EngramClient(redis, namespace="ns", prefix=prefix, max_lag=10, publish_timeout=0.4)
    with pytest.raises(Backpressure):
        await patient.record({"episode_id": "y", "task": "t", "outcome": "success"})
    assert len(await read_all(redis, prefix)) == 30  # nothing was published by the refused calls
    # a worker drains the lag while a patient publisher waits: the publish then goes through
    patient = EngramClient(redis, namespace="ns", prefix=prefix, max_lag=10, publish_timeout=20)
    worker = Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="drainer")
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await patient.record({"episode_id": "z", "task": "t", "outcome": "success"})
    finally:
        stop.set()
        await task
    assert len(await read_all(redis, prefix)) == 31


async def test_publish_keeps_retrying_until_its_deadline(prefix):
    """A Redis that is away: the SDK retries until `publish_timeout`, not for a fixed handful of tries."""
    from deploy.embedded_redis import free_port

    client = EngramClient.connect(
        f"redis://127.0.0.1:{free_port()}/0", namespace="ns", prefix=prefix, publish_timeout=6.0
    )
    started = time.monotonic()
    with pytest.raises(PublishError, match="attempt"):
        await client.record({"task": "t", "outcome": "success"})
    assert time.monotonic() - started >= 5.8  # 8 tries with capped backoff gave up after 2.75–5.5 s
    await client.close()


async def test_record_validates_an_episode_built_in_code(redis, prefix):
    """An Episode object skips parse_episode; record() validates it anyway, naming the field."""
    import dataclasses

    from engram_episodic.errors import InvalidEpisode
    from engram_episodic.events import Episode, Task

    client = EngramClient(redis, namespace="ns", prefix=prefix)
    base = Episode(episode_id="code", task=Task(description="t"), outcome="success")
    for vector in ((1e39, 1.0), (10**30 * 10**30, 1.0)):
        with pytest.raises(InvalidEpisode, match="vector"):
            await client.record(dataclasses.replace(base, vector=vector))
    assert await client.record(dataclasses.replace(base, vector=(0.5, 1.0))) == "code"


async def test_publish_is_all_or_none_when_redis_is_out_of_memory(redis, prefix):
    """streams.publish is one script call: Redis refuses it whole under `maxmemory` (no event of the
    call is stored), the SDK raises PublishError, and the same call goes through once memory allows."""
    client = EngramClient(redis, namespace="ns", prefix=prefix, publish_timeout=1.0)
    await client.record({"episode_id": "before", "task": "t", "outcome": "success"})
    old = await redis.config_get("maxmemory")
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", max(1, used // 2))
    batch = [{"episode_id": f"b{i}", "task": "t", "outcome": "success"} for i in range(5)]
    try:
        with pytest.raises(PublishError, match="refused"):
            await client.publish([await _completed(client, e) for e in batch])
        assert [e.episode_id for e in await read_all(redis, prefix)] == ["before"]
    finally:
        await redis.config_set("maxmemory", old["maxmemory"])
    await client.publish([await _completed(client, e) for e in batch])
    assert [e.episode_id for e in await read_all(redis, prefix)] == ["before"] + [f"b{i}" for i in range(5)]


async def _completed(client: EngramClient, data: dict):
    from engram_episodic.events import EpisodeCompleted
    from engram_episodic.validation import parse_episode

    return EpisodeCompleted(
        namespace=client.namespace,
        episode_id=data["episode_id"],
        occurred_at=1.0,
        episode=parse_episode(data),
    )


async def test_a_timed_out_publish_says_the_events_may_be_stored(redis, prefix, monkeypatch):
    """A reply lost to a timeout is not "not published" (a large publish
    can time out client-side after Redis had stored every event): the error says "not confirmed" and
    sets maybe_stored; a retry with the same events is then deduplicated downstream by event_id."""
    from shared import sdk as sdk_module

    real = sdk_module.streams.publish

    async def reply_lost(r, stream, payloads, **kw):
        await real(r, stream, payloads, **kw)
        raise TimeoutError("no reply in time")

    monkeypatch.setattr(sdk_module.streams, "publish", reply_lost)
    client = EngramClient(redis, namespace="ns", prefix=prefix, retries=0)
    event = await _completed(client, {"episode_id": "late", "task": "t", "outcome": "success"})
    with pytest.raises(PublishError, match="not confirmed.*may have stored") as info:
        await client.publish([event])
    assert info.value.maybe_stored
    assert [e.event_id for e in await read_all(redis, prefix)] == [event.event_id]


async def test_publish_names_an_item_that_is_not_an_event_and_publishes_nothing(redis, prefix):
    client = EngramClient(redis, namespace="ns", prefix=prefix)
    good = await _completed(client, {"episode_id": "ok", "task": "t", "outcome": "success"})
    with pytest.raises(InvalidEpisode) as info:
        await client.publish([good, {"task": "x"}, None])
    assert [f for f, _ in info.value.errors] == ["events[1]", "events[2]"]
    assert "not dict" in str(info.value) and await read_all(redis, prefix) == []
    for not_a_list in (None, good, "events"):
        with pytest.raises(InvalidEpisode, match="events: must be a list of Engram events"):
            await client.publish(not_a_list)
    # a generator is published, not used up by the check (it returned [] and stored nothing)
    assert len(await client.publish(e for e in [good])) == 1
    assert [e.event_id for e in await read_all(redis, prefix)] == [good.event_id]


async def test_backpressure_is_the_lag_of_the_publishers_partition(redis, prefix):
    from engram_episodic.errors import Backpressure

    keys = Keys(prefix, 4)
    busy, calm = (
        "ns-busy",
        next(f"ns-{i}" for i in range(100) if keys.partition(f"ns-{i}") != keys.partition("ns-busy")),
    )
    await streams.Partitions(redis, keys.streams, "consolidator").ensure()
    filler = EngramClient(redis, namespace=busy, prefix=prefix, partitions=4)
    for i in range(30):
        await filler.record({"episode_id": f"f{i}", "task": "t", "outcome": "success"})
    assert await streams.StreamGroup(redis, keys.stream_of(busy), "consolidator").lag() == 30
    assert await streams.Partitions(redis, keys.streams, "consolidator").lag() == 30
    strict = EngramClient(
        redis, namespace=busy, prefix=prefix, max_lag=10, wait_on_backpressure=False, partitions=4
    )
    with pytest.raises(Backpressure):
        await strict.record({"episode_id": "x", "task": "t", "outcome": "success"})
    # another namespace's partition does not lag: its publisher is not held back
    other = EngramClient(
        redis, namespace=calm, prefix=prefix, max_lag=10, wait_on_backpressure=False, partitions=4
    )
    await other.record({"episode_id": "y", "task": "t", "outcome": "success"})
    assert await redis.xlen(keys.stream_of(calm)) == 1


async def test_the_documented_stream_sdk_example_publishes_with_make_runs_key(
    redis, prefix, redis_url, tmp_path
):
    """docs/architecture.md "Publishing next to Redis", run as written (this test's Redis and prefix put
    in): make run seals its stream, so the example passes the key, read where that make run keeps it —
    for a stack on another ENGRAM_REDIS_PORT, `.run/redis-<port>/master.key` (the example once read
    `.run/master.key` whatever the port)."""
    import asyncio
    import os
    import sys
    from pathlib import Path

    from shared.crypto import generate_master_key_file

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "architecture.md").read_text()
    start = doc.index("### Publishing next to Redis")
    code = doc[doc.index("```python\n", start) + len("```python\n") :]
    code = code[: code.index("\n```")]
    (tmp_path / ".run" / "redis-16379").mkdir(parents=True)
    generate_master_key_file(tmp_path / ".run" / "redis-16379" / "master.key")
    for documented, actual in (
        ('f"redis://127.0.0.1:{port}/0"', repr(redis_url)),
        ('namespace="default",', f'namespace="default", prefix={prefix!r},'),
    ):
        assert documented in code, documented
        code = code.replace(documented, actual)
    # a second stack's environment, in a checkout (tmp_path) where make run kept its data
    env = {k: v for k, v in os.environ.items() if k not in ("ENGRAM_DATA_DIR", "ENGRAM_MASTER_KEY_FILE")}
    env["ENGRAM_REDIS_PORT"] = "16379"
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "client"), env.get("PYTHONPATH", "")])
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert await redis.xlen(Keys(prefix).stream) == 5  # started, two actions, completed; one record
