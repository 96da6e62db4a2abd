"""The consolidator against the real Redis: idempotence, ordering, dead letters, forgetting, replay."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import msgpack
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from engram_episodic.errors import ConfigError, Conflict
from engram_episodic.events import (
    Action,
    ActionRecorded,
    Episode,
    EpisodeCompleted,
    EpisodeStarted,
    Feedback,
    Task,
    UserForgotten,
)
from engram_episodic.validation import parse_episode
from services.consolidator.deadletters import list_dead_letters, redrive
from services.consolidator.replay import replay
from services.consolidator.worker import Worker
from shared import streams
from shared.codec import encode
from shared.embedding import HashingEmbedder
from shared.index import Scope, count, current_generation, filter_search, generation_tags
from shared.keyring import deployment_tag_key
from shared.keys import Keys
from shared.sdk import EngramClient
from shared.tags import BLAKE2B
from tests.helpers import hit_id, leaked_text, wait_until


def make_worker(settings, redis, name="w1", **kw) -> Worker:
    return Worker(settings, redis, HashingEmbedder(settings.embed_dim), name=name, **kw)


async def drain(*workers: Worker, rounds: int = 200) -> None:
    """Run turns on every worker until none finds anything to do in as many rounds in a row as there are
    stream partitions: a turn reclaims from one partition (the rotation of `Worker.turn`), so one idle
    round proves nothing about the others' pending entries."""
    for w in workers:
        await w.setup()
    needed, idle = max(len(w.keys.streams) for w in workers), 0
    for _ in range(rounds):
        done = await asyncio.gather(*(w.turn() for w in workers))
        idle = 0 if any(done) else idle + 1
        if idle >= needed:
            return
    raise AssertionError("workers never drained the stream")


async def docs(
    redis,
    keys: Keys,
    namespace: str,
    status: str | None = "completed",
    *,
    master_key: bytes | None = None,
    **scope,
):
    """The live generation's documents of `namespace` by episode id (ids digested as that generation's
    TAG fields hold them: pass the deployment's `master_key` when it has one)."""
    try:
        tags = await generation_tags(
            redis,
            keys,
            await current_generation(redis, keys),
            await deployment_tag_key(redis, keys, master_key),
        )
    except ConfigError:  # keyed digests and no key: fine while no id is filtered on
        if {"user_id", "session_id", "episode_id"} & set(scope):
            raise
        tags = BLAKE2B
    _, hits = await filter_search(
        redis,
        keys.episode_index_alias,
        Scope(tags=tags, namespace=namespace, status=status, **scope),
        return_fields=("doc", "status"),
        limit=10_000,
    )
    return {hit_id(h): h.fields for h in hits}


def episode(eid: str, **kw) -> dict:
    return {
        "episode_id": eid,
        "task": {"description": f"task {eid} fix the flaky test", "category": "debugging"},
        "outcome": "success",
        "feedback": {"reward": 1.0},
        **kw,
    }


async def test_a_duplicate_publish_indexes_once(settings, redis):
    """Case C01: the same episode published three times, as a client's retries would, is indexed once."""
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    for _ in range(3):
        await client.record(episode("same-id"))
    worker = make_worker(settings, redis)
    await drain(worker)
    keys = Keys(settings.prefix)
    assert list(await docs(redis, keys, "ns")) == ["same-id"]
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == 1


async def test_two_workers_given_one_episodes_duplicates_at_once_index_it_once(settings, redis):
    """Case C02: two workers reading duplicate entries of one episode at once index one document."""
    keys = Keys(settings.prefix)
    ev = EpisodeCompleted(
        namespace="ns",
        episode_id="e",
        occurred_at=1.0,
        episode=Episode(episode_id="e", task=Task(description="t"), outcome="success", completed_at=1.0),
    )
    await streams.publish(redis, keys.stream, [encode(ev)] * 10)
    w1, w2 = make_worker(settings, redis, "a"), make_worker(settings, redis, "b")
    w1.settings = w2.settings = settings.with_(batch_size=5)
    await drain(w1, w2)
    assert list(await docs(redis, keys, "ns")) == ["e"]
    assert (await streams.StreamGroup(redis, keys.stream, settings.consumer_group).info())["pending"] == 0


async def test_order_tolerant_actions_before_start_completion_first(settings, redis):
    keys = Keys(settings.prefix)
    ep = Episode(episode_id="e", agent_id="ag", task=Task(description="migrate db", category="architecture"))
    start = EpisodeStarted(namespace="ns", episode_id="e", occurred_at=10.0, episode=ep)
    a1 = ActionRecorded(
        namespace="ns", episode_id="e", occurred_at=11.0, action=Action(action_type="plan", timestamp=11.0)
    )
    a2 = ActionRecorded(
        namespace="ns",
        episode_id="e",
        occurred_at=12.0,
        action=Action(action_type="apply", timestamp=12.0, error="lock timeout"),
    )
    done = EpisodeCompleted(
        namespace="ns",
        episode_id="e",
        occurred_at=13.0,
        episode=dataclasses.replace(ep, outcome="failure", completed_at=13.0, started_at=10.0),
    )
    await streams.publish(redis, keys.stream, [encode(e) for e in (done, a2, a1, start, a1)])
    await drain(make_worker(settings, redis))
    found = await docs(redis, keys, "ns")
    data = json.loads(found["e"][b"doc"])
    assert [a["action_type"] for a in data["actions"]] == ["plan", "apply"]
    assert data["outcome"] == "failure" and data["agent_id"] == "ag"


class CountingEmbedder(HashingEmbedder):
    """The hashing embedder, counting the texts it embeds; `during_embed` runs inside each call."""

    def __init__(self, dim: int):
        super().__init__(dim)
        self.texts: list[str] = []
        self.during_embed = None

    async def embed(self, texts):
        self.texts += list(texts)
        if self.during_embed is not None:
            hook, self.during_embed = self.during_embed, None
            await hook()
        return await super().embed(texts)


