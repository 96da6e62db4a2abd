"""Crypto-shredding against the real Redis: sealed stream entries, forgetting destroys the user's data
key, nothing forgotten stays on disk (RDB, AOF), replay and dead letters, key races and rotation."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from pathlib import Path

import msgpack
import orjson
import pytest

from deploy.embedded_redis import EmbeddedRedis, free_port
from engram_episodic.errors import ConfigError, EngramError
from engram_episodic.events import EpisodeCompleted, UserForgotten
from engram_episodic.validation import parse_episode
from services.consolidator.deadletters import list_dead_letters
from services.consolidator.replay import replay
from shared import streams
from shared.codec import decode, encode, payload_ref
from shared.crypto import MasterKey, MasterKeyMismatch, read_master_key_file
from shared.embedding import HashingEmbedder
from shared.index import Scope, count, current_generation
from shared.keyring import KeyRing
from shared.keys import Keys
from shared.redis_conn import connect
from shared.sdk import EngramClient
from shared.tags import BLAKE2B
from tests.helpers import leaked_text, publish_and_recall, wait_until
from tests.integration.test_consolidator import docs, drain, episode, make_worker


@pytest.fixture
def master_key() -> bytes:
    return os.urandom(32)


@pytest.fixture
def sealed(settings, master_key):
    """Settings with encryption on (a master key)."""
    return settings.with_(master_key=master_key)


def client_for(settings, redis, **kw) -> EngramClient:
    return EngramClient(redis, namespace="ns", prefix=settings.prefix, master_key=settings.master_key, **kw)


async def stream_bytes(redis, keys: Keys) -> bytes:
    out = b""
    for stream in (keys.stream, keys.dead_letters):
        for _sid, fields in await redis.xrange(stream):
            out += b"".join(fields.values())
    return out


async def test_sealed_entries_hold_no_personal_text_and_project_as_before(sealed, redis):
    keys = Keys(sealed.prefix)
    client = client_for(sealed, redis)
    async with client.episode(task="SEAL-TASK fix the login test", user_id="SEAL-USER", agent_id="a1") as ep:
        await ep.action("shell", input="SEAL-INPUT pytest", output="SEAL-OUTPUT 1 failed")
        await ep.complete("success", solution="SEAL-SOLUTION freeze the clock")
    await client.record(episode("anon", solution="SEAL-ANON"))
    raw = await stream_bytes(redis, keys)
    for secret in (b"SEAL-TASK", b"SEAL-USER", b"SEAL-INPUT", b"SEAL-OUTPUT", b"SEAL-SOLUTION", b"SEAL-ANON"):
        assert secret not in raw
    assert ep.episode_id.encode() in raw  # routing stays clear
    assert len(await redis.keys(f"{sealed.prefix}dek:*")) == 2  # (ns, SEAL-USER) and the namespace's own
    await drain(make_worker(sealed, redis))
    found = await docs(redis, keys, "ns")
    assert set(found) == {ep.episode_id, "anon"}
    assert b"SEAL-SOLUTION" in found[ep.episode_id][b"doc"] and b"SEAL-INPUT" in found[ep.episode_id][b"doc"]
    # the episode's own event log (the replay snapshot) keeps the sealed bytes, not plaintext
    held = b"".join(await redis.hvals(keys.episode_events(1, "ns", ep.episode_id)))
    assert b"SEAL-" not in held and len(held) > 0


async def test_forgetting_a_user_destroys_the_key_and_shreds_what_was_not_consumed_yet(sealed, redis):
    """A forget published by the SDK deletes the user's data key in the same step as the forget enters
    the stream: events still waiting for the consolidator are then unreadable, and are acked, deleted
    and counted as shredded — never dead-lettered, never projected; a replay finds nothing of them."""
    keys = Keys(sealed.prefix)
    client = client_for(sealed, redis)
    async with client.episode(task="early task", user_id="gone") as ep:
        await ep.action("step", input="SHRED-ME")
        await ep.complete("success")
    await client.record(episode("stays", user_id="other"))
    ring = KeyRing(keys, MasterKey(sealed.master_key))
    await ring.load(redis)
    slot = keys.data_key(ring.ref("ns", "gone"))
    assert await redis.exists(slot)
    await client.forget_user("gone")
    assert not await redis.exists(slot)  # destroyed as the forget entered the stream
    assert await redis.exists(keys.data_key(ring.ref("ns", None)))  # the namespace's key sealed the forget
    worker = make_worker(sealed, redis)
    await drain(worker)
    assert list(await docs(redis, keys, "ns", status=None)) == ["stays"]
    assert await list_dead_letters(redis, keys) == []
    assert worker.metrics.events.labels("ActionRecorded", "shredded")._value.get() == 1
    assert worker.metrics.events.labels("EpisodeStarted", "shredded")._value.get() == 1
    remaining = [f[b"e"] for _sid, f in await redis.xrange(keys.stream)]
    assert len(remaining) == 2  # "stays" and the forget itself: the shredded entries were deleted
    await replay(sealed, redis, HashingEmbedder(sealed.embed_dim))
    assert list(await docs(redis, keys, "ns", status=None)) == ["stays"]
    assert await leaked_text(redis, sealed.prefix, ["SHRED-ME", "early task"]) == []
    # the user's new activity gets a new key and survives
    await client.record(episode("new-life", user_id="gone"))
    await drain(worker)
    assert set(await docs(redis, keys, "ns")) == {"stays", "new-life"}


async def test_a_forget_published_without_the_sdk_destroys_the_key_when_consolidated(sealed, redis):
    """A UserForgotten that did not delete the key itself (published by hand, or by an older
    publisher) has the consolidator destroy it first; a key created after the forget is the user's
    new activity and is kept."""
    keys = Keys(sealed.prefix)
    client = client_for(sealed, redis)
    await client.record(episode("old", user_id="u"))
    worker = make_worker(sealed, redis)
    await drain(worker)
    ring = KeyRing(keys, MasterKey(sealed.master_key))
    await ring.load(redis)
    slot = keys.data_key(ring.ref("ns", "u"))
    assert await redis.exists(slot)
    await streams.publish(
        redis, keys.stream, [encode(UserForgotten(namespace="ns", user_id="u", occurred_at=time.time()))]
    )
    await drain(worker)
    assert not await redis.exists(slot) and await docs(redis, keys, "ns") == {}
    await client.record(episode("newer", user_id="u"))  # a new key, created after that forget...
    await streams.publish(
        redis,
        keys.stream,
        [encode(UserForgotten(namespace="ns", user_id="u", occurred_at=time.time() - 3600))],
    )
    await drain(worker)  # ...which an older forget (processed later) does not destroy
    assert await redis.exists(slot) and list(await docs(redis, keys, "ns")) == ["newer"]


def _files_under(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != "redis.log"
    }


async def test_a_forgotten_users_text_is_nowhere_on_disk(tmp_path, master_key):
    """Erasure on disk: a user holding distinctive strings is forgotten; after the erasure rewrite of
    the AOF and a SAVE, neither the RDB nor any AOF file (base with its RDB preamble, incremental)
    holds any of them in plaintext — while another user's strings are found there (the scan works:
    rdbcompression is off so that LZF would not hide a string)."""
    from services.consolidator import erasure
    from shared.settings import Settings

    data_dir = tmp_path / "redis"
    server = EmbeddedRedis(port=free_port(), data_dir=data_dir, extra_args=["--rdbcompression", "no"])
    server.start()
    redis = connect(server.url)
    try:
        settings = Settings(
            redis_url=server.url,
            prefix="disk:",
            embedder="hashing",
            embed_dim=64,
            vector_algorithm="FLAT",
            block_ms=50,
            lease_ms=2000,
            master_key=master_key,
        )
        tag = uuid.uuid4().hex[:8]
        secrets = [
            f"FORGET-{tag}-{what}".encode() for what in ("task", "input", "output", "solution", "user")
        ]
        kept = [f"KEEP-{tag}-{what}".encode() for what in ("task", "solution")]
        client = EngramClient(redis, namespace="ns", prefix=settings.prefix, master_key=master_key)
        async with client.episode(task=secrets[0].decode(), user_id=secrets[4].decode()) as ep:
            await ep.action("shell", input=secrets[1].decode(), output=secrets[2].decode())
            await ep.complete(
                "success", solution=secrets[3].decode(), feedback={"message": secrets[3].decode()}
            )
        await client.record(
            episode(
                "kept",
                task={"description": kept[0].decode()},
                solution=kept[1].decode(),
                user_id="someone-else",
            )
        )
        worker = make_worker(settings, redis)
        await drain(worker)
        await redis.save()
        on_disk = b"".join(_files_under(data_dir).values())
        assert all(s in on_disk for s in secrets[:4])  # the projection held them, so the test can see them
        # and a dead letter of the user's, next to one of someone else's
        await client.record(
            episode(
                "dead-forgotten",
                task={"description": secrets[0].decode()},
                user_id=secrets[4].decode(),
                vector=[0.5] * 3,
            )
        )
        await client.record(
            episode(
                "dead-kept", task={"description": kept[0].decode()}, user_id="someone-else", vector=[0.5] * 3
            )
        )
        await drain(worker)
        await client.forget_user(secrets[4].decode())
        await drain(worker)
        await erasure.run(redis, Keys(settings.prefix))  # what the housekeeping runs after forgets
        await redis.save()
        ring = KeyRing(Keys(settings.prefix), MasterKey(master_key))
        await ring.load(redis)
        rows = await redis.xrange(Keys(settings.prefix).stream)
        await ring.prefetch(
            redis, [(*ref, "ns") for _, f in rows if (ref := payload_ref(f[b"e"])) is not None]
        )
        opened = []
        for _, f in rows:
            with contextlib.suppress(EngramError):  # shredded entries do not open: that is the point
                opened.append(decode(f[b"e"], ring.lookup))
        # not even the master key opens an event naming the forgotten user (the applied forget is dropped)
        assert opened and not any(getattr(e, "user_id", None) == secrets[4].decode() for e in opened)
        files = _files_under(data_dir)
        assert "dump.rdb" in files and any(name.startswith("appendonlydir/") for name in files)
        for name, content in files.items():
            for secret in [*secrets, b"dead-forgotten"]:  # the dead letter's episode id was in clear
                assert secret not in content, (name, secret)
        assert b"dead-kept" in files["dump.rdb"]
        assert all(k in files["dump.rdb"] for k in kept)
        assert all(any(k in c for n, c in files.items() if n.startswith("appendonlydir/")) for k in kept)
    finally:
        await redis.aclose()
        server.stop()


async def test_dead_letters_of_sealed_entries_hold_no_plaintext_and_go_with_their_user(sealed, redis):
    keys = Keys(sealed.prefix)
    client = client_for(sealed, redis)
    await client.record(episode("dim", user_id="dl-user", solution="DL-SECRET", vector=[0.1] * 3))
    bad = EpisodeCompleted(
        namespace="ns",
        episode_id="late",
        occurred_at=time.time(),
        episode=parse_episode(episode("late", user_id="dl-user", solution="DL-SECRET")),
    )
    worker = make_worker(sealed, redis)
    ring = worker.keyring
    await ring.load(redis)
    payload = msgpack.unpackb((await _sealed_payload(ring, redis, bad)), raw=False)
    payload["data"]["occurred_at"] = 1.0  # the clear part no longer matches the sealed part
    await streams.publish(redis, keys.stream, [msgpack.packb(payload)])
    await drain(worker)
    letters = await list_dead_letters(redis, keys)
    assert sorted(d.reason.split(":")[0] for d in letters) == ["InvalidEpisode", "Unreadable"]
    assert b"DL-SECRET" not in await stream_bytes(redis, keys)
    assert all("DL-SECRET" not in d.reason and "dl-user" not in d.reason for d in letters)
    await client.forget_user("dl-user")
    await drain(worker)
    assert await list_dead_letters(redis, keys) == []
    assert len(await redis.xrange(keys.stream)) == 1  # the forget alone
    # no link of the forgotten episodes to their dead letters is left (it would name them)
    assert not await redis.exists(keys.dead_letter_refs("ns", "dim"), keys.dead_letter_refs("ns", "late"))
    assert await leaked_text(redis, sealed.prefix, ["DL-SECRET"]) == []
    # the erasure pass drops the applied forget (its user id was readable with the master key) and
    # compacts both streams
    from services.consolidator import erasure

    report = await erasure.run(redis, keys)
    assert report["forget_events_dropped"] == 1 and report["dead_letters_compaction"]["compacted"] in (
        True,
        False,
    )
    assert await redis.xrange(keys.stream) == []


async def test_the_erasure_pass_keeps_a_forget_until_every_group_acked_it(settings, redis):
    """A forget event undelivered, or delivered and pending, may still have to be applied: only once
    every group acked it does the erasure pass drop it (another group reading the stream included)."""
    from services.consolidator import erasure

    keys = Keys(settings.prefix)
    await make_worker(settings, redis).setup()
    await redis.xgroup_create(keys.stream, "other", id="0")
    await client_for(settings, redis).forget_episode("gone")
    assert await erasure.drop_applied_forgets(redis, keys) == 0  # delivered to no group
    for group in (settings.consumer_group, "other"):
        await redis.xreadgroup(group, "c", {keys.stream: ">"}, count=10)
    assert await erasure.drop_applied_forgets(redis, keys) == 0  # pending in both
    ((sid, _fields),) = await redis.xrange(keys.stream)
    await redis.xack(keys.stream, settings.consumer_group, sid)
    assert await erasure.drop_applied_forgets(redis, keys) == 0  # "other" has not acked it
    await redis.xack(keys.stream, "other", sid)
    assert await erasure.drop_applied_forgets(redis, keys) == 1
    assert await redis.xrange(keys.stream) == []


async def _sealed_payload(ring: KeyRing, redis, event) -> bytes:
    """The payload the SDK would publish for `event`, read back from a scratch stream."""
    scratch = f"{ring.keys.prefix}scratch"
    (sid,) = await ring.publish(redis, scratch, [event])
    ((_, fields),) = await redis.xrange(scratch, sid, sid)
    await redis.delete(scratch)
    return fields[b"e"]


async def test_publishers_racing_for_a_new_users_key_agree_on_one(sealed, redis):
    keys = Keys(sealed.prefix)
    rings = [KeyRing(keys, MasterKey(sealed.master_key)) for _ in range(4)]
    clients = [client_for(sealed, redis) for _ in rings]
    for client, ring in zip(clients, rings, strict=True):
        client._ring = ring  # separate processes: no shared cache
    await asyncio.gather(*(c.record(episode(f"race{i}", user_id="racer")) for i, c in enumerate(clients)))
    ring = KeyRing(keys, MasterKey(sealed.master_key))
    await ring.load(redis)
    assert len(await redis.keys(f"{sealed.prefix}dek:*")) == 1
    await drain(make_worker(sealed, redis))
    assert len(await docs(redis, keys, "ns", user_id="racer", master_key=sealed.master_key)) == 4


async def test_a_publishers_cached_key_of_a_forgotten_user_is_never_used_again(sealed, redis):
    """Publisher A holds the user's key in memory; publisher B forgets the user. A's next event for
    that user is refused by the key check (nothing written with the destroyed key) and sealed with a
    new key, so it is readable."""
    keys = Keys(sealed.prefix)
    a, b = client_for(sealed, redis), client_for(sealed, redis)
    a._ring = KeyRing(keys, MasterKey(sealed.master_key))
    await a.record(episode("first", user_id="u"))
    await b.forget_user("u")
    await a.record(episode("second", user_id="u"))
    worker = make_worker(sealed, redis)
    await drain(worker)
    assert list(await docs(redis, keys, "ns")) == ["second"]
    assert worker.metrics.events.labels("EpisodeCompleted", "shredded")._value.get() == 1


async def test_a_deployment_keeps_the_encryption_it_started_with(settings, sealed, redis):
    """A deployment started without a master key holds plaintext entries: a worker or a publisher with
    one is refused there, before writing anything (its sealed entries would sit beside plaintext ones
    that no shredding reaches); a worker without the master key on an encrypted deployment refuses to
    start."""
    keys = Keys(settings.prefix)
    await EngramClient(redis, namespace="ns", prefix=settings.prefix).record(episode("plain", user_id="u"))
    length = await redis.xlen(keys.stream)
    with pytest.raises(ConfigError, match="was started without a master key.*fresh prefix"):
        await make_worker(sealed, redis).setup()
    with pytest.raises(ConfigError, match="was started without a master key"):
        await client_for(sealed, redis).record(episode("sealed", user_id="u"))
    assert await redis.xlen(keys.stream) == length and not await redis.exists(keys.deployment_key)
    encrypted = sealed.with_(prefix=f"{sealed.prefix}enc:")
    await client_for(encrypted, redis).record(episode("sealed", user_id="u"))
    await drain(make_worker(encrypted, redis))
    keyless = settings.with_(prefix=encrypted.prefix)
    with pytest.raises(ConfigError, match="ENGRAM_MASTER_KEY"):
        await make_worker(keyless, redis).setup()
    # without the key every entry is undecodable: a replay would swap in an empty generation
    enc_keys = Keys(encrypted.prefix)
    generation = await current_generation(redis, enc_keys)
    with pytest.raises(ConfigError, match="encrypts its stream"):
        await replay(keyless, redis, HashingEmbedder(keyless.embed_dim))
    assert await current_generation(redis, enc_keys) == generation
    assert set(await docs(redis, enc_keys, "ns", master_key=encrypted.master_key)) == {"sealed"}
    with pytest.raises(ConfigError, match="encrypts its stream"):  # nor is plaintext written beside it
        await client_for(keyless, redis).record(episode("plain", user_id="u"))


async def test_rotate_master_key_rewraps_every_key_and_keeps_the_data_readable(sealed, redis):
    keys = Keys(sealed.prefix)
    client = client_for(sealed, redis)
    for i in range(3):
        await client.record(episode(f"r{i}", user_id=f"user{i}"))
    new_key = os.urandom(32)
    ring = KeyRing(keys, MasterKey(sealed.master_key))
    counts = await ring.rotate(redis, MasterKey(new_key))
    assert counts["rewrapped"] == 1 + 3  # the deployment secret and three data keys
    assert (await KeyRing(keys, MasterKey(sealed.master_key)).rotate(redis, MasterKey(new_key)))[
        "already"
    ] == 4
    # the old key opens nothing any more, and the refusal says which key to configure
    with pytest.raises(
        MasterKeyMismatch, match="set ENGRAM_MASTER_KEY or ENGRAM_MASTER_KEY_FILE to the deployment's key"
    ):
        await make_worker(sealed, redis).setup()
    rotated = sealed.with_(master_key=new_key)
    await drain(make_worker(rotated, redis))
    assert len(await docs(redis, keys, "ns")) == 3
    await client_for(rotated, redis).record(episode("after", user_id="user0"))  # same key, new wrapping
    await drain(make_worker(rotated, redis))
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == 4


async def test_erasure_housekeeping_runs_after_forgets_at_most_once_per_interval(sealed, redis):
    from services.consolidator import erasure

    keys = Keys(sealed.prefix)
    assert await erasure.housekeep(redis, keys, interval=600, lease_ms=2000) is None  # nothing forgotten
    client = client_for(sealed, redis)
    await client.record(episode("e1", user_id="u"))
    await client.forget_episode("e1")
    await drain(make_worker(sealed, redis))
    assert await leaked_text(redis, sealed.prefix, ["task e1 fix"]) == []
    report = await erasure.housekeep(redis, keys, interval=600, lease_ms=2000)
    assert report is not None and report["aof_rewritten"] is True
    assert await redis.hget(keys.meta, erasure.PENDING_FIELD) is None
    await client.record(episode("e2", user_id="u"))
    await client.forget_user("u")
    await drain(make_worker(sealed, redis))
    assert await redis.hget(keys.meta, erasure.PENDING_FIELD) is not None
    assert await erasure.housekeep(redis, keys, interval=600, lease_ms=2000) is None  # not due yet
    assert await erasure.housekeep(redis, keys, interval=0.001, lease_ms=2000) is not None


async def test_compaction_drops_deleted_entries_bytes_and_keeps_groups_exact(tmp_path):
    """Without encryption XDEL leaves a forgotten entry's bytes in the
    stream's listpack, so in every RDB: compaction rewrites the stream with the same ids, and the
    consumer group comes back exactly (last-delivered id, pending entries with their consumer and
    delivery count), so nothing is lost or delivered twice; the worker goes on consuming."""
    from services.consolidator import erasure
    from shared.settings import Settings

    server = EmbeddedRedis(
        port=free_port(), data_dir=tmp_path / "redis", extra_args=["--rdbcompression", "no"]
    )
    server.start()
    redis = connect(server.url)
    try:
        settings = Settings(
            redis_url=server.url,
            prefix="cmp:",
            embedder="hashing",
            embed_dim=64,
            vector_algorithm="FLAT",
            block_ms=50,
            lease_ms=60_000,
        )
        keys = Keys(settings.prefix)
        client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
        secret = f"PLAIN-{uuid.uuid4().hex[:8]}".encode()
        for i in range(300):
            await client.record(episode(f"k{i}", user_id="keep", solution=f"keep {i}"))
        await client.record(episode("gone", user_id="gone", solution=secret.decode()))
        worker = make_worker(settings, redis)
        await drain(worker)
        await client.forget_user("gone")
        await drain(worker)
        for i in range(5):  # delivered to a consumer that has not acked them yet
            await client.record(episode(f"p{i}", user_id="keep"))
        await redis.xreadgroup(settings.consumer_group, "slow", {keys.stream: ">"}, count=3)
        await redis.xclaim(
            keys.stream,
            settings.consumer_group,
            "slow",
            0,
            [sid for sid, _ in await redis.xrange(keys.stream, count=1000)][-5:-3],
        )  # 2nd delivery
        await redis.save()
        assert secret in (tmp_path / "redis" / "dump.rdb").read_bytes()  # XDEL left the bytes
        stream_before = await redis.xrange(keys.stream)
        pending_before = await redis.xpending_range(keys.stream, settings.consumer_group, "-", "+", 100)
        group_before = (await redis.xinfo_groups(keys.stream))[0]
        info_before = await redis.xinfo_stream(keys.stream)
        report = await erasure.compact(redis, keys, page=100)
        assert report["compacted"] and report["entries"] == len(stream_before)
        assert await redis.ttl(keys.stream) == -1 and not await redis.exists(
            keys.stream_compaction(keys.stream)
        )
        assert await redis.xrange(keys.stream) == stream_before
        pending_after = await redis.xpending_range(keys.stream, settings.consumer_group, "-", "+", 100)
        assert [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pending_after] == [
            (p["message_id"], p["consumer"], p["times_delivered"]) for p in pending_before
        ]
        group_after = (await redis.xinfo_groups(keys.stream))[0]
        for field in ("last-delivered-id", "pending"):
            assert group_after[field] == group_before[field], field
        # the lag is what the group has left to read (p3, p4), not counts of entries deleted before it
        # read them (a phantom lag would hold every publish at 429 on an idle stack)
        group = streams.StreamGroup(redis, keys.stream, settings.consumer_group)
        assert group_after["lag"] == 2 and await group.lag() == 2
        info_after = await redis.xinfo_stream(keys.stream)
        for field in ("last-generated-id", "entries-added", "max-deleted-entry-id", "length"):
            assert info_after[field] == info_before[field], field
        await redis.save()
        assert secret not in (tmp_path / "redis" / "dump.rdb").read_bytes()
        await client.record(episode("after", user_id="keep"))
        new_id = (await redis.xrange(keys.stream))[-1][0]
        assert new_id > info_before["last-generated-id"]
        worker.settings = worker.settings.with_(lease_ms=10)  # take over "slow"'s pending entries too
        await drain(worker)
        assert (
            await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == 300 + 5 + 1
        )
        assert (await group.info())["pending"] == 0
    finally:
        await redis.aclose()
        server.stop()


async def test_a_running_worker_runs_the_erasure_pass_after_a_forget(sealed, redis):
    from services.consolidator import erasure

    keys = Keys(sealed.prefix)
    client = client_for(sealed, redis)
    worker = make_worker(sealed.with_(erasure_interval=600.0), redis)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await client.record(episode("w1", user_id="wu"))
        await client.forget_user("wu")

        async def erased() -> bool:
            pending, done = await redis.hmget(keys.meta, [erasure.PENDING_FIELD, erasure.DONE_FIELD])
            return pending is None and done is not None

        await wait_until(erased, timeout=30, message="the erasure pass after the forget")
        assert await docs(redis, keys, "ns", status=None) == {}
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_rotate_master_key_and_erase_now_commands(sealed, redis, monkeypatch, tmp_path):
    """The documented commands: rotate-master-key re-wraps everything and names both key ids (refusing
    the current key as the new one, or no current key); erase-now prints its report."""
    import base64
    import json

    from click.testing import CliRunner

    from services.admin import cli

    await client_for(sealed, redis).record(episode("c1", user_id="cu"))
    monkeypatch.setenv("REDIS_URL", sealed.redis_url)
    monkeypatch.setenv("ENGRAM_PREFIX", sealed.prefix)
    monkeypatch.setenv("ENGRAM_MASTER_KEY", base64.b64encode(sealed.master_key).decode())
    same, new = tmp_path / "same.key", tmp_path / "new.key"
    same.write_text(base64.b64encode(sealed.master_key).decode())
    new_key = os.urandom(32)
    new.write_text(base64.b64encode(new_key).decode() + "\n")

    def invoke(*args):
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    out = await asyncio.to_thread(invoke, "rotate-master-key", "--new-key-file", str(same))
    assert out.exit_code == 1 and "holds the current master key" in out.output
    out = await asyncio.to_thread(invoke, "rotate-master-key", "--new-key-file", str(new))
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["rewrapped"] == 2 and report["to_master_key"] == MasterKey(new_key).id  # secret + one user
    assert report["from_master_key"] == MasterKey(sealed.master_key).id
    out = await asyncio.to_thread(invoke, "rotate-master-key", "--new-key-file", str(new))
    again = json.loads(out.output)  # idempotent: run it again after the restart, for keys made meanwhile
    assert out.exit_code == 0 and again["rewrapped"] == 0 and again["already"] == 2
    monkeypatch.setenv("ENGRAM_MASTER_KEY", base64.b64encode(new_key).decode())
    await drain(make_worker(sealed.with_(master_key=new_key), redis))
    assert list(await docs(redis, Keys(sealed.prefix), "ns")) == ["c1"]
    out = await asyncio.to_thread(invoke, "erase-now")
    assert out.exit_code == 0 and json.loads(out.output)["aof_rewritten"] is True
    monkeypatch.delenv("ENGRAM_MASTER_KEY")
    out = await asyncio.to_thread(invoke, "rotate-master-key", "--new-key-file", str(new))
    assert out.exit_code == 1 and "ENGRAM_MASTER_KEY" in out.output


def test_settings_read_the_master_key_once_and_never_show_it(tmp_path):
    import base64

    from shared.settings import Settings

    key = os.urandom(32)
    path = tmp_path / "master.key"
    path.write_text(base64.b64encode(key).decode())
    assert Settings.from_env({"ENGRAM_MASTER_KEY_FILE": str(path)}).master_key == key
    settings = Settings.from_env({"ENGRAM_MASTER_KEY": base64.b64encode(key).decode()})
    assert settings.master_key == key and base64.b64encode(key).decode() not in repr(settings)
    assert Settings.from_env({}).master_key is None
    for env, message in (
        ({"ENGRAM_MASTER_KEY": "x" * 7}, "ENGRAM_MASTER_KEY is not base64"),
        ({"ENGRAM_MASTER_KEY_FILE": str(tmp_path / "none")}, "ENGRAM_MASTER_KEY_FILE="),
        ({"ENGRAM_MASTER_KEY": "a", "ENGRAM_MASTER_KEY_FILE": "b"}, "both set"),
    ):
        with pytest.raises(ConfigError, match=message):
            Settings.from_env(env)
    assert Settings.from_env({"ENGRAM_ERASURE_INTERVAL": "off"}).erasure_interval is None
    assert Settings.from_env({"ENGRAM_ERASURE_INTERVAL": "5m"}).erasure_interval == 300.0


@pytest.mark.slow  # a whole `make run` stack
async def test_make_run_generates_a_master_key_and_its_stack_seals_and_shreds(tmp_path):
    """`make run` (services.run) without ENGRAM_MASTER_KEY[_FILE]: it writes ENGRAM_DATA_DIR/master.key
    (0600) on its first start and passes it down, so HTTP ingest seals (the text is not in the stream)
    and DELETE /v1/users/{id} destroys the user's key at once."""
    import stat

    import aiohttp

    from tests.helpers import Stack

    data = tmp_path / "data"
    stack = Stack(data, drop=("ENGRAM_MASTER_KEY", "ENGRAM_MASTER_KEY_FILE")).start()
    url = stack.url
    redis = connect(f"redis://127.0.0.1:{stack.redis_port}/0")
    try:
        await wait_until(stack.ready, timeout=90, message="query service ready")
        key_file = data / "master.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        keys = Keys("engram:")
        async with aiohttp.ClientSession() as s:
            body = {"task": "RUN-SECRET flaky login", "outcome": "success", "user_id": "run-user"}
            await publish_and_recall(s, url, body, "flaky login", message="episode projected")
            assert b"RUN-SECRET" not in await stream_bytes(redis, keys)
            ring = KeyRing(keys, MasterKey(read_master_key_file(key_file)))
            await ring.load(redis)
            slot = keys.data_key(ring.ref("default", "run-user"))
            assert await redis.exists(slot)
            async with s.delete(f"{url}/v1/users/run-user") as r:
                assert r.status == 202
            assert not await redis.exists(slot)  # destroyed as the forget was accepted
        code = stack.stop()
    finally:
        await redis.aclose()
        stack.kill()
    assert code == 0, stack.output()[-3000:]


