"""Semantic memory against the real Redis: planted task families → facts, stability, supersession,
forgetting, triggers, crash safety and replay."""

from __future__ import annotations

import time

import pytest

from services.consolidator.facts import Consolidator
from services.consolidator.replay import replay
from services.consolidator.worker import Worker
from shared import streams
from shared.embedding import HashingEmbedder
from shared.facts import FactQuery, FactScope, live_facts_index, search_facts
from shared.index import current_generation
from shared.keys import Keys
from shared.sdk import EngramClient
from shared.settings import Settings
from shared.tags import BLAKE2B
from tests.helpers import wait_until
from tests.integration.test_consolidator import drain

T0 = 1_750_000_000.0  # 2025-06-15T15:06:40Z
HOUR = 3600.0

FAMILIES = {
    "mig": "migrate the {} table schema in the postgres database with an alembic migration",
    "ui": "fix the flaky {} button test in the react login page",
    "doc": "write markdown api documentation for the {} endpoint of the billing service",
}
WORDS = [
    "orders",
    "users",
    "invoices",
    "payments",
    "carts",
    "items",
    "refunds",
    "coupons",
    "plans",
    "taxes",
    "alpha",
    "beta",
    "gamma",
    "delta",
]


def ep(
    family: str,
    i: int,
    *,
    outcome: str = "success",
    strategy: str = "iterative",
    at: float | None = None,
    user: str = "user-b",
    agent: str = "coder",
    error: str | None = None,
    importance: float | None = None,
    reward: float | None = None,
    category: str = "debugging",
) -> dict:
    actions = [{"action_type": "run_tests", "success": outcome == "success"}]
    if error:
        actions.append({"action_type": "apply", "success": False, "error": error})
    data = {
        "episode_id": f"{family}-{i}",
        "task": {"description": FAMILIES[family].format(WORDS[i % len(WORDS)]), "category": category},
        "outcome": outcome,
        "strategy_used": strategy,
        "completed_at": at if at is not None else T0 + i * HOUR,
        "user_id": user,
        "agent_id": agent,
        "actions": actions,
        "feedback": {"reward": reward if reward is not None else (1.0 if outcome == "success" else 0.0)},
    }
    if importance is not None:
        data["importance"] = importance
    return data


def make_worker(settings, redis, **kw) -> Worker:
    return Worker(settings, redis, HashingEmbedder(settings.embed_dim), name="w1", **kw)


async def publish(settings, redis, episodes, namespace="ns"):
    client = EngramClient(redis, namespace=namespace, prefix=settings.prefix)
    for e in episodes:
        await client.record(e)
    return client


async def facts(redis, settings, namespace="ns", **kw):
    keys = Keys(settings.prefix)
    hits = await search_facts(
        redis,
        await live_facts_index(redis, keys),
        FactQuery(tags=BLAKE2B, namespace=namespace, **kw),
        top_k=100,
    )
    return sorted((h.fact for h in hits), key=lambda f: f.first_at)


def planted():
    """mig: 8 of 10 succeed with iterative (2 lock timeouts); ui: 2 of 6 (tdd); doc: 0 of 5 (big-bang)."""
    out = []
    for i in range(10):
        out.append(
            ep(
                "mig",
                i,
                outcome="success" if i not in (3, 7) else "failure",
                error=None if i not in (3, 7) else "lock timeout",
                at=T0 + i * HOUR,
            )
        )
    for i in range(6):
        out.append(
            ep(
                "ui",
                i,
                outcome="success" if i < 2 else "failure",
                strategy="tdd",
                error=None if i < 2 else "element not found",
                at=T0 + 100 * HOUR + i * HOUR,
            )
        )
    for i in range(5):
        out.append(
            ep(
                "doc",
                i,
                outcome="failure",
                strategy="big-bang",
                at=T0 + 200 * HOUR + i * HOUR,
                error="missing openapi spec",
            )
        )
    return out


@pytest.fixture
async def seeded(settings, redis):
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, planted())
    worker = make_worker(s, redis)
    await drain(worker)
    return s, worker, Consolidator(s, redis, s.embed_dim)