async def test_episode_begun_in_an_earlier_batch_is_folded_whole_and_embedded_once(settings, redis):
    """The fast path folds only the events in hand; when the episode's start came in an earlier batch
    its single script refuses, the stored set is folded, and the vector already computed is reused."""
    keys = Keys(settings.prefix)
    ep = Episode(
        episode_id="e", agent_id="ag", task=Task(description="rotate the signing keys", category="ops")
    )
    start = EpisodeStarted(namespace="ns", episode_id="e", occurred_at=10.0, episode=ep)
    act = ActionRecorded(
        namespace="ns", episode_id="e", occurred_at=11.0, action=Action(action_type="revoke", timestamp=11.0)
    )
    done = EpisodeCompleted(
        namespace="ns",
        episode_id="e",
        occurred_at=13.0,
        episode=Episode(
            episode_id="e",
            task=Task(description="rotate the signing keys", category="ops"),
            outcome="success",
            completed_at=13.0,
        ),
    )
    embedder = CountingEmbedder(settings.embed_dim)
    worker = Worker(settings, redis, embedder, name="w1")
    await streams.publish(redis, keys.stream, [encode(start), encode(act)])
    await drain(worker)
    assert (await docs(redis, keys, "ns", status="draft"))["e"][b"status"] == b"draft"
    conflicts = worker.metrics.write_conflicts._value.get()
    await streams.publish(redis, keys.stream, [encode(done)])
    await drain(worker)
    data = json.loads((await docs(redis, keys, "ns"))["e"][b"doc"])
    assert data["agent_id"] == "ag" and [a["action_type"] for a in data["actions"]] == ["revoke"]
    assert embedder.texts == ["rotate the signing keys"]
    assert (
        worker.metrics.write_conflicts._value.get() == conflicts
    )  # a refusal of the fast path is not a conflict


async def test_event_recorded_by_another_worker_during_the_fast_path_is_not_lost(settings, redis):
    """Worker A folds a whole completion and, while it embeds, worker B records an action of the same
    episode. A's script must see the extra event and fold again: the document holds the action."""
    keys = Keys(settings.prefix)
    ep = Episode(
        episode_id="e", task=Task(description="upgrade the parser"), outcome="success", completed_at=5.0
    )
    done = EpisodeCompleted(namespace="ns", episode_id="e", occurred_at=5.0, episode=ep)
    act = ActionRecorded(
        namespace="ns", episode_id="e", occurred_at=4.0, action=Action(action_type="late-step", timestamp=4.0)
    )
    embedder = CountingEmbedder(settings.embed_dim)
    worker_a = Worker(settings, redis, embedder, name="a")
    worker_b = make_worker(settings, redis, "b")
    await worker_a.setup()
    await worker_b.setup()
    await streams.publish(redis, keys.stream, [encode(done)])
    group = streams.StreamGroup(redis, keys.stream, settings.consumer_group)
    entries = await group.read_new("a", count=10, block_ms=1)

    async def b_records_the_action():
        await streams.publish(redis, keys.stream, [encode(act)])
        assert await worker_b.turn() == 1

    embedder.during_embed = b_records_the_action
    result = await worker_a.projector.apply(entries)
    assert len(result.ok) == 1 and not result.dead
    data = json.loads((await docs(redis, keys, "ns"))["e"][b"doc"])
    assert [a["action_type"] for a in data["actions"]] == ["late-step"]
    assert embedder.texts == ["upgrade the parser"]


async def test_draft_is_not_recallable_until_completed(settings, redis):
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    worker = make_worker(settings, redis)
    rec = client.episode(task="long running job")
    await rec.__aenter__()
    await drain(worker)
    assert await docs(redis, keys, "ns") == {}
    assert list(await docs(redis, keys, "ns", status="draft")) == [rec.episode_id]
    await rec.complete("success")
    await drain(worker)
    assert list(await docs(redis, keys, "ns")) == [rec.episode_id]


async def test_poison_entries_go_to_dead_letters_and_the_good_ones_are_indexed(settings, redis):
    """Case C11: of 12 events, the undecodable, the unknown-version and the invalid one go to the dead-letter
    stream with their stream id and reason; the 9 good ones are indexed and the worker keeps running."""
    keys = Keys(settings.prefix)
    good = [
        encode(
            EpisodeCompleted(
                namespace="ns",
                episode_id=f"g{i}",
                occurred_at=1.0,
                episode=Episode(
                    episode_id=f"g{i}",
                    task=Task(description=f"good {i}"),
                    outcome="success",
                    completed_at=1.0,
                ),
            )
        )
        for i in range(9)
    ]
    undecodable = b"\x00\xffnot msgpack"
    unknown_version = msgpack.packb({"type": "EpisodeCompleted", "v": 99, "data": {}})
    invalid = msgpack.packb(
        {
            "type": "EpisodeCompleted",
            "v": 2,
            "data": {
                "event_id": "x",
                "namespace": "ns",
                "occurred_at": 1.0,
                "episode_id": "bad",
                "episode": {"episode_id": "bad", "task": {"description": "t"}, "importance": 99},
            },
        }
    )
    batch = good[:3] + [undecodable] + good[3:6] + [unknown_version] + good[6:] + [invalid]
    ids = await streams.publish(redis, keys.stream, batch)
    worker = make_worker(settings, redis)
    await drain(worker)
    assert len(await docs(redis, keys, "ns")) == 9
    dead = await list_dead_letters(redis, keys)
    assert [d.stream_id for d in dead] == [ids[3].decode(), ids[7].decode(), ids[11].decode()]
    assert "DecodeError" in dead[0].reason and "UnknownSchemaVersion" in dead[1].reason
    assert "importance" in dead[2].reason and dead[0].payload == undecodable
    assert (await streams.StreamGroup(redis, keys.stream, settings.consumer_group).info())["pending"] == 0
    # re-drive after a "fix": the undecodable one fails again and comes back with a new id
    assert await redrive(redis, keys, [dead[0]]) == 1
    await drain(worker)
    again = await list_dead_letters(redis, keys)
    assert len(again) == 3 and again[-1].payload == undecodable


async def test_vector_dimension_mismatch_is_dead_lettered(settings, redis):
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.record(episode("ok", vector=[1.0] * settings.embed_dim))
    await client.record(episode("wrong", vector=[1.0, 2.0]))
    await drain(make_worker(settings, redis))
    keys = Keys(settings.prefix)
    assert list(await docs(redis, keys, "ns")) == ["ok"]
    (dead,) = await list_dead_letters(redis, keys)
    assert "episode.vector" in dead.reason and "expects 256" in dead.reason