async def test_a_publisher_without_the_master_key_cannot_write_plaintext_into_an_encrypted_deployment(
    sealed, redis
):
    """Plaintext entries in an encrypted log would escape shredding: the publisher is refused before
    writing (and the publish script refuses them in the same atomic step as the XADD, should the
    deployment turn encrypted after that check), and the error says what to configure."""
    keys = Keys(sealed.prefix)
    await client_for(sealed, redis).record(episode("sealed-one"))  # the deployment secret now exists
    before = await redis.xlen(keys.stream)
    plain = EngramClient(redis, namespace="ns", prefix=sealed.prefix)
    with pytest.raises(ConfigError, match="encrypts its stream"):
        await plain.record(episode("plain-one", user_id="u"))
    assert await redis.xlen(keys.stream) == before
    # a deployment without encryption takes plaintext publishers as before
    other = EngramClient(redis, namespace="ns", prefix=sealed.prefix + "plain:")
    await other.record(episode("plain-two"))
    assert await redis.xlen(Keys(sealed.prefix + "plain:").stream) == 1


@pytest.mark.parametrize("one_batch", [False, True], ids=["batches", "one-batch"])
@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "sealed"])
async def test_an_episode_re_published_under_another_user_keeps_nothing_of_the_first(
    settings, master_key, redis, encrypted, one_batch
):
    """An episode re-published under another user_id is that user's: it is folded from the later user's
    events only, the first user's events leave its event hash and the stream, so forgetting the first
    user (who no longer owns it) leaves none of their text anywhere, the episode stays the second
    user's with their fields, and a replay folds the same episode."""
    settings = settings.with_(master_key=master_key) if encrypted else settings
    keys = Keys(settings.prefix)
    client = client_for(settings, redis)
    worker = make_worker(settings, redis)
    secrets = ["vextrombi secret of A", "vextrombi cmd"]
    await client.record(
        {
            "episode_id": "swap-1",
            "task": "shared task",
            "outcome": "success",
            "user_id": "owner-a",
            "solution": secrets[0],
            "actions": [{"action_type": "sh", "input": secrets[1], "action_id": "a1"}],
        }
    )
    if not one_batch:
        await drain(worker)
    await client.record(
        {
            "episode_id": "swap-1",
            "task": "shared task",
            "outcome": "success",
            "user_id": "owner-b",
            "actions": [{"action_type": "sh", "input": "b's cmd", "action_id": "b1"}],
        }
    )
    await drain(worker)

    async def stored() -> dict:
        found = await docs(redis, keys, "ns", master_key=settings.master_key)
        assert list(found) == ["swap-1"]
        return orjson.loads(found["swap-1"][b"doc"])

    before = await stored()
    assert before["user_id"] == "owner-b" and "solution" not in before
    assert [a["action_id"] for a in before["actions"]] == ["b1"]
    await client.forget_user("owner-a")
    await drain(worker)
    assert await stored() == before
    assert await leaked_text(redis, settings.prefix, secrets) == []
    await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert await stored() == before
