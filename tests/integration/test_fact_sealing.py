"""Facts on an encrypted deployment: a copy of the stream taken before a user's forget must hold nothing
of that user readable with the keys that survive the forget (`FactsConsolidated`
carried the episodes' failure messages, user ids and evidence ids in clear)."""

from __future__ import annotations

import os

import msgpack
import pytest

from engram_episodic.errors import EngramError
from engram_episodic.events import FactsConsolidated
from engram_episodic.shapes import to_plain
from services.consolidator.deadletters import list_dead_letters
from services.consolidator.facts import Consolidator, ContributorForgotten
from services.consolidator.facts_store import load_state
from services.consolidator.replay import replay
from shared import codec, streams
from shared.crypto import MasterKey
from shared.embedding import HashingEmbedder
from shared.facts import FactScope
from shared.index import current_generation
from shared.keyring import KeyRing
from shared.keys import Keys
from shared.sdk import EngramClient
from tests.integration.test_consolidator import drain, make_worker
from tests.integration.test_facts import HOUR, T0, ep


def planted() -> list[dict]:
    """`mig`: alice and bob, failures with each one's own message (a mixed fact); `doc`: bob alone."""
    out = []
    for i in range(8):
        user = "alice" if i % 2 else "bob"
        failed = i in (1, 2, 5, 6)
        msg = f"{user.upper()}-SECRET lock timeout" if failed else None
        e = ep("mig", i, user=user, outcome="failure" if failed else "success", error=msg, at=T0 + i * HOUR)
        if failed:
            e["feedback"]["message"] = f"{user.upper()}-FEEDBACK msg {user}-secret team-a"
        out.append(e)
    for i in range(5):
        out.append(
            ep(
                "doc",
                i,
                user="bob",
                outcome="failure",
                error="BOB-ONLY missing spec",
                at=T0 + (50 + i) * HOUR,
            )
        )
    return out


async def readable(redis, keys: Keys, master: bytes, payloads: list[bytes]) -> list[str]:
    """What each payload says when decoded with the keys that live in Redis now (msgpack-free text of
    the decoded event), skipping those that no longer open; plaintext payloads decode as they are."""
    ring = KeyRing(keys, MasterKey(master))
    await ring.load(redis)
    wanted = []
    for p in payloads:
        envelope = codec.unpack(p)
        ns = envelope.get("data", {}).get("namespace", "ns")
        wanted += [(r, k, ns) for r, k in codec.key_refs(envelope)]
    await ring.prefetch(redis, wanted)
    out = []
    for p in payloads:
        try:
            event = codec.decode(p, ring.lookup)
        except EngramError:  # shredded or unreadable as a whole: its facts may still open one by one
            out += await readable_facts(codec.unpack(p), ring)
            continue
        out.append(repr(to_plain(event)))
    return out


async def readable_facts(envelope: dict, ring: KeyRing) -> list[str]:
    """The facts of a snapshot envelope that open one by one with `ring`'s keys (prefetched)."""
    data = envelope.get("data", {})
    if envelope.get("type") != "FactsConsolidated":
        return []
    out = []
    for i, f in enumerate(data.get("facts", [])):
        try:
            opened = codec.open_fact(
                f,
                ring.lookup,
                namespace=data["namespace"],
                event_id=data["event_id"],
                scope_id=data["scope"]["scope_id"],
                index=i,
            )
        except EngramError:
            continue
        out.append(repr(opened))
    return out


@pytest.fixture
def sealed(settings):
    return settings.with_(master_key=os.urandom(32), facts_every=10_000, facts_importance_threshold=1e9)