async def test_planted_families_yield_one_fact_each(seeded, redis):
    settings, _worker, cons = seeded
    result = await cons.consolidate(FactScope("ns"))
    assert result.status == "published"
    found = await facts(redis, settings, level="namespace")
    assert [f.support for f in found] == [10, 6, 5]
    mig, ui, doc = found
    # one fact per family, never a mix
    for fact, family in ((mig, "mig"), (ui, "ui"), (doc, "doc")):
        assert {e.split("-")[0] for e in fact.evidence} == {family}
    assert mig.evidence == tuple(sorted(f"mig-{i}" for i in range(10)))
    assert (mig.successes, mig.success_rate, mig.avg_reward) == (8, 0.8, 0.8)
    assert mig.top_strategies[0] == {
        "strategy": "iterative",
        "episodes": 10,
        "successes": 8,
        "success_rate": 0.8,
    }
    assert mig.common_failures == ({"message": "lock timeout", "count": 2},)
    assert mig.kind == "strategy"
    assert (mig.first_at, mig.last_at) == (T0, T0 + 9 * HOUR)
    assert "8 of 10" in mig.text and "iterative succeeded 8 of 10" in mig.text and "lock timeout" in mig.text
    assert (ui.successes, ui.success_rate, ui.kind) == (2, 0.3333, "best_practice")
    assert (ui.first_at, ui.last_at) == (T0 + 100 * HOUR, T0 + 105 * HOUR)
    assert (doc.successes, doc.kind) == (0, "failure_pattern")
    assert {a["action_type"] for a in doc.action_types} == {"run_tests", "apply"}
    assert all(f.version == 1 and f.status == "current" and len(f.centroid) == 256 for f in found)
    # the (agent, category) scope has enough episodes too
    per_agent = await cons.consolidate(FactScope("ns", "coder", "debugging"))
    assert per_agent.status == "published"
    assert len(await facts(redis, settings, level="agent_category")) == 3


CLOSING = (
    "Task completed. I followed the user's instructions step by step, checked every intermediate result, "
    "verified the final outcome carefully and reported back to the user with a short summary of what was "
    "done. No further action is required at this point."
)