async def test_forgetting_an_episode_deletes_its_dead_lettered_events_too(settings, redis):
    """A dead-lettered event that names its episode (here: a vector of the wrong dimension) holds the
    episode's data twice, in the stream and in the dead letters; forgetting the episode deletes both,
    and a later event of the forgotten episode is deleted rather than dead-lettered."""
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    worker = make_worker(settings, redis)
    await client.record(episode("fz", solution="SECRET-Z", vector=[0.1] * 5))
    await client.record(episode("fz", solution="SECRET-Z"))
    await drain(worker)
    assert len(await list_dead_letters(redis, keys)) == 1

    async def secret_anywhere() -> list[str]:
        found = []
        for stream in (keys.stream, keys.dead_letters):
            for _sid, fields in await redis.xrange(stream):
                if any(b"SECRET-Z" in v for v in fields.values()):
                    found.append(stream)
        return found

    assert await secret_anywhere() == [keys.stream, keys.stream, keys.dead_letters]
    await client.forget_episode("fz")
    await drain(worker)
    assert await secret_anywhere() == []
    assert await list_dead_letters(redis, keys) == []
    await client.record(episode("fz", solution="SECRET-Z", vector=[0.1] * 5))  # late, and invalid
    await drain(worker)
    assert await secret_anywhere() == [] and await list_dead_letters(redis, keys) == []


async def test_forget_deletes_dead_letters_that_failed_decoding_and_of_unprojected_episodes(settings, redis):
    """Dead letters are linked to their episode and user from the raw envelope, so forgetting deletes
    them even when the event never decoded (a vector beyond float32 sent around the SDK's validation)
    and when the episode never had a document (forget_user finds documents through the index)."""
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    worker = make_worker(settings, redis)
    valid = EpisodeCompleted(
        namespace="ns",
        episode_id="raw",
        occurred_at=1.0,
        episode=parse_episode(episode("raw", solution="SECRET-R", user_id="ur")),
    )
    envelope = msgpack.unpackb(encode(valid), raw=False)
    envelope["data"]["episode"]["vector"] = [1e39] * settings.embed_dim  # undecodable: not float32
    await streams.publish(redis, keys.stream, [msgpack.packb(envelope)])
    await client.record(episode("never", solution="SECRET-N", user_id="un", vector=[0.1] * 3))
    await drain(worker)
    assert len(await list_dead_letters(redis, keys)) == 2

    async def holding(secret: bytes) -> int:
        n = 0
        for stream in (keys.stream, keys.dead_letters):
            n += sum(any(secret in v for v in f.values()) for _sid, f in await redis.xrange(stream))
        return n

    assert await holding(b"SECRET-R") == 2 and await holding(b"SECRET-N") == 2
    await client.forget_episode("raw")
    await client.forget_user("un")
    await drain(worker)
    assert await holding(b"SECRET-R") == 0 and await holding(b"SECRET-N") == 0
    assert await list_dead_letters(redis, keys) == []


async def test_redrive_moves_the_entry_instead_of_copying_it(settings, redis):
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.record(episode("rd", solution="ONCE-ONLY", vector=[0.1] * 3, user_id="ru"))
    await drain(make_worker(settings, redis))
    (letter,) = await list_dead_letters(redis, keys)
    assert await redrive(redis, keys, await list_dead_letters(redis, keys)) == 1
    copies = [sid for sid, f in await redis.xrange(keys.stream) if b"ONCE-ONLY" in f[b"e"]]
    assert len(copies) == 1 and await list_dead_letters(redis, keys) == []
    assert letter.stream_id.encode() not in await redis.hkeys(
        keys.dead_letter_refs("ns", "rd")
    )  # no stale link


async def test_dead_letter_links_are_dropped_with_the_episode_and_foreign_entries_are_dead_lettered(
    settings, redis
):
    """Forgetting an episode drops its id from its user's set of dead-lettered episodes (no ids of
    forgotten data stay behind), and an entry without Engram's payload field is dead-lettered, not
    mistaken for one a forget deleted."""
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    worker = make_worker(settings, redis)
    await client.record(episode("linked", vector=[0.1] * 3, user_id="lu"))
    await redis.xadd(keys.stream, {"x": b"not ours"})
    await drain(worker)
    reasons = sorted(d.reason for d in await list_dead_letters(redis, keys))
    assert len(reasons) == 2 and "no payload field 'e'" in reasons[0]
    assert await redis.smembers(keys.user_dead_letters("ns", "lu")) == {b"linked"}
    await client.forget_episode("linked")
    await drain(worker)
    assert await redis.smembers(keys.user_dead_letters("ns", "lu")) == set()
    assert not await redis.exists(keys.dead_letter_refs("ns", "linked"))


async def test_a_long_text_is_stored_whole_and_embedded_truncated(settings, redis):
    """Case C10: a ~200,000-character text and a long CJK one are stored whole, embedded truncated
    and counted."""
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    long_text = "migrate the schema " * 10_527  # ~200,000 characters
    cjk = "数据库迁移失败需要重试" * 2000
    await client.record(episode("long", task={"description": long_text}))
    await client.record(episode("cjk", task={"description": cjk}))
    worker = make_worker(settings, redis)
    await drain(worker)
    import json

    found = await docs(redis, Keys(settings.prefix), "ns")
    assert json.loads(found["long"][b"doc"])["task"]["description"] == long_text
    assert json.loads(found["cjk"][b"doc"])["task"]["description"] == cjk
    assert worker.embedder.truncations == 2
    assert worker.metrics.truncations._value.get() == 2


@pytest.mark.parametrize("value", ["a,b", "x|y", "ns:with:colons", "{curly}", "日本語", "emoji-🙂", "_"])
async def test_ids_and_tag_values_with_syntax_characters_are_projected_exactly(settings, redis, value):
    """Cases C12 and C18: ids and tag values holding separators or query syntax match exactly, never split."""
    client = EngramClient(redis, namespace=value, prefix=settings.prefix)
    await client.record(
        episode(
            value,
            agent_id=value,
            user_id=value,
            session_id=value,
            strategy_used=value,
            task={"description": "t", "category": value},
        )
    )
    await client.record(
        episode(value + "x", agent_id=value + "x", task={"description": "t", "category": value + "x"})
    )
    await drain(make_worker(settings, redis))
    keys = Keys(settings.prefix)
    for scope in (
        {"agent_id": value},
        {"user_id": value},
        {"session_id": value},
        {"category": (value,)},
        {"strategy": (value,)},
    ):
        assert list(await docs(redis, keys, value, **scope)) == [value], scope