async def test_a_copy_of_the_stream_before_a_forget_keeps_nothing_of_the_user_readable(sealed, redis):
    keys = Keys(sealed.prefix)
    client = EngramClient(redis, namespace="ns", prefix=sealed.prefix, master_key=sealed.master_key)
    for e in planted():
        await client.record(e)
    worker = make_worker(sealed, redis)
    await drain(worker)
    cons = Consolidator(sealed, redis, sealed.embed_dim)
    for scope in (FactScope("ns"), FactScope("ns", "coder", "debugging")):
        assert (await cons.consolidate(scope)).status == "published"
    await drain(worker)
    copy = [f[b"e"] for stream in keys.streams for _sid, f in await redis.xrange(stream)]
    raw = b"".join(copy)
    facts_copied = [p for p in copy if codec.unpack(p).get("type") == "FactsConsolidated"]
    assert len(facts_copied) == 2
    # before the forget, the deployment's keys open every fact event (and both users are in them)
    before = "".join(await readable(redis, keys, sealed.master_key, facts_copied))
    assert "ALICE-SECRET" in before and "BOB-ONLY" in before and "'alice'" in before

    await client.forget_user("alice")
    await drain(worker)

    # nothing of alice in clear in the copy, and nothing readable with the keys that survived
    for secret in (b"ALICE-SECRET", b"ALICE-FEEDBACK", b"alice-secret", b"BOB-ONLY", b"BOB-SECRET"):
        assert secret not in raw, secret
    assert msgpack.packb("alice") not in raw
    after = await readable(redis, keys, sealed.master_key, copy)
    joined = "".join(after)
    assert "ALICE" not in joined and "alice" not in joined
    for i in (1, 3, 5, 7):  # alice's episode ids, as evidence
        assert f"'mig-{i}'" not in joined
    # bob's own fact (the doc family) still opens from the copy; the mixed one does not
    assert "BOB-ONLY" in joined

    # facts still work, without alice, after a replay rebuilds every projection from the stream
    await replay(sealed, redis, HashingEmbedder(sealed.embed_dim))
    entries = [f[b"e"] for stream in keys.streams for _sid, f in await redis.xrange(stream)]
    snapshots = [p for p in entries if codec.unpack(p).get("type") == "FactsConsolidated"]
    live = "".join(await readable(redis, keys, sealed.master_key, snapshots))
    assert "BOB-ONLY" in live and "alice" not in live and "ALICE" not in live
    gen = await current_generation(redis, keys)
    state = await load_state(redis, keys, gen, "ns", FactScope("ns").scope_id)
    assert {f.support for f in state.facts} == {4, 5}  # mig: bob's 4 episodes; doc: bob's 5
    assert all(f.users == ("bob",) for f in state.facts)


async def test_a_malformed_sealed_snapshot_is_dead_lettered_without_its_values(sealed, redis):
    """A sealed snapshot this build cannot apply goes to the dead letters with a reason that quotes
    none of its (opened, personal) values."""
    keys = Keys(sealed.prefix)
    ring = KeyRing(keys, MasterKey(sealed.master_key))
    live = await ring.live_keys(redis, "ns", [None])
    event = FactsConsolidated(
        namespace="ns",
        occurred_at=T0,
        scope={**FactScope("ns").to_data(), "seq": "1"},
        facts=({"fact_id": "f1", "namespace": "ns", "support": "ALICE-BAD-VALUE"},),
    )
    payload = codec.encode_sealed_facts(event, lambda f: [(ring.ref("ns", None), live[None])])
    await streams.publish(redis, keys.stream, [payload])
    await drain(make_worker(sealed, redis))
    (dead,) = await list_dead_letters(redis, keys)
    assert "ALICE" not in dead.reason and dead.reason.startswith("InvalidEpisode")
    assert "'…'" in dead.reason, dead.reason  # the value was there, and withheld
    assert b"ALICE" not in dead.payload