async def test_text_every_episode_shares_does_not_join_unrelated_families(settings, redis):
    """An agent's closing boilerplate in every episode's result made the stored vectors of unrelated
    families alike enough to chain into one fact; clustering compares the episodes without it."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    episodes = [{**e, "result": CLOSING} for e in planted()]
    await publish(s, redis, episodes)
    await drain(make_worker(s, redis))
    cons = Consolidator(s, redis, s.embed_dim, embedder=HashingEmbedder(s.embed_dim))
    assert (await cons.consolidate(FactScope("ns"))).status == "published"
    found = await facts(redis, s, level="namespace")
    assert [sorted({e.split("-")[0] for e in f.evidence}) for f in found] == [["mig"], ["ui"], ["doc"]]
    assert [f.support for f in found] == [10, 6, 5]
    # the centroid is still that of the stored vectors, as a replay or a forget computes it
    assert all(len(f.centroid) == s.embed_dim for f in found)


async def test_a_run_embeds_only_episodes_no_earlier_run_embedded(settings, redis):
    class Counting(HashingEmbedder):
        texts: list[str] = []

        async def embed(self, texts):
            self.texts.extend(texts)
            return await super().embed(texts)

    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, [{**e, "result": CLOSING} for e in planted()])
    worker = make_worker(s, redis)
    await drain(worker)
    embedder = Counting(s.embed_dim)
    cons = Consolidator(s, redis, s.embed_dim, embedder=embedder)
    await cons.consolidate(FactScope("ns"))
    assert len(embedder.texts) == 21 and not any("Task completed" in t for t in embedder.texts)
    embedder.texts.clear()
    await publish(s, redis, [{**ep("mig", 10, at=T0 + 10 * HOUR), "result": CLOSING}])
    await drain(worker)
    await cons.consolidate(FactScope("ns"), now=T0 + 1e6)
    assert embedder.texts == [
        "migrate the alpha table schema in the postgres database with an alembic migration"
    ]


async def test_rerun_without_new_episodes_changes_nothing(seeded, redis):
    settings, _worker, cons = seeded
    await cons.consolidate(FactScope("ns"))
    keys = Keys(settings.prefix)
    before = await facts(redis, settings)
    stream_len = await streams.length(redis, keys.stream)
    for _ in range(2):
        assert (await cons.consolidate(FactScope("ns"), now=T0 + 1e6)).status == "unchanged"
    assert await facts(redis, settings) == before
    assert await streams.length(redis, keys.stream) == stream_len


async def test_new_evidence_updates_the_same_fact(seeded, redis):
    settings, worker, cons = seeded
    await cons.consolidate(FactScope("ns"))
    (mig,) = [f for f in await facts(redis, settings) if f.support == 10]
    await publish(settings, redis, [ep("mig", 10, at=T0 + 10 * HOUR)])
    await drain(worker)
    await cons.consolidate(FactScope("ns"))
    (again,) = [f for f in await facts(redis, settings) if "mig-0" in f.evidence]
    assert again.fact_id == mig.fact_id and again.version == 2 and again.support == 11
    assert again.successes == 9 and again.updated_at > mig.updated_at and again.created_at == mig.created_at


async def test_contradicting_evidence_supersedes(settings, redis):
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, [ep("mig", i) for i in range(6)])
    worker = make_worker(s, redis)
    await drain(worker)
    cons = Consolidator(s, redis, s.embed_dim)
    await cons.consolidate(FactScope("ns"), now=T0 + 50 * HOUR)
    (old,) = await facts(redis, s)
    assert old.kind == "strategy" and old.success_rate == 1.0
    # the same kind of task now fails with the strategy that used to work
    await publish(s, redis, [ep("mig", i, outcome="failure", error="lock timeout") for i in range(6, 12)])
    await drain(worker)
    await cons.consolidate(FactScope("ns"), now=T0 + 100 * HOUR)
    (new,) = await facts(redis, s)
    assert new.supersedes == old.fact_id and new.fact_id != old.fact_id
    assert new.evidence == tuple(sorted(f"mig-{i}" for i in range(6, 12)))
    assert new.kind == "failure_pattern" and new.success_rate == 0.0
    history = await facts(redis, s, include_superseded=True)
    assert [f.fact_id for f in history] == [old.fact_id, new.fact_id]
    assert history[0].status == "superseded" and history[0].superseded_by == new.fact_id
    # as_of: before the change the old fact was the valid one
    assert [f.fact_id for f in await facts(redis, s, as_of=T0 + 60 * HOUR)] == [old.fact_id]
    assert [f.fact_id for f in await facts(redis, s, as_of=T0 + 200 * HOUR)] == [new.fact_id]
    # stable afterwards
    assert (await cons.consolidate(FactScope("ns"), now=T0 + 300 * HOUR)).status == "unchanged"


async def test_forgetting_a_user_removes_their_evidence_from_facts(settings, redis):
    """Cases C07 and C08: a forgotten user's episodes leave the facts' evidence; another user's facts stay."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    keys = Keys(s.prefix)
    mixed = [ep("mig", i, user="user-a" if i < 3 else "user-b") for i in range(8)]
    only_a = [ep("doc", i, user="user-a", outcome="failure") for i in range(4)]
    only_b = [ep("ui", i, user="user-b") for i in range(4)]
    client = await publish(s, redis, mixed + only_a + only_b)
    worker = make_worker(s, redis)
    await drain(worker)
    await Consolidator(s, redis, s.embed_dim).consolidate(FactScope("ns"))
    await drain(worker)  # the worker projects the published snapshot again (idempotent)
    before = {f.evidence[0].split("-")[0]: f for f in await facts(redis, s)}
    assert set(before) == {"mig", "doc", "ui"} and "user-a" in before["mig"].users
    await client.forget_user("user-a")
    await drain(worker)
    after = {f.evidence[0].split("-")[0]: f for f in await facts(redis, s, include_superseded=True)}
    assert set(after) == {"mig", "ui"}  # doc had only user-a's evidence: removed
    assert after["ui"] == before["ui"]  # user-b's own fact untouched
    mig = after["mig"]
    assert mig.fact_id == before["mig"].fact_id and mig.users == ("user-b",)
    assert mig.evidence == tuple(f"mig-{i}" for i in range(3, 8)) and mig.support == 5
    assert not await facts(redis, s, user_id="user-a", include_superseded=True)
    # neither the projection nor the stream keeps their ids or text
    raw = b"".join(e.payload or b"" for e in await streams.read_range(redis, keys.stream))
    for forgotten in [*(f"mig-{i}" for i in range(3)), *(f"doc-{i}" for i in range(4)), "billing service"]:
        assert forgotten.encode() not in raw, forgotten
    docs = [await redis.hget(k, "doc") async for k in redis.scan_iter(match=f"{s.prefix}*fact:*")]
    assert docs and not any(b"mig-0" in d or b"doc-1" in d or b"user-a" in d for d in docs)