async def test_forgetting_a_user_leaves_another_user_untouched(settings, redis):
    """Case C07: forgetting every episode of one user leaves another user's documents and counts untouched."""
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    for i in range(4):
        await client.record(episode(f"a{i}", user_id="user-a"))
        await client.record(episode(f"b{i}", user_id="user-b"))
    worker = make_worker(settings, redis)
    await drain(worker)
    before_b = await docs(redis, keys, "ns", user_id="user-b")
    await client.forget_user("user-a")
    await drain(worker)
    assert await docs(redis, keys, "ns", user_id="user-a") == {}
    assert await docs(redis, keys, "ns", user_id="user-b") == before_b
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == 4


async def test_forget_user_processed_after_a_newer_episode_keeps_that_episode(settings, redis):
    """A forget erases what the user did up to it, in any processing order: an episode that began after
    the forget survives even when its document was written before the forget was processed (lanes and
    workers reorder); one that began before is erased."""
    keys = Keys(settings.prefix)
    worker = make_worker(settings, redis)

    def completed(eid: str, at: float) -> EpisodeCompleted:
        return EpisodeCompleted(
            namespace="ns",
            episode_id=eid,
            occurred_at=at,
            episode=Episode(
                episode_id=eid,
                user_id="u",
                task=Task(description=f"task {eid}"),
                outcome="success",
                completed_at=at,
            ),
        )

    await streams.publish(
        redis, keys.stream, [encode(completed("old", 100.0)), encode(completed("new", 300.0))]
    )
    await drain(worker)
    forget = UserForgotten(namespace="ns", user_id="u", occurred_at=200.0)
    await streams.publish(redis, keys.stream, [encode(forget)])
    await drain(worker)
    assert list(await docs(redis, keys, "ns", user_id="u")) == ["new"]
    assert await redis.exists(keys.tombstone("ns", "old")) and not await redis.exists(
        keys.tombstone("ns", "new")
    )


async def test_forgotten_data_never_returns_after_a_replay(settings, redis):
    """Case C08: an episode, then a whole user, forgotten never come back, not even after a full replay."""
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    async with client.episode(task="secret task one", user_id="u1") as ep:
        await ep.action("shell", input="cat secrets.txt")
        await ep.complete("success")
    await client.record(episode("keep", user_id="u2"))
    await client.record(episode("u1-other", user_id="u1"))
    worker = make_worker(settings, redis)
    await drain(worker)
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == 3
    await client.forget_episode(ep.episode_id)
    await drain(worker)
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == 2
    await client.forget_user("u1")
    await drain(worker)
    assert list(await docs(redis, keys, "ns")) == ["keep"]
    # the stream no longer holds the forgotten data
    raw = b"".join(e.payload or b"" for e in await streams.read_range(redis, keys.stream))
    assert b"secret task one" not in raw
    assert b"cat secrets.txt" not in raw
    assert b"task u1-other" not in raw
    assert b"task keep" in raw
    # late duplicate of a forgotten episode's event does not resurrect it
    await client.record(episode(ep.episode_id, user_id="u1"))
    await drain(worker)
    await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert list(await docs(redis, keys, "ns")) == ["keep"]
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns", status=None)) == 1
    assert (
        await leaked_text(redis, settings.prefix, ["secret task one", "secrets.txt", "task u1-other"]) == []
    )


async def test_replay_equals_live_projection(settings, redis):
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    for i in range(20):
        async with client.episode(
            task=f"task {i % 4} about {'db' if i % 2 else 'ui'}", user_id=f"u{i % 3}"
        ) as ep:
            await ep.action("edit", input=f"file{i}.py", success=i % 2 == 0)
            await ep.complete(["success", "failure", "partial"][i % 3], feedback={"reward": i / 20})
    worker = make_worker(settings, redis)
    await drain(worker)
    live = await docs(redis, keys, "ns", status=None)
    live_vectors = {eid: await redis.hget(keys.episode_doc(1, "ns", eid), "vector") for eid in live}
    result = await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert result["generation"] == 2
    rebuilt = await docs(redis, keys, "ns", status=None)
    assert rebuilt == live
    assert {eid: await redis.hget(keys.episode_doc(2, "ns", eid), "vector") for eid in live} == live_vectors
    assert not [k async for k in redis.scan_iter(match=f"{keys.gen_prefix(1)}*")]
    # workers follow the new generation
    await client.record(episode("after-replay"))
    await drain(worker)
    assert "after-replay" in await docs(redis, keys, "ns")


async def test_reindex_with_other_embedder_is_a_conflict_for_an_old_workers_turn(settings, redis):
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.record(episode("e1"))
    worker = make_worker(settings, redis)
    await drain(worker)
    other = HashingEmbedder(64)
    other.name = "hashing-64"
    await replay(settings, redis, other)
    assert list(await docs(redis, keys, "ns")) == ["e1"]
    with pytest.raises(Conflict, match="engram-admin reindex"):
        await worker.turn()


async def test_a_running_worker_pauses_on_another_embedders_index_and_resumes_when_it_returns(
    settings, redis, caplog
):
    """A reindex under a running worker must not make it exit 2, which would stop `make run`."""
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    worker = make_worker(settings, redis)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await client.record(episode("e1"))
        await wait_until(lambda: _has(redis, keys, "e1"), message="e1 projected")
        await replay(settings, redis, HashingEmbedder(64))  # the index now has 64 dimensions, the worker 256
        await wait_until(lambda: worker.paused_by is not None, message="the worker paused")
        assert "paused: index generation 2 now uses embedder 'hashing-v1' (dim 64)" in caplog.text
        assert "restarted with ENGRAM_EMBEDDER=hashing ENGRAM_EMBED_DIM=64" in caplog.text
        await client.record(episode("e2"))
        group = settings.consumer_group
        await wait_until(lambda: _unprojected(redis, keys.stream, group, 1), message="e2 left in the stream")
        assert not running.done() and "e2" not in await docs(redis, keys, "ns")
        await replay(settings, redis, worker.embedder)  # back to the worker's embedder (generation 3)
        await wait_until(lambda: worker.paused_by is None, message="the worker resumed")
        assert "resuming" in caplog.text
        await client.record(episode("e3"))
        await wait_until(lambda: _has(redis, keys, "e3"), message="e3 projected by the resumed worker")
        # e2, left pending if a lane had read it, is reclaimed after the lease and acked
        await wait_until(lambda: _unprojected(redis, keys.stream, group, 0), timeout=20, message="all acked")
        assert {"e1", "e2", "e3"} == set(await docs(redis, keys, "ns"))
    finally:
        stop.set()
        await running


