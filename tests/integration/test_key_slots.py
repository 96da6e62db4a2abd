"""Every Lua script of the projection, forgetting and facts is given keys of one hash slot.

On a Redis Cluster a script whose keys span slots fails with CROSSSLOT. This runs the consolidator's
paths (the fast path, the slow path across batches, forgetting an episode and a user, facts with a
forget that rebuilds them) for namespaces and users with awkward names (braces, colons, Unicode) on
the test Redis, records the keys of every script call, and computes their slots as the cluster would
(`redis.crc.key_slot`). The global keys (the stream, the meta hash, the deployment key) are a separate
concern: the scripts that touch only them are listed and checked to be what they are.
"""

from __future__ import annotations

import random
import time

import pytest
from redis.asyncio.lock import Lock
from redis.commands.core import AsyncScript
from redis.crc import key_slot

from engram_episodic.events import Action, ActionRecorded
from services.consolidator.facts import Consolidator
from services.consolidator.scripts import FORGET_USER_LUA, PROJECT_LUA, RECORD_LUA
from shared import partitions as partitions_module
from shared.facts import FactScope
from shared.keys import Keys, ns_tag
from shared.sdk import EngramClient
from shared.streams import PUBLISH_LUA
from tests.integration.test_consolidator import drain
from tests.integration.test_facts import ep, make_worker

AWKWARD = ["ns", "team{a}", "{", "}{", "a:b:{c}", "ünïcode-名前", "x" * 200]


@pytest.fixture
def calls(monkeypatch):
    recorded: list[tuple[str, list[str]]] = []
    original = AsyncScript.__call__

    async def record(self, keys=None, args=None, client=None):
        recorded.append(
            (self.script if isinstance(self.script, str) else self.script.decode(), list(keys or []))
        )
        return await original(self, keys=keys, args=args, client=client)

    monkeypatch.setattr(AsyncScript, "__call__", record)
    return recorded


def test_a_namespace_tag_is_one_slot_for_any_namespace():
    rng = random.Random(16)
    keys = Keys("engram:")
    for _ in range(300):
        ns = "".join(rng.choice("ab{}:*ü名 ") for _ in range(rng.randint(0, 12)))
        tag = ns_tag(ns)
        assert tag.count("{") == 1 and tag.count("}") == 1  # the digest is hex: no brace inside
        names = [
            keys.tombstone(ns, "e"),
            keys.user_tombstone(ns, "u"),
            keys.agent_tombstone(ns, "a"),
            keys.session_tombstone(ns, "s"),
            keys.dead_letter_refs(ns, "e"),
            keys.user_dead_letters(ns, "u"),
            keys.episode_events(3, ns, "e"),
            keys.episode_stream_ids(3, ns, "e"),
            keys.episode_doc(3, ns, "e"),
            keys.fact_doc(3, ns, "f"),
            keys.fact_scope(3, ns, "s"),
            keys.scope_counter(ns, "s"),
            keys.facts_recent(ns, "s"),
            keys.consolidation_lock(ns, "s"),
        ]
        assert len({key_slot(n.encode()) for n in names}) == 1, ns
        assert keys.episode_doc(3, ns, "e").startswith(keys.episode_doc_prefix(3))
        assert keys.fact_doc(3, ns, "f").startswith(keys.fact_doc_prefix(3))
        # replay finds an episode's stream ids from its event hash's key alone
        tail = keys.episode_events(3, ns, "e").removeprefix(f"{keys.gen_prefix(3)}evs:")
        assert keys.episode_stream_ids_of(3, tail) == keys.episode_stream_ids(3, ns, "e")


@pytest.mark.parametrize("partitions", [1, 16])
async def test_every_projection_forgetting_and_facts_script_is_single_slot(
    settings, redis, calls, partitions
):
    # with 16 partitions (a cluster's default) and a master key, the publish scripts too: each checks
    # its partition's marker or data keys, in the partition's slot
    master_key = b"m" * 32 if partitions > 1 else None
    s = settings.with_(facts_every=3, batch_size=7, stream_partitions=partitions, master_key=master_key)
    worker = make_worker(s, redis)
    cons = Consolidator(s, redis, s.embed_dim)

    def sdk(ns: str) -> EngramClient:
        return EngramClient(
            redis, namespace=ns, prefix=s.prefix, partitions=partitions, master_key=master_key
        )

    for n, ns in enumerate(AWKWARD):
        client = sdk(ns)
        for i in range(4):  # several namespaces in one batch: the fast path's chunks must not mix them
            await client.record(ep("mig", i, user=f"user-{n % 3}{{x}}"))
        async with client.episode(task="slow path", user_id=f"user-{n % 3}{{x}}") as draft:
            await draft.action("run", success=True)
            await drain(worker)  # the start and the action in earlier batches than the completion
            await draft.complete("success", solution="done")
        # an action before its episode's start: recorded alone (the slow path's RECORD_LUA)
        await client.publish(
            [
                ActionRecorded(
                    namespace=ns,
                    episode_id="early",
                    occurred_at=time.time(),
                    action=Action(action_type="run"),
                )
            ]
        )
        await drain(worker)
        await client.record(ep("mig", 9) | {"episode_id": "early"})
    await drain(worker)
    for ns in AWKWARD:
        await cons.consolidate(FactScope(ns))
    await drain(worker)
    for n, ns in enumerate(AWKWARD):
        client = sdk(ns)
        await client.forget_episode("mig-0")  # rebuilds the facts that cited it
        await client.forget_user(f"user-{(n + 1) % 3}{{x}}")
    await drain(worker)
    await cons.aclose()

    k = s.keys
    assert (len({k.partition(ns) for ns in AWKWARD}) > 1) == (partitions > 1)  # several partitions in use
    # one partition: the stream and the deployment key (or data keys) are in different slots, which a
    # single Redis does not mind
    global_keys = (
        {k.stream, k.stream_compaction(k.stream), k.meta, k.deployment_key} if partitions == 1 else set()
    )
    scripts_seen, publishing = set(), set()
    for script, names in calls:
        if (
            any(name in global_keys or name.startswith(k.data_key_prefix) for name in names)
            and partitions == 1
        ):
            # publishing into the one stream: with the deployment key or data keys
            assert "XADD" in script or "HSET" in script, (script[:120], names)
            publishing.add(script)
            continue
        scripts_seen.add(script)
        slots = {key_slot(name.encode()) for name in names}
        assert len(slots) == 1, (script[:120], names)
    # the fast path, the slow path's record and write, forgetting a user, the facts lease
    assert {PROJECT_LUA, RECORD_LUA, FORGET_USER_LUA, Lock.LUA_RELEASE_SCRIPT} <= scripts_seen
    if partitions == 1:
        assert publishing
    else:  # the sealed publish, and the start record (layout, partitions), were seen and are single-slot
        assert {PUBLISH_LUA, partitions_module.START_LUA} <= scripts_seen