async def test_a_forget_keeps_the_scope_s_minimum_when_the_setting_changed(settings, redis):
    """A forget rebuilds a scope's facts at the minimum its snapshot was built with, and records that
    minimum again: a later ENGRAM_FACTS_MIN_CLUSTER counts for new runs, not for erasing (a fact of 3
    built at 3 stays after two forgets by a worker now set to 5)."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9, facts_min_cluster=3)
    client = await publish(s, redis, [ep("mig", i) for i in range(5)])
    await drain(make_worker(s, redis))
    await Consolidator(s, redis, s.embed_dim).consolidate(FactScope("ns"))
    later = s.with_(facts_min_cluster=5)
    worker = make_worker(later, redis)
    await drain(worker)
    for gone in ("mig-0", "mig-1"):
        await client.forget_episode(gone)
        await drain(worker)
    (fact,) = await facts(redis, s)
    assert fact.evidence == ("mig-2", "mig-3", "mig-4") and fact.support == 3


async def test_trigger_fires_at_the_completed_count(settings, redis):
    s = settings.with_(facts_every=5, facts_importance_threshold=1e9)
    cons = Consolidator(s, redis, s.embed_dim)
    worker = make_worker(s, redis, on_batch=cons.on_batch)
    await publish(s, redis, [ep("mig", i, agent="solo") for i in range(4)])
    await drain(worker)
    assert cons.runs == 0 and not await facts(redis, s)
    await publish(s, redis, [ep("mig", 4, agent="solo")])
    await drain(worker)
    await cons.wait_idle()
    assert cons.runs == 2  # the namespace scope and the (agent, category) scope both reached 5
    assert [f.support for f in await facts(redis, s)] == [5, 5]
    counter = await redis.hgetall(Keys(s.prefix).scope_counter("ns", FactScope("ns").scope_id))
    assert int(counter[b"completed"]) == 0


async def test_background_trigger_does_not_hold_the_projection(settings, redis):
    """In the consolidator process, triggered runs are background tasks; they still happen, once per
    scope even when triggers pile up while a run is in progress."""
    s = settings.with_(facts_every=2, facts_importance_threshold=1e9, facts_min_interval=0.05)
    cons = Consolidator(s, redis, s.embed_dim)
    worker = make_worker(s, redis, on_batch=cons.on_batch)
    await publish(s, redis, [ep("mig", i, agent="solo") for i in range(6)])
    await drain(worker)
    await cons.wait_idle()
    assert cons.runs >= 2
    assert sorted(f.support for f in await facts(redis, s)) == [6, 6]
    await cons.aclose()


async def test_background_run_defers_to_the_projection_backlog(settings, redis):
    """A triggered run waits while the worker reports a backlog, and runs once it clears."""
    s = settings.with_(facts_every=2, facts_importance_threshold=1e9, facts_min_interval=60)
    busy, polls = True, 0

    def backlogged() -> bool:
        nonlocal polls
        polls += 1
        return busy

    cons = Consolidator(s, redis, s.embed_dim, backlogged=backlogged)
    worker = make_worker(s, redis, on_batch=cons.on_batch)
    await publish(s, redis, [ep("mig", i, agent="solo") for i in range(6)])
    await drain(worker)
    await wait_until(lambda: polls >= 6, message="the triggered runs polled the backlog")
    assert cons.runs == 0
    busy = False
    await wait_until(lambda: cons.runs >= 2, message="the runs once the backlog cleared")
    await cons.aclose()


async def test_background_run_defers_at_most_the_min_interval(settings, redis):
    """A backlog that never clears delays facts by `facts_min_interval`, not forever."""
    s = settings.with_(facts_every=2, facts_importance_threshold=1e9, facts_min_interval=0.3)
    cons = Consolidator(s, redis, s.embed_dim, backlogged=lambda: True)
    worker = make_worker(s, redis, on_batch=cons.on_batch)
    await publish(s, redis, [ep("mig", i, agent="solo") for i in range(6)])
    await drain(worker)
    await wait_until(lambda: cons.runs >= 2, message="runs despite a permanent backlog", timeout=10)
    await cons.aclose()


async def test_trigger_fires_at_the_importance_threshold(settings, redis):
    s = settings.with_(facts_every=10_000, facts_importance_threshold=20.0)
    cons = Consolidator(s, redis, s.embed_dim)
    worker = make_worker(s, redis, on_batch=cons.on_batch)
    no_agent = [{**ep("mig", i, importance=6), "agent_id": None} for i in range(4)]  # one scope only
    await publish(s, redis, no_agent[:3])
    await drain(worker)
    assert cons.runs == 0  # 18 < 20
    await publish(s, redis, no_agent[3:])
    await drain(worker)
    await cons.wait_idle()
    assert cons.runs == 1
    assert [f.support for f in await facts(redis, s)] == [4]


async def test_crash_mid_consolidation_keeps_old_facts(seeded, redis):
    settings, worker, cons = seeded
    await cons.consolidate(FactScope("ns"))
    before = await facts(redis, settings)
    stream_len = await streams.length(redis, Keys(settings.prefix).stream)
    await publish(settings, redis, [ep("mig", 10, at=T0 + 10 * HOUR)])
    await drain(worker)

    async def crash(event):
        raise RuntimeError("killed after computing, before publishing")

    cons.publish_snapshot = crash
    with pytest.raises(RuntimeError, match="killed"):
        await cons.consolidate(FactScope("ns"))
    assert await facts(redis, settings) == before
    assert await streams.length(redis, Keys(settings.prefix).stream) == stream_len + 1  # only the episode
    del cons.publish_snapshot  # the lease was released: the next run succeeds
    assert (await cons.consolidate(FactScope("ns"))).status == "published"


async def test_lease_lets_one_consolidator_run_a_scope(seeded, redis):
    settings, _worker, cons = seeded
    keys = Keys(settings.prefix)
    await redis.set(keys.consolidation_lock("ns", FactScope("ns").scope_id), "someone-else", px=60_000)
    assert (await cons.consolidate(FactScope("ns"))).status == "busy"
    assert not await facts(redis, settings)


async def test_replay_rebuilds_facts(seeded, redis):
    settings, worker, cons = seeded
    await cons.consolidate(FactScope("ns"))
    await drain(worker)
    before = await facts(redis, settings, include_superseded=True)
    assert len(before) == 3
    result = await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert result["generation"] == 2
    assert await facts(redis, settings, include_superseded=True) == before
    assert (await cons.consolidate(FactScope("ns"))).status == "unchanged"


async def test_namespaces_never_share_facts(settings, redis):
    """Case C03: the same episodes in two namespaces give each namespace its own facts."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, [ep("mig", i) for i in range(4)], namespace="ns-a")
    await publish(s, redis, [ep("mig", i) for i in range(4)], namespace="ns-b")
    await drain(make_worker(s, redis))
    cons = Consolidator(s, redis, s.embed_dim)
    await cons.consolidate(FactScope("ns-a"))
    assert len(await facts(redis, s, namespace="ns-a")) == 1
    assert await facts(redis, s, namespace="ns-b") == []