async def _has(redis, keys: Keys, episode_id: str) -> bool:
    from redis.exceptions import ResponseError

    try:
        return episode_id in await docs(redis, keys, "ns")
    except ResponseError:  # no index yet: the worker is still starting
        return False


async def _unprojected(redis, stream: str, group: str, n: int) -> bool:
    """The group has `n` entries not acked: never read (lag) or read and left pending."""
    info = await streams.StreamGroup(redis, stream, group).info()
    return info["lag"] + info["pending"] == n


EPISODE_IDS = ["e0", "e1", "e2"]


def _events_for(eid: str, n_actions: int) -> list:
    ep = Episode(episode_id=eid, user_id="u", agent_id="planner", task=Task(description=f"task {eid}"))
    out = [EpisodeStarted(namespace="ns", episode_id=eid, occurred_at=1.0, episode=ep, event_id=f"{eid}-s")]
    for j in range(n_actions):
        out.append(
            ActionRecorded(
                namespace="ns",
                episode_id=eid,
                occurred_at=2.0 + j,
                event_id=f"{eid}-a{j}",
                action=Action(action_type=f"step{j}", timestamp=2.0 + j),
            )
        )
    out.append(
        EpisodeCompleted(
            namespace="ns",
            episode_id=eid,
            occurred_at=9.0,
            event_id=f"{eid}-c",
            episode=dataclasses.replace(ep, outcome="partial", completed_at=9.0, agent_id="executor"),
        )
    )
    return out


@hsettings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.randoms(use_true_random=False), st.integers(2, 3), st.integers(1, 4))
async def test_property_interleaving_and_duplication_across_workers(
    settings, redis, rnd: random.Random, n_workers: int, batch: int
):
    base = [e for eid in EPISODE_IDS for e in _events_for(eid, 3)]
    # sequential replay = the reference projection
    ref_settings = settings.with_(prefix=settings.prefix + f"ref{rnd.random()}:")
    ref_keys = Keys(ref_settings.prefix)
    await streams.publish(redis, ref_keys.stream, [encode(e) for e in base])
    await drain(make_worker(ref_settings, redis))
    expected = await docs(redis, ref_keys, "ns", status=None)
    # shuffled + duplicated across N concurrent workers
    shuffled = base + [rnd.choice(base) for _ in range(6)]
    rnd.shuffle(shuffled)
    run_settings = settings.with_(prefix=settings.prefix + f"run{rnd.random()}:", batch_size=batch)
    run_keys = Keys(run_settings.prefix)
    await streams.publish(redis, run_keys.stream, [encode(e) for e in shuffled])
    workers = [make_worker(run_settings, redis, f"w{i}") for i in range(n_workers)]
    await drain(*workers)
    got = await docs(redis, run_keys, "ns", status=None)
    assert got == expected
    assert len(got) == 3 and all(json.loads(d[b"doc"])["agent_id"] == "executor" for d in got.values())
    for p in (ref_settings.prefix, run_settings.prefix):
        async for k in redis.scan_iter(match=f"{p}*"):
            await redis.unlink(k)
        for name in await redis.execute_command("FT._LIST"):
            if name.decode().startswith(p):
                await redis.execute_command("FT.DROPINDEX", name)


async def test_worker_run_loop_stops_gracefully(settings, redis):
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    worker = make_worker(settings, redis)
    await worker.setup()
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    for i in range(5):
        await client.record(episode(f"r{i}"))
    keys = Keys(settings.prefix)
    await wait_until(lambda: _count_is(redis, keys, 5), message="5 projected")
    stop.set()
    await asyncio.wait_for(task, 10)
    assert (await streams.StreamGroup(redis, keys.stream, settings.consumer_group).info())["pending"] == 0
    # it removed itself from the group (restarted workers used to pile up in XINFO CONSUMERS)
    assert await redis.xinfo_consumers(keys.stream, settings.consumer_group) == []


async def test_in_flight_lanes_overlap_batches_and_project_each_episode_once(settings, redis):
    """Settings.in_flight: one worker projects several batches at once, and still exactly once."""
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.publish(
        [
            EpisodeCompleted(
                namespace="ns", episode_id=f"l{i}", occurred_at=1.7e9, episode=parse_episode(episode(f"l{i}"))
            )
            for i in range(600)
        ]
    )
    worker = make_worker(dataclasses.replace(settings, in_flight=3, batch_size=40, block_ms=20), redis)
    live, peak = 0, 0
    apply = None

    async def counting_apply(entries):
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        try:
            return await apply(entries)
        finally:
            live -= 1

    await worker.setup()
    apply = worker.projector.apply
    worker.projector.apply = counting_apply
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    keys = Keys(settings.prefix)
    await wait_until(lambda: _count_is(redis, keys, 600), message="600 projected", timeout=60)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert peak >= 2, "batches never overlapped"
    assert (await streams.StreamGroup(redis, keys.stream, settings.consumer_group).info())["pending"] == 0
    assert len(await docs(redis, keys, "ns")) == 600


class SlowEmbedder(HashingEmbedder):
    """Hashing vectors after a delay; counts the texts it embedded."""

    def __init__(self, dim: int, delay: float):
        super().__init__(dim)
        self.delay, self.texts = delay, 0

    async def embed(self, texts):
        self.texts += len(texts)
        await asyncio.sleep(self.delay)
        return await super().embed(texts)