async def test_without_a_master_key_fact_snapshots_stay_plaintext(settings, redis):
    """Plaintext deployments are documented as such: nothing about them changes."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    client = EngramClient(redis, namespace="ns", prefix=s.prefix)
    for e in planted():
        await client.record(e)
    worker = make_worker(s, redis)
    await drain(worker)
    assert (await Consolidator(s, redis, s.embed_dim).consolidate(FactScope("ns"))).status == "published"
    await drain(worker)
    entries = [f[b"e"] for _sid, f in await redis.xrange(s.keys.stream)]
    (snapshot,) = [codec.decode(p) for p in entries if codec.unpack(p).get("type") == "FactsConsolidated"]
    assert "BOB-ONLY" in repr(snapshot.facts) and codec.key_refs(codec.unpack(entries[-1])) == []


async def test_a_run_between_a_forget_and_its_application_derives_facts_without_that_user(sealed, redis):
    """The user's key is destroyed as the forget enters the stream; a consolidation before the worker
    applies it seals nothing under a re-created key: it derives the facts without that user's episodes
    (the mixed fact keeps the other user's part) and never creates the key again."""
    keys = Keys(sealed.prefix)
    client = EngramClient(redis, namespace="ns", prefix=sealed.prefix, master_key=sealed.master_key)
    for e in planted():
        await client.record(e)
    await drain(make_worker(sealed, redis))
    await client.forget_user("alice")  # not applied: no worker runs
    ring = KeyRing(keys, MasterKey(sealed.master_key))
    await ring.load(redis)
    alice = keys.data_key(ring.ref("ns", "alice"), "ns")
    assert not await redis.exists(alice)
    cons = Consolidator(sealed, redis, sealed.embed_dim)
    assert (await cons.consolidate(FactScope("ns"))).status == "published"
    assert not await redis.exists(alice)
    state = await load_state(
        redis, keys, await current_generation(redis, keys), "ns", FactScope("ns").scope_id
    )
    assert sorted(f.support for f in state.facts) == [4, 5] and all(f.users == ("bob",) for f in state.facts)


async def test_forgetting_a_scopes_last_evidence_removes_its_facts(sealed, redis):
    """The snapshot that removes a scope's last fact has no fact to seal. It raised KeyError, so the
    forget of that fact's last episode was dead-lettered and the fact, naming the forgotten episodes,
    stayed (36 dead letters in a 400-episode forget)."""
    keys = Keys(sealed.prefix)
    client = EngramClient(redis, namespace="ns", prefix=sealed.prefix, master_key=sealed.master_key)
    docs = [e for e in planted() if e["episode_id"].startswith("doc")]
    for e in docs:
        await client.record(e)
    worker = make_worker(sealed, redis)
    await drain(worker)
    cons = Consolidator(sealed, redis, sealed.embed_dim)
    assert (await cons.consolidate(FactScope("ns"))).status == "published"
    await drain(worker)
    gen = await current_generation(redis, keys)
    assert (await load_state(redis, keys, gen, "ns", FactScope("ns").scope_id)).facts

    for e in docs:
        await client.forget_episode(e["episode_id"])
    await drain(worker)
    assert await list_dead_letters(redis, keys) == []
    assert not (await load_state(redis, keys, gen, "ns", FactScope("ns").scope_id)).facts
    entries = [f[b"e"] for stream in keys.streams for _sid, f in await redis.xrange(stream)]
    snapshots = [p for p in entries if codec.unpack(p).get("type") == "FactsConsolidated"]
    (last,) = [codec.decode(p) for p in snapshots]  # the earlier snapshot was XDEL'd
    assert last.facts == () and len(last.removed) == 1
    assert "BOB-ONLY" not in "".join(await readable(redis, keys, sealed.master_key, entries))


async def test_forgets_queued_behind_one_another_each_leave_the_mixed_facts_rebuilt(sealed, redis):
    """Several users' forgets published before the worker applies the first: each user's key is gone
    at once, so the first forget's rebuild must leave out every pending user, and must also rebuild a
    fact that names a pending user but none of the forgotten episodes. It sealed the mixed fact under
    the pending users' (gone) keys, so the fact was left out of the snapshot, out of the index, and the
    later forgets never found it: the other users' part was lost (40 of `keep`'s episodes,
    nine users forgotten: '0 facts kept, 5 removed')."""
    keys = Keys(sealed.prefix)
    client = EngramClient(redis, namespace="ns", prefix=sealed.prefix, master_key=sealed.master_key)
    planted_ = planted()  # mig: alice and bob; doc: bob
    planted_ += [
        ep("doc", 10 + i, user="carol", outcome="failure", at=T0 + (60 + i) * HOUR) for i in range(3)
    ]
    for e in planted_:
        await client.record(e)
    worker = make_worker(sealed, redis)
    await drain(worker)
    cons = Consolidator(sealed, redis, sealed.embed_dim)
    assert (await cons.consolidate(FactScope("ns"))).status == "published"
    gen = await current_generation(redis, keys)
    scope_id = FactScope("ns").scope_id
    before = (await load_state(redis, keys, gen, "ns", scope_id)).facts
    assert sorted(f.users for f in before) == [("alice", "bob"), ("bob", "carol")]

    await client.forget_user("alice")
    await client.forget_user("carol")
    await drain(worker)

    assert await list_dead_letters(redis, keys) == []
    after = (await load_state(redis, keys, gen, "ns", scope_id)).facts
    assert sorted((f.support, f.users) for f in after) == [(4, ("bob",)), (5, ("bob",))]
    assert {f.fact_id for f in after} == {f.fact_id for f in before}  # rebuilt, not re-created
    forgotten = {f"mig-{i}" for i in (1, 3, 5, 7)} | {f"doc-{i}" for i in (10, 11, 12)}
    assert not forgotten & {e for f in after for e in f.evidence}


async def test_a_snapshot_naming_a_user_forgotten_meanwhile_is_not_published(sealed, redis):
    """A forget published between a run's check of the keys and its XADD: the snapshot is refused
    whole (ContributorForgotten; nothing in the stream), so the retry rebuilds the fact without that
    user instead of dropping it."""
    keys = Keys(sealed.prefix)
    client = EngramClient(redis, namespace="ns", prefix=sealed.prefix, master_key=sealed.master_key)
    for e in planted():
        await client.record(e)
    await drain(make_worker(sealed, redis))
    cons = Consolidator(sealed, redis, sealed.embed_dim)
    assert (await cons.consolidate(FactScope("ns"))).status == "published"
    gen = await current_generation(redis, keys)
    state = await load_state(redis, keys, gen, "ns", FactScope("ns").scope_id)
    await client.forget_user("alice")  # destroys alice's key now; not applied
    length = sum([await redis.xlen(s) for s in keys.streams])
    event = cons._event(FactScope("ns"), state.seq + 1, state.facts, [], 3, T0)
    with pytest.raises(ContributorForgotten):
        await cons.publish_snapshot(event)
    assert sum([await redis.xlen(s) for s in keys.streams]) == length
    # the retry's rebuild leaves alice out and keeps bob's part
    facts, removed = await cons.without_gone(FactScope("ns"), gen, state.facts, set(), min_cluster=3, now=T0)
    assert removed == [] and sorted((f.support, f.users) for f in facts) == [(4, ("bob",)), (5, ("bob",))]


async def test_a_background_run_raced_by_a_forget_runs_again_without_that_user(sealed, redis):
    """The consolidator process's run whose snapshot a forget raced (the user forgotten after the run
    read the keys, before its XADD) is refused, then run again at once: the mixed fact is published
    with the other user's part, not dropped and not left to the next trigger."""
    s = sealed.with_(facts_min_interval=0.05, facts_every=10)
    keys = Keys(s.prefix)
    client = EngramClient(redis, namespace="ns", prefix=s.prefix, master_key=s.master_key)
    for e in planted():
        await client.record(e)
    await drain(make_worker(s, redis))
    cons = Consolidator(s, redis, s.embed_dim)
    real, calls = cons.publish_snapshot, []

    async def forget_first(event):  # the race, for real: alice's key is destroyed before the XADD
        calls.append(event)
        if len(calls) == 1:
            await client.forget_user("alice")
        return await real(event)

    cons.publish_snapshot = forget_first
    await cons.count([(FactScope("ns"), len(planted()), 0.0)])  # the trigger, as the worker counts it
    await cons.wait_idle()
    await cons.aclose()
    assert len(calls) == 2
    state = await load_state(
        redis, keys, await current_generation(redis, keys), "ns", FactScope("ns").scope_id
    )
    assert sorted((f.support, f.users) for f in state.facts) == [(4, ("bob",)), (5, ("bob",))]


async def test_a_forget_racing_a_forgets_rebuild_is_left_out_not_dead_lettered(sealed, redis):
    """A forget's rebuild of facts (the projector's, for bob's episode) whose snapshot another forget
    raced (alice's key destroyed after the rebuild read the keys, before its XADD) raised
    ContributorForgotten, and the entry being projected was dead-lettered, which no redrive could
    fix (49 in four runs). The rebuild now leaves alice out too and publishes the rest."""
    keys = Keys(sealed.prefix)
    client = EngramClient(redis, namespace="ns", prefix=sealed.prefix, master_key=sealed.master_key)
    for e in planted():
        await client.record(e)
    await drain(make_worker(sealed, redis))
    cons = Consolidator(sealed, redis, sealed.embed_dim)
    assert (await cons.consolidate(FactScope("ns"))).status == "published"
    gen = await current_generation(redis, keys)
    real, calls = cons.publish_snapshot, []

    async def forget_first(event):  # the race, in this order: alice's key goes before the XADD
        calls.append(event)
        if len(calls) == 1:
            await client.forget_user("alice")
        return await real(event)

    cons.publish_snapshot = forget_first
    assert await cons.forget(gen, "ns", ["mig-0"]) == 1  # bob's episode, in the mixed fact
    assert len(calls) == 2
    state = await load_state(redis, keys, gen, "ns", FactScope("ns").scope_id)
    assert sorted((f.support, f.users) for f in state.facts) == [(3, ("bob",)), (5, ("bob",))]
    assert not {"mig-0", "mig-1", "mig-3", "mig-5", "mig-7"} & {e for f in state.facts for e in f.evidence}