async def test_replay_rebuilds_facts_after_the_stream_was_trimmed(seeded, redis):
    settings, worker, cons = seeded
    keys = Keys(settings.prefix)
    await cons.consolidate(FactScope("ns"))
    await drain(worker)
    before = await facts(redis, settings, include_superseded=True)
    # retention trimmed every projected entry, including the FactsConsolidated snapshot
    entries = await streams.read_range(redis, keys.stream, count=10_000)
    await streams.delete(redis, keys.stream, [e.stream_id for e in entries])
    await replay(settings, redis, HashingEmbedder(settings.embed_dim))
    assert await facts(redis, settings, include_superseded=True) == before
    assert (await cons.consolidate(FactScope("ns"))).status == "unchanged"


async def test_background_runs_keep_the_interval_across_workers(settings, redis):
    """Two worker processes must not each run a scope once per interval, seconds apart. A run marks
    the scope for the interval in Redis: another worker's trigger waits for it, then runs only if the
    trigger counter is still at the threshold (the earlier run may have consumed it)."""
    s = settings.with_(facts_every=2, facts_importance_threshold=1e9, facts_min_interval=1.0)
    scope = FactScope("ns")
    counter = Keys(s.prefix).scope_counter(scope.namespace, scope.scope_id)
    calls: dict[str, list[float]] = {"a": [], "b": []}

    def counting(cons, name):
        real = cons.consolidate

        async def consolidate(sc, **kw):
            calls[name].append(time.monotonic())
            return await real(sc, **kw)

        cons.consolidate = consolidate
        return cons

    await make_worker(s, redis).setup()  # the episode index the runs read
    a = counting(Consolidator(s, redis, s.embed_dim), "a")
    b = counting(Consolidator(s, redis, s.embed_dim), "b")
    await redis.hincrby(counter, "completed", 2)
    a._schedule(scope)
    await a.wait_idle()
    assert len(calls["a"]) == 1 and int((await redis.hgetall(counter))[b"completed"]) == 0
    assert 0 < await redis.pttl(Keys(s.prefix).facts_recent(scope.namespace, scope.scope_id)) <= 1000
    b._schedule(scope)  # a trigger that a's run already consumed: waits out the interval, then skips
    await b.wait_idle()
    assert calls["b"] == []
    await redis.hincrby(counter, "completed", 2)  # new episodes: b runs, once a's interval is over
    a._schedule(scope)
    b._schedule(scope)
    await a.wait_idle()
    await b.wait_idle()
    runs = sorted(calls["a"][1:] + calls["b"])
    assert len(runs) == 1 and runs[0] - calls["a"][0] >= 0.9
    await a.aclose()
    await b.aclose()