async def test_a_batch_slower_than_its_lease_is_renewed_not_reclaimed(settings, redis):
    """A slow embedder must not make a second worker reclaim, and project again, a batch in hand."""
    s = dataclasses.replace(settings, lease_ms=1000, block_ms=20)
    client = EngramClient(redis, namespace="ns", prefix=s.prefix)
    for i in range(3):
        await client.record(episode(f"s{i}"))
    slow = SlowEmbedder(s.embed_dim, delay=3.0)
    a = Worker(s, redis, slow, name="slow")
    b = Worker(s, redis, HashingEmbedder(s.embed_dim), name="other")
    await a.setup()
    await b.setup()
    turn_a = asyncio.create_task(a.turn())
    keys = Keys(s.prefix)

    async def a_holds_the_batch() -> bool:
        return (await streams.StreamGroup(redis, keys.stream, s.consumer_group).info())["pending"] == 3

    await wait_until(a_holds_the_batch, message="the slow worker read the batch")
    stolen = 0
    while not turn_a.done():  # b's turn blocks up to block_ms (20 ms) when it finds nothing to reclaim
        stolen += await b.turn()
    assert await turn_a == 3
    assert stolen == 0 and slow.texts == 3, "the batch was reclaimed while its worker still held it"
    assert (await streams.StreamGroup(redis, keys.stream, s.consumer_group).info())["pending"] == 0


async def _count_is(redis, keys, n):
    return await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == n


async def test_malformed_facts_snapshot_is_dead_lettered_alone(settings, redis):
    from engram_episodic.events import FactsConsolidated

    keys = Keys(settings.prefix)
    bad = FactsConsolidated(
        namespace="ns", occurred_at=1.0, scope={"namespace": "ns"}, facts=({"garbage": True},)
    )
    good = [
        EpisodeCompleted(
            namespace="ns",
            episode_id=f"g{i}",
            occurred_at=1.0,
            episode=Episode(
                episode_id=f"g{i}", task=Task(description=f"good {i}"), outcome="success", completed_at=1.0
            ),
        )
        for i in range(4)
    ]
    ids = await streams.publish(
        redis, keys.stream, [encode(e) for e in (good[0], good[1], bad, good[2], good[3])]
    )
    await drain(make_worker(settings, redis))
    assert sorted(await docs(redis, keys, "ns")) == ["g0", "g1", "g2", "g3"]
    dead = await list_dead_letters(redis, keys)
    assert [d.stream_id for d in dead] == [ids[2].decode()]
    assert (await streams.StreamGroup(redis, keys.stream, settings.consumer_group).info())["pending"] == 0


async def test_unexpected_failure_isolated_to_its_entry_then_dead_lettered(settings, redis):
    """An entry that makes the projector fail (here: an embedder that cannot embed one text) does not
    hold its neighbours back; after max_deliveries it reaches the dead-letter stream with the error."""

    class PickyEmbedder(HashingEmbedder):
        async def _embed_batch(self, texts):
            if any("poison" in t for t in texts):
                raise RuntimeError("model crashed on this input")
            return await super()._embed_batch(texts)

    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    for eid in ("a", "b", "poison", "c"):
        await client.record(episode(eid, task={"description": f"{eid} task text"}))
    s = settings.with_(lease_ms=10, max_deliveries=2)
    worker = Worker(s, redis, PickyEmbedder(s.embed_dim), name="w")
    await drain(worker)
    assert sorted(await docs(redis, keys, "ns")) == ["a", "b", "c"]

    async def turn_then_count_dead() -> int:
        await worker.turn()  # the lease (10 ms) hands the culprit back; each turn is one more delivery
        return len(await list_dead_letters(redis, keys))

    await wait_until(turn_then_count_dead, message="poison dead-lettered", timeout=20)
    (dead,) = await list_dead_letters(redis, keys)
    assert "DeliveryLimit" in dead.reason and "model crashed" in dead.reason
    assert (await streams.StreamGroup(redis, keys.stream, s.consumer_group).info())["pending"] == 0


async def test_worker_reports_a_backlog_until_a_read_comes_back_empty(settings, redis):
    """`Worker.backlogged` (what background facts runs defer to) holds while reads return entries,
    full or not (the first reads of a burst are partial), and clears on an empty read."""
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    for i in range(6):
        await client.record(episode(f"b{i}"))
    worker = make_worker(settings.with_(batch_size=4, block_ms=1), redis)
    await worker.setup()
    assert await worker.turn() == 4 and worker.backlogged
    assert await worker.turn() == 2 and worker.backlogged
    assert await worker.turn() == 0 and not worker.backlogged


async def test_projected_document_is_byte_exact_episode_fields(settings, redis):
    """The scripts receive the document as one msgpack blob; what lands in the hash must be exactly
    `episode_fields` (non-ASCII text, the binary vector, numbers), on both write paths."""
    from shared.index import embedding_text, episode_fields

    keys = Keys(settings.prefix)
    data = episode(
        "ü-1",
        solution="résumé ✓ 日本語 \\ \" '",
        importance=7,
        agent_id="ag",
        feedback={"reward": 0.125, "message": "ok\u00a0fine"},
        started_at=1.7e9,
        completed_at=1.7e9 + 42.5,
    )
    parsed = parse_episode(data)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    await client.record(data)
    embedder = HashingEmbedder(settings.embed_dim)
    await drain(Worker(settings, redis, embedder, name="w1"))  # fast path
    stored = await redis.hgetall(keys.episode_doc(1, "ns", "ü-1"))
    vector = (await embedder.embed([embedding_text(parsed)]))[0]
    expected = episode_fields("ns", parsed, status="completed", vector=vector, tags=BLAKE2B)
    for name, value in expected.items():
        want = value if isinstance(value, bytes) else str(value).encode()
        assert stored[name.encode()] == want, name
    # slow path: an action recorded later re-folds from the stored events and rewrites the document
    await client.publish(
        [
            ActionRecorded(
                namespace="ns",
                episode_id="ü-1",
                occurred_at=1.0,
                action=Action(action_type="ß-step", timestamp=1.0),
            )
        ]
    )
    await drain(Worker(settings, redis, embedder, name="w1"))
    stored = await redis.hgetall(keys.episode_doc(1, "ns", "ü-1"))
    assert json.loads(stored[b"doc"])["actions"][0]["action_type"] == "ß-step"
    assert stored[b"vector"] == expected["vector"] and stored[b"solution"] == expected["solution"].encode()


