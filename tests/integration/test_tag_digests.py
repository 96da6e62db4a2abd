"""The TAG fields hold keyed digests of ids (shared.tags): `FT.TAGVALS` of the live indexes never lists a
user id, session id or episode id, before or after a forget, while filtering by them works."""

from __future__ import annotations

import os
import uuid

import pytest

from engram_episodic.errors import ConfigError
from services.consolidator.facts import Consolidator
from shared.facts import FactScope
from shared.index import Scope, count, current_generation, generation_tags
from shared.keyring import deployment_tag_key
from shared.keys import Keys
from shared.sdk import EngramClient
from shared.tags import BLAKE2B, MODE_BLAKE2B, MODE_HMAC, TagCodec, codec
from tests.integration.test_consolidator import drain, make_worker
from tests.integration.test_facts import ep


async def tagvals(redis, index: str, field: str) -> set[str]:
    return {v.decode() for v in await redis.execute_command("FT.TAGVALS", index, field)}


async def all_tag_values(redis, keys: Keys, gen: int) -> set[str]:
    out: set[str] = set()
    for field in ("episode_id", "user_id", "session_id", "agent_id", "category", "namespace"):
        out |= await tagvals(redis, keys.episode_index(gen), field)
    for field in ("users", "evidence", "agents", "fact_id", "namespace"):
        out |= await tagvals(redis, keys.facts_index(gen), field)
    return out


def family(user: str, session: str, tag: str) -> list[dict]:
    """Five similar episodes of one user (a fact's worth) with distinctive ids."""
    out = []
    for i in range(5):
        e = ep("mig", i, user=user)
        e["episode_id"] = f"EP-{tag}-{i}"
        e["session_id"] = session
        out.append(e)
    return out


@pytest.mark.parametrize("encrypted", [True, False], ids=["master-key", "no-master-key"])
async def test_tagvals_never_list_a_users_ids_before_or_after_the_forget(settings, redis, encrypted):
    s = settings.with_(
        facts_every=10_000, facts_importance_threshold=1e9, master_key=os.urandom(32) if encrypted else None
    )
    keys = Keys(s.prefix)
    tag = uuid.uuid4().hex[:8]
    user, session = f"USER-{tag}@example.com", f"SESSION-{tag}"
    gone = family(user, session, tag)
    kept = [
        {**e, "episode_id": f"KEPT-{tag}-{i}", "user_id": f"OTHER-{tag}", "session_id": f"OTHER-S-{tag}"}
        for i, e in enumerate(family("x", "y", tag))
    ]
    client = EngramClient(redis, namespace="ns", prefix=s.prefix, master_key=s.master_key)
    for e in gone + kept:
        await client.record(e)
    worker = make_worker(s, redis)
    await drain(worker)
    gen = await current_generation(redis, keys)
    tags = await generation_tags(redis, keys, gen, await deployment_tag_key(redis, keys, s.master_key))
    assert tags.mode == (MODE_HMAC if encrypted else MODE_BLAKE2B)
    assert (await Consolidator(s, redis, s.embed_dim).consolidate(FactScope("ns"))).status == "published"

    raw_ids = {user, session, *(e["episode_id"] for e in gone + kept), f"OTHER-{tag}", f"OTHER-S-{tag}"}
    values = await all_tag_values(redis, keys, gen)
    assert not raw_ids & values
    assert not any(tag in v for v in values)
    # the digests are there, and every id filter still finds exactly its episodes
    assert tags.user("ns", user) in values and tags.episode("ns", "EP-" + tag + "-0") in values
    index = keys.episode_index_alias
    assert await count(redis, index, Scope(namespace="ns", tags=tags, user_id=user)) == 5
    assert await count(redis, index, Scope(namespace="ns", tags=tags, session_id=session)) == 5
    assert (
        await count(
            redis, index, Scope(namespace="ns", tags=tags, episode_id=(f"EP-{tag}-1", f"KEPT-{tag}-2"))
        )
        == 2
    )
    assert await count(redis, index, Scope(namespace="other", tags=tags, user_id=user)) == 0

    await client.forget_user(user)
    await drain(worker)
    assert await count(redis, index, Scope(namespace="ns", tags=tags, user_id=user)) == 0
    assert await count(redis, index, Scope(namespace="ns", tags=tags, user_id=f"OTHER-{tag}")) == 5
    values = await all_tag_values(redis, keys, gen)
    assert not raw_ids & values and not any(tag in v for v in values)
    if encrypted:  # without the master key nobody can compute a digest to test a guessed id
        assert tags.user("ns", user) != BLAKE2B.user("ns", user)
        with pytest.raises(ConfigError, match="ENGRAM_MASTER_KEY"):
            await generation_tags(redis, keys, gen, None)


def test_digests_are_scoped_by_namespace_and_kind_and_keyed():
    key = os.urandom(32)
    hm = TagCodec(MODE_HMAC, key)
    assert hm.user("a", "x") != hm.user("b", "x")  # the same id in two tenants
    assert hm.user("a", "x") != hm.session("a", "x") != hm.episode("a", "x")
    assert hm.user("a", "x") != TagCodec(MODE_HMAC, os.urandom(32)).user("a", "x")
    assert hm.user("a", "x") == codec(MODE_HMAC, key).user("a", "x")  # deterministic
    for c in (hm, BLAKE2B):
        d = c.user("a", "ü x\x00{}|*")
        assert len(d) == 32 and d.isalnum() and d.islower()
    with pytest.raises(ValueError):
        TagCodec(MODE_HMAC)
    with pytest.raises(ValueError):
        TagCodec("rot13")
    assert codec(MODE_BLAKE2B, key) == BLAKE2B
    with pytest.raises(ValueError):
        codec("plain", None)  # ids as given: no mode of this layout