async def test_triggers_absorbed_by_a_pending_run_log_at_debug(settings, redis, caplog):
    """One INFO line per scheduled run, not one per batch past the threshold."""
    import logging

    # one lane: with four, two batches could count before one of them checks, merging two triggers
    # (7 instead of 8 under load)
    s = settings.with_(
        facts_every=2, facts_importance_threshold=1e9, facts_min_interval=60, batch_size=1, in_flight=1
    )
    cons = Consolidator(s, redis, s.embed_dim)
    worker = make_worker(s, redis, on_batch=cons.on_batch)
    await worker.setup()
    for scope in (FactScope("ns"), FactScope("ns", "solo", "mig")):  # each run waits: keep it pending
        await redis.set(Keys(s.prefix).facts_recent(scope.namespace, scope.scope_id), b"1", px=60_000)
    await publish(s, redis, [ep("mig", i, agent="solo") for i in range(5)])
    with caplog.at_level(logging.DEBUG, logger="engram.facts"):
        await drain(worker)
    triggers = [r for r in caplog.records if "facts ◆ trigger" in r.getMessage()]
    # up to 4 batches reach the threshold, for 2 scopes: 8 triggers, fewer when a loaded machine lets
    # one read take two entries; whatever their number, one INFO per scheduled run, the rest DEBUG
    levels = sorted(r.levelno for r in triggers)
    assert 4 <= len(triggers) <= 8, levels
    assert levels == [logging.DEBUG] * (len(triggers) - 2) + [logging.INFO] * 2
    await cons.aclose()