async def test_fast_path_chunks_with_mixed_outcomes_keep_every_episode_apart(settings, redis):
    """One batch of 70 episodes (three script calls of up to 32) mixing: a tombstoned episode, one whose
    start was stored earlier (refused → slow path), one delivered twice in the batch (1 event, 2 stream
    ids), one with start and completion in hand (2 events). The arguments of each episode are walked by
    offset inside one call: a mistake there would shift every later episode's document."""
    from services.consolidator.projector import PROJECT_CHUNK

    keys = Keys(settings.prefix)
    worker = make_worker(settings.with_(batch_size=200), redis)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)

    def completed(i: int, **kw) -> EpisodeCompleted:
        ep = Episode(
            episode_id=f"m{i}",
            task=Task(description=f"mixed task number {i}"),
            outcome="success",
            completed_at=100.0 + i,
            importance=1 + i % 10,
            **kw,
        )
        return EpisodeCompleted(namespace="ns", episode_id=f"m{i}", occurred_at=100.0 + i, episode=ep)

    await client.publish([completed(5)])
    await drain(worker)
    await client.forget_episode("m5")
    early = EpisodeStarted(
        namespace="ns",
        episode_id="m17",
        occurred_at=1.0,
        episode=Episode(
            episode_id="m17", agent_id="early-agent", task=Task(description="mixed task number 17")
        ),
    )
    await client.publish([early])
    await drain(worker)
    batch = []
    for i in range(70):
        if i == 38:
            batch.append(
                EpisodeStarted(
                    namespace="ns",
                    episode_id="m38",
                    occurred_at=50.0,
                    episode=Episode(
                        episode_id="m38", session_id="s38", task=Task(description="mixed task number 38")
                    ),
                )
            )
        batch.append(completed(i))
        if i == 33:
            batch.append(completed(33))
    assert len(batch) > 2 * PROJECT_CHUNK
    await streams.publish(redis, keys.stream, [encode(e) for e in batch])
    # one apply of the whole batch (drain would hide a failing batch by retrying entry by entry)
    group = streams.StreamGroup(redis, keys.stream, settings.consumer_group)
    entries = await group.read_new("w1", count=500, block_ms=1)
    assert len(entries) == len(batch)
    result = await worker.projector.apply(entries)
    assert len(result.ok) == len(batch) and not result.dead
    await group.ack(result.ok)
    found = await docs(redis, keys, "ns")
    assert sorted(found) == sorted(f"m{i}" for i in range(70) if i != 5)
    for eid, fields in found.items():
        data = json.loads(fields[b"doc"])
        i = int(eid[1:])
        assert data["task"]["description"] == f"mixed task number {i}" and data["importance"] == 1 + i % 10
    assert json.loads(found["m17"][b"doc"])["agent_id"] == "early-agent"
    assert json.loads(found["m38"][b"doc"])["session_id"] == "s38"
    assert await redis.exists(keys.episode_doc(1, "ns", "m5")) == 0
    assert (await streams.StreamGroup(redis, keys.stream, settings.consumer_group).info())["pending"] == 0


async def test_model_embedder_never_embeds_unchanged_text_twice(settings, redis):
    """With an expensive embedder (`cheap = False`), a redelivered completion and a re-published one
    whose text did not change (only the reward) keep the stored vector; a changed text is embedded."""
    keys = Keys(settings.prefix)
    embedder = CountingEmbedder(settings.embed_dim)
    embedder.cheap = False
    worker = Worker(settings, redis, embedder, name="w1")
    first = EpisodeCompleted(
        namespace="ns",
        episode_id="r",
        occurred_at=10.0,
        event_id="r-1",
        episode=Episode(
            episode_id="r", task=Task(description="tune the cache"), outcome="success", completed_at=10.0
        ),
    )
    await streams.publish(redis, keys.stream, [encode(first)])
    await drain(worker)
    await streams.publish(redis, keys.stream, [encode(first)])  # redelivered / published twice
    await drain(worker)
    again = dataclasses.replace(
        first,
        event_id="r-2",
        occurred_at=20.0,
        episode=dataclasses.replace(first.episode, feedback=Feedback(reward=0.25)),
    )
    await streams.publish(redis, keys.stream, [encode(again)])
    await drain(worker)
    assert embedder.texts == ["tune the cache"]
    assert json.loads((await docs(redis, keys, "ns"))["r"][b"doc"])["feedback"]["reward"] == 0.25
    vector = await redis.hget(keys.episode_doc(1, "ns", "r"), "vector")
    assert vector == (await HashingEmbedder(settings.embed_dim).embed(["tune the cache"]))[0].tobytes()
    changed = dataclasses.replace(
        first,
        event_id="r-3",
        occurred_at=30.0,
        episode=dataclasses.replace(first.episode, solution="raised the TTL"),
    )
    await streams.publish(redis, keys.stream, [encode(changed)])
    await drain(worker)
    assert embedder.texts == ["tune the cache", "tune the cache\nraised the TTL"]
    # a start in an earlier batch: the completion is folded with it and embedded once, whole
    start = EpisodeStarted(
        namespace="ns",
        episode_id="s",
        occurred_at=40.0,
        episode=Episode(
            episode_id="s", task=Task(description="warm the cache"), observation="the cache is cold"
        ),
    )
    await streams.publish(redis, keys.stream, [encode(start)])
    await drain(worker)
    done = EpisodeCompleted(
        namespace="ns",
        episode_id="s",
        occurred_at=50.0,
        episode=Episode(
            episode_id="s", task=Task(description="warm the cache"), outcome="success", completed_at=50.0
        ),
    )
    await streams.publish(redis, keys.stream, [encode(done)])
    await drain(worker)
    assert embedder.texts[2:] == ["warm the cache\nthe cache is cold"]