async def test_a_forget_rebuilds_facts_under_the_configured_lease(seeded, redis, monkeypatch):
    """The projector's forget hook built its Consolidator from default Settings, so a forget-triggered
    rebuild held the scope's lock for the default 30 s lease whatever ENGRAM_LEASE_MS said:
    while the rebuild runs, the lock's PTTL is within the configured lease (2 s in these tests)."""
    from services.consolidator.facts import Consolidator

    settings, worker, cons = seeded
    assert settings.lease_ms < Settings().lease_ms
    await cons.consolidate(FactScope("ns"))
    await drain(worker)
    (mig,) = [f for f in await facts(redis, settings) if "mig-0" in f.evidence]
    keys = Keys(settings.prefix)
    held: list[tuple[str, int]] = []
    rebuild = Consolidator._forget_in_scope

    async def spy(consolidator, gen, namespace, scope_id, forgotten):
        held.append((scope_id, await redis.pttl(keys.consolidation_lock(namespace, scope_id))))
        return await rebuild(consolidator, gen, namespace, scope_id, forgotten)

    monkeypatch.setattr(Consolidator, "_forget_in_scope", spy)
    await EngramClient(redis, namespace="ns", prefix=settings.prefix).forget_episode("mig-0")
    await drain(worker)
    assert [scope_id for scope_id, _ in held] == [FactScope("ns").scope_id]
    assert all(0 < pttl <= settings.lease_ms for _, pttl in held), held
    (again,) = [f for f in await facts(redis, settings) if "mig-1" in f.evidence]
    assert again.fact_id == mig.fact_id and "mig-0" not in again.evidence and again.support == 9


async def test_forgets_in_one_batch_rebuild_a_fact_once(seeded, redis, monkeypatch):
    """`DELETE /v1/agents/{id}` of 2,330 episodes in a fact's evidence took 160 s (a
    user's forget of as many: 2 s): every `EpisodeForgotten` rebuilt the scope's facts on its own. The
    batch's forgets now rebuild each scope once, after all of them are erased."""
    from services.consolidator.facts import Consolidator

    settings, worker, cons = seeded
    await cons.consolidate(FactScope("ns"))
    await drain(worker)
    rebuilt: list[tuple[str, tuple[str, ...]]] = []
    rebuild = Consolidator._forget_in_scope

    async def spy(consolidator, gen, namespace, scope_id, forgotten):
        rebuilt.append((scope_id, tuple(sorted(forgotten))))
        return await rebuild(consolidator, gen, namespace, scope_id, forgotten)

    monkeypatch.setattr(Consolidator, "_forget_in_scope", spy)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    gone = [f"mig-{i}" for i in range(6)]
    for eid in gone:
        await client.forget_episode(eid)
    await drain(worker)
    assert len(rebuilt) == 1 and set(rebuilt[0][1]) == set(gone), rebuilt
    (left,) = [f for f in await facts(redis, settings) if "mig-9" in f.evidence]
    assert not set(left.evidence) & set(gone) and left.support == 4


async def _cursor_reads(redis) -> int:
    """FT.CURSOR calls the server has answered (INFO commandstats)."""
    stats = await redis.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if "cursor" in k.lower())


async def test_episodes_are_read_in_pages_with_the_facts_of_one_page(seeded, redis, monkeypatch):
    """A 300,000-episode namespace ran past the search module's TIMEOUT in one sorted search; the
    episodes are read in pages now (`facts_store.load_rows`). Pages of 3 give the rows, and the
    facts, of one page of everything."""
    from services.consolidator import facts_store
    from services.consolidator.facts_plan import plan

    settings, _worker, cons = seeded
    keys = Keys(settings.prefix)
    index, scope = keys.episode_index_alias, FactScope("ns")
    one = await facts_store.load_rows(redis, index, scope, 1000, BLAKE2B, page=1000)
    reads = await _cursor_reads(redis)
    paged = await facts_store.load_rows(redis, index, scope, 1000, BLAKE2B, page=3)
    assert await _cursor_reads(redis) - reads >= 21 // 3  # 21 episodes, 3 per read
    assert [r.episode_id for r in paged] == [r.episode_id for r in one] and len(one) == 21
    newest = sorted(planted(), key=lambda e: e["completed_at"])[-12:]
    assert [r.episode_id for r in await facts_store.load_rows(redis, index, scope, 12, BLAKE2B, page=5)] == [
        e["episode_id"] for e in newest
    ]

    monkeypatch.setattr(facts_store, "PAGE", 3)
    assert (await cons.consolidate(scope, now=T0 + 1e6)).status == "published"
    planned = plan(
        scope, one, [], min_cluster=settings.facts_min_cluster, distance=await cons.distance(1), now=T0
    )
    assert planned is not None
    assert sorted((f.evidence, f.support, f.text) for f in await facts(redis, settings)) == sorted(
        (f.evidence, f.support, f.text) for f in planned[0]
    )


async def test_episodes_are_read_in_pages_on_a_cluster(cluster_settings, cluster_redis):
    """The cursor's reads go to the node of the namespace's index, where the cursor lives."""
    from services.consolidator.facts_store import load_rows
    from shared import cluster

    s, redis = cluster_settings, cluster_redis
    await publish(s, redis, planted()[:7], namespace="paged")
    await drain(make_worker(s, redis))
    index, scope = Keys(s.prefix).episode_index_alias, FactScope("paged")
    with cluster.route("paged"):
        one = await load_rows(redis, index, scope, 100, BLAKE2B, page=100)
        paged = await load_rows(redis, index, scope, 100, BLAKE2B, page=2)
    assert [r.episode_id for r in paged] == [r.episode_id for r in one] == [f"mig-{i}" for i in range(7)]


async def test_an_episode_re_published_under_another_user_leaves_the_first_users_facts(settings, redis):
    """Facts distilled from an episode while it was one user's are rebuilt when it becomes another
    user's: forgetting the first user then leaves no fact naming them, or built from their version."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    mixed = [ep("mig", i, user="user-a" if i == 0 else "user-b") for i in range(8)]
    client = await publish(s, redis, mixed)
    worker = make_worker(s, redis)
    await drain(worker)
    await Consolidator(s, redis, s.embed_dim).consolidate(FactScope("ns"))
    await drain(worker)
    [before] = await facts(redis, s)
    assert "user-a" in before.users
    await publish(s, redis, [ep("mig", 0, user="user-b")])
    await drain(worker)
    await client.forget_user("user-a")
    await drain(worker)
    assert not await facts(redis, s, user_id="user-a", include_superseded=True)
    docs = [await redis.hget(k, "doc") async for k in redis.scan_iter(match=f"{s.prefix}*fact:*")]
    assert not any(b"user-a" in d for d in docs if d)


GERMAN = {
    "tisch": (
        "im Restaurant angerufen und eine Bestätigungsnummer erhalten",
        [
            "Reserviere einen Tisch für vier Personen beim Italiener am Freitagabend",
            "Finde ein Restaurant mit veganen Gerichten und reserviere einen Tisch",
            "Buche einen Tisch in einem Sushi-Lokal für Samstagabend",
            "Reserviere ein Mittagessen für das sechsköpfige Team nächsten Dienstag",
        ],
    ),
    "zug": (
        "der ICE um 6:30 kostet 29,90 mit Sparpreis",
        [
            "Finde den günstigsten Zug von Berlin nach München am nächsten Montag",
            "Prüfe, ob der Zug um 8:15 nach Köln Verspätung hat",
            "Kaufe eine Bahnfahrkarte nach Wien für die Konferenz",
            "Finde eine Nachtzugverbindung nach Amsterdam",
        ],
    ),
}


async def test_an_english_model_s_scope_in_german_is_also_compared_by_its_words(settings, redis):
    """German episodes an English model places together (here: one vector for all) make one fact; with
    the index recorded as built by MiniLM their words count too and each topic makes a fact of its own."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9, facts_distance=0.5)
    vector = [1.0] + [0.0] * (s.embed_dim - 1)
    episodes = [
        {
            **ep("mig", k, at=T0 + (2 * i + k) * HOUR),
            "episode_id": f"{topic}-{i}",
            "task": {"description": task, "category": "errands"},
            "solution": note,
            "vector": vector,
        }
        for k, (topic, (note, tasks)) in enumerate(GERMAN.items())
        for i, task in enumerate(tasks)
    ]
    await publish(s, redis, episodes)
    await drain(make_worker(s, redis))
    cons = Consolidator(s, redis, s.embed_dim)
    assert (await cons.consolidate(FactScope("ns"))).status == "published"
    assert [len(f.evidence) for f in await facts(redis, s, level="namespace")] == [8]
    keys = Keys(s.prefix)
    await redis.hset(keys.meta, f"g{await current_generation(redis, keys)}:embedder", "minilm-l6-v2")
    assert (await cons.consolidate(FactScope("ns"))).status == "published"
    found = await facts(redis, s, level="namespace")
    assert [sorted(f.evidence) for f in found] == [
        [f"tisch-{i}" for i in range(4)],
        [f"zug-{i}" for i in range(4)],
    ]