async def test_republished_episode_with_emptied_text_is_not_found_by_its_old_words(settings, redis):
    """A re-published completion that empties a text field replaces the document: the old words leave
    the BM25 index, while what recall recorded (last_accessed, access_count) and the vector stay."""
    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    worker = make_worker(settings, redis)
    await client.record(
        episode(
            "z",
            thoughts="zebracorn workaround",
            completed_at=1.7e9,
            feedback={"reward": 1.0, "message": "quokkafeedback"},
        )
    )
    await drain(worker)
    doc_key = keys.episode_doc(1, "ns", "z")
    await redis.hset(
        doc_key, mapping={"last_accessed": "1700000500.0", "access_count": "3"}
    )  # a recall touched it
    vector = await redis.hget(doc_key, "vector")

    async def hits(query: str) -> int:
        return int(
            (await redis.execute_command("FT.SEARCH", keys.episode_index_alias, query, "NOCONTENT"))[0]
        )

    assert await hits("@thoughts:zebracorn") == 1 and await hits("@feedback_message:quokkafeedback") == 1
    # thoughts and the feedback message are not embedded: the text to embed is unchanged, so the
    # vector is not re-sent and must be carried over
    await client.record(
        episode("z", thoughts="", completed_at=1.7e9 + 1, feedback={"reward": 0.5, "message": ""})
    )
    await drain(worker)
    assert await hits("@thoughts:zebracorn") == 0 and await hits("@feedback_message:quokkafeedback") == 0
    stored = await redis.hgetall(doc_key)
    assert stored[b"last_accessed"] == b"1700000500.0" and stored[b"access_count"] == b"3"
    assert stored[b"vector"] == vector and stored[b"reward"] == b"0.5"
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == 1


async def test_agent_vector_near_float32_limits_is_stored_normalised(settings, redis):
    """An agent-supplied vector of huge (but float32-representable) numbers is normalised in float64:
    in float32 its norm overflowed and the stored vector came out zero."""
    import numpy as np

    keys = Keys(settings.prefix)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    vector = [3e38 if i % 2 else -1e38 for i in range(settings.embed_dim)]
    await client.record(episode("big", vector=vector))
    await drain(make_worker(settings, redis))
    stored = np.frombuffer(await redis.hget(keys.episode_doc(1, "ns", "big"), "vector"), dtype=np.float32)
    assert np.all(np.isfinite(stored)) and abs(float(np.linalg.norm(stored)) - 1.0) < 1e-5


async def test_lanes_of_one_process_keep_at_most_two_write_pipelines_in_redis(settings, redis, monkeypatch):
    """WRITES_IN_FLIGHT: four lanes' batches, all ready to write, queue for two turns instead of being
    served side by side (which made them finish together and compute together, with Redis idle); all
    are still projected."""
    import redis.asyncio.client as redis_client

    from services.consolidator.projector import WRITES_IN_FLIGHT

    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    for i in range(40):
        await client.record(episode(f"w{i}"))
    worker = make_worker(settings.with_(batch_size=10, in_flight=4), redis)
    await worker.setup()

    class Turns(asyncio.Semaphore):
        arrived = 0

        async def acquire(self):
            Turns.arrived += 1
            return await super().acquire()

    worker.projector._write_turns = Turns(WRITES_IN_FLIGHT)
    state = {"now": 0, "most": 0}
    execute = redis_client.Pipeline.execute

    async def counted(self, *args, **kwargs):
        if not any(c[0][0] == "EVALSHA" for c in self.command_stack):
            return await execute(self, *args, **kwargs)
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        try:  # hold the turn until every lane has a batch ready to write
            await wait_until(lambda: Turns.arrived == 4, message="four lanes ready to write")
            return await execute(self, *args, **kwargs)
        finally:
            state["now"] -= 1

    monkeypatch.setattr(redis_client.Pipeline, "execute", counted)
    assert sum(await asyncio.gather(*(worker.turn() for _ in range(4)))) == 40
    assert state["most"] == WRITES_IN_FLIGHT == 2
    assert (
        await count(redis, Keys(settings.prefix).episode_index_alias, Scope(tags=BLAKE2B, namespace="ns"))
        == 40
    )


async def test_dead_letter_cli_refuses_a_bad_limit_and_names_unknown_redrive_ids(
    settings, redis, monkeypatch
):
    """`dead-letters --limit 0` is a clear error, not a traceback, and `redrive 1-1` (no such dead
    letter) names the unknown id and exits 1 instead of saying "re-driven 0" and exiting 0."""
    from click.testing import CliRunner

    from services.admin import cli

    monkeypatch.setenv("REDIS_URL", settings.redis_url)
    monkeypatch.setenv("ENGRAM_PREFIX", settings.prefix)
    await redis.xadd(Keys(settings.prefix).stream, {b"x": b"not ours"})  # dead-lettered: no payload field
    worker = make_worker(settings, redis)
    await worker.setup()
    await worker.turn()
    dead = await list_dead_letters(redis, Keys(settings.prefix))

    def invoke(*args):
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    out = await asyncio.to_thread(invoke, "dead-letters", "--limit", "0")
    assert out.exit_code == 2 and "--limit" in out.output and "Traceback" not in out.output
    out = await asyncio.to_thread(invoke, "redrive", "--all", "1-1")
    assert out.exit_code == 2 and "not both" in out.output
    out = await asyncio.to_thread(invoke, "redrive", "1-1", dead[0].dead_id)
    assert (
        out.exit_code == 1
        and "re-driven 1" in out.output
        and "no dead letter has the id(s) 1-1" in out.output
    )
    assert dead[0].dead_id not in [d.dead_id for d in await list_dead_letters(redis, Keys(settings.prefix))]


async def test_a_worker_under_its_predecessors_name_projects_its_unacked_batch_at_once(settings, redis):
    """A consolidator killed (kill -9) mid-ingest and restarted by `make run` under a new consumer
    name left the dead one's batch waiting for the lease (30 s by default) before anyone reclaimed it.
    `make run` now keeps one name per slot, and a worker starts by reading the entries delivered to its
    name and not acked; another name still waits for the lease."""
    s = settings.with_(lease_ms=60_000, batch_size=2)  # its batch read back in parts, each once
    client = EngramClient(redis, namespace="ns", prefix=s.prefix)
    for i in range(5):
        await client.record(episode(f"crash-{i}"))
    dead = make_worker(s, redis, name="slot-0")
    await dead.setup()
    [group] = dead.partitions.groups
    delivered = await group.read_new("slot-0", count=100, block_ms=None)  # its batch, then kill -9
    assert len(delivered) == 5
    other = make_worker(s, redis, name="elsewhere")
    await other.setup()
    assert await other.turn() == 0  # not its entries, and not idle for the lease yet
    restarted = make_worker(s, redis, name="slot-0")
    await restarted.setup()
    assert [await restarted.turn() for _ in range(3)] == [2, 2, 1]
    assert sorted(await docs(redis, Keys(s.prefix), "ns")) == [f"crash-{i}" for i in range(5)]
    assert await restarted.turn() == 0  # acked: nothing of its own left
