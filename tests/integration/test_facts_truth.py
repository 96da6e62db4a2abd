"""Facts that follow the truth, against the real Redis: facts are a function of the
episodes, not of when consolidation ran; a strategy that stopped working stops being recommended;
distinct topics give one fact each at the default (per-embedder) distance."""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from services.consolidator.facts import Consolidator
from services.consolidator.facts_plan import DEFAULT_DISTANCE
from shared.facts import FactScope
from shared.keys import Keys
from shared.redis_conn import connect
from shared.sdk import EngramClient
from tests.helpers import wait_until
from tests.integration.test_consolidator import docs, drain
from tests.integration.test_facts import FAMILIES, T0, ep, facts, make_worker, publish
from tests.integration.test_query_support import make_client  # noqa: F401  (fixture)

MINUTE = 60.0


def view(found):
    """What must not depend on the schedule: each fact's status, evidence, kind and text."""
    return sorted((f.status, f.evidence, f.kind, f.text) for f in found)


async def consolidated_once(s, redis, episodes, namespace: str):
    await publish(s, redis, episodes, namespace=namespace)
    await drain(make_worker(s, redis))
    await Consolidator(s, redis, s.embed_dim).consolidate(FactScope(namespace))
    return await facts(redis, s, namespace=namespace, level="namespace", include_superseded=True)


async def test_concurrent_publishes_with_consolidation_meanwhile_give_the_single_run_facts(settings, redis):
    """50 concurrent publishes (30 successes, then 20 failures) while a worker projects
    and consolidates every few episodes. It left 30 episodes in no fact at all; now the facts are
    those one run over the same 50 gives: the 30 successes, superseded by the 20 failures."""
    s = settings.with_(facts_every=4, facts_importance_threshold=1e9, facts_min_interval=0.02, batch_size=3)
    episodes = [
        ep(
            "mig",
            i,
            outcome="success" if i < 30 else "failure",
            at=T0 + i * MINUTE,
            error=None if i < 30 else "lock timeout",
        )
        for i in range(50)
    ]
    cons = Consolidator(s, redis, s.embed_dim)
    worker = make_worker(s, redis, on_batch=cons.on_batch)
    await worker.setup()
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    client = EngramClient(redis, namespace="live", prefix=s.prefix)
    try:
        await asyncio.gather(*(client.record(e) for e in episodes))
        keys = Keys(s.prefix)
        await wait_until(lambda: _count(docs(redis, keys, "live"), 50), message="50 projected", timeout=60)
        await wait_until(lambda: cons.runs >= 2, message="consolidations during the burst", timeout=60)
    finally:
        stop.set()
        await running
        await cons.aclose()
    await Consolidator(s, redis, s.embed_dim).consolidate(FactScope("live"))  # once everything is in
    live = await facts(redis, s, namespace="live", level="namespace", include_superseded=True)
    once = await consolidated_once(s, redis, episodes, "once")
    assert view(live) == view(once)
    covered = [e for f in live for e in f.evidence]
    assert sorted(covered) == sorted(e["episode_id"] for e in episodes)  # each episode in one fact
    (old,) = [f for f in live if f.status == "superseded"]
    (new,) = [f for f in live if f.status == "current"]
    assert (old.support, old.kind, new.support, new.kind) == (30, "strategy", 20, "failure_pattern")
    assert new.supersedes == old.fact_id


async def _count(pending, n: int) -> bool:
    return len(await pending) >= n


def week_episodes(week1: int = 5) -> list[dict]:
    """Week 1: tool/strategy X succeeds `week1` times. Week 2: X fails five times, Y succeeds five times."""
    out = [ep("mig", i, strategy="X", at=T0 + i * MINUTE) for i in range(week1)]
    for j in range(10):
        x = j % 2 == 0
        out.append(
            ep(
                "mig",
                100 + j,
                strategy="X" if x else "Y",
                outcome="failure" if x else "success",
                error="X: connection refused" if x else None,
                at=T0 + 7 * 86400 + j * MINUTE,
            )
        )
    return out


async def test_a_strategy_that_stopped_working_is_superseded_and_not_recommended(
    make_client,  # noqa: F811
    settings,
    redis,
):
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    api = await make_client(facts_every=10_000, facts_importance_threshold=1e9)
    await publish(s, redis, week_episodes(), namespace="default")
    await drain(make_worker(s, redis))
    body = await (await api.post("/v1/consolidate", json={"all_scopes": False})).json()
    assert body["results"][0]["status"] == "published"
    (current,) = (
        await (await api.post("/v1/facts/search", json={"query": "migrate the orders table"})).json()
    )["results"]
    assert sorted(current["evidence"]) == sorted(f"mig-{100 + j}" for j in range(10))
    assert "Strategies: Y succeeded 5 of 5; X succeeded 0 of 5." in current["text"]
    both = (await (await api.post("/v1/facts/search", json={"include_superseded": True})).json())["results"]
    (old,) = [f for f in both if f["status"] == "superseded"]
    assert old["superseded_by"] == current["fact_id"] and sorted(old["evidence"]) == [
        f"mig-{i}" for i in range(5)
    ]
    task = FAMILIES["mig"].format("orders")
    tip = await (await api.post("/v1/suggest", json={"task": task, "k": 30})).json()
    assert tip["successful_strategies"] == [{"strategy": "Y", "count": 5}]
    assert [c["strategy"] for c in tip["changed"]] == ["X"]
    choice = await (await api.post("/v1/strategy", json={"task": task, "k": 30})).json()
    assert (choice["strategy"], choice["rule"]) == ("Y", "reuse")


async def test_strategy_follows_the_newest_regime_even_after_a_long_good_run(
    make_client,  # noqa: F811
    settings,
    redis,
):
    """Ten old successes of X outnumber Y's five recent ones (X: 10 of 15 = 67% > 60%): counted together
    X was recommended; X's newest regime is 0 of 5."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    api = await make_client()
    await publish(s, redis, week_episodes(week1=10), namespace="default")
    await drain(make_worker(s, redis))
    choice = await (
        await api.post("/v1/strategy", json={"task": FAMILIES["mig"].format("orders"), "k": 30})
    ).json()
    assert (choice["strategy"], choice["rule"]) == ("Y", "reuse")
    (changed,) = choice["evidence"]["changed"]
    assert (changed["strategy"], changed["earlier_successes"], changed["successes"]) == ("X", 10, 0)


def test_property_any_schedule_of_publishes_and_runs_gives_the_single_run_facts(settings):
    """Hypothesis over the real pipeline (SDK -> stream -> worker -> consolidator): episodes of two
    families whose outcomes may flip, published in any order in chunks, consolidated after any chunk;
    the facts in the end equal those one run over the same episodes gives."""
    episode = st.tuples(st.sampled_from(["mig", "ui"]), st.integers(0, 40), st.sampled_from(["X", "Y"]))

    @hsettings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        st.lists(episode, min_size=6, max_size=24),
        st.randoms(use_true_random=False),
        st.lists(st.booleans(), min_size=24, max_size=24),
    )
    def check(eps, rng, runs):
        flip = {"mig": 20, "ui": 30}  # X stops working at t=20 (mig) / t=30 (ui); Y always works
        episodes = [
            ep(
                fam,
                i,
                strategy=strat,
                at=T0 + t * MINUTE,
                outcome="success" if strat == "Y" or t < flip[fam] else "failure",
            )
            for i, (fam, t, strat) in enumerate(eps)
        ]
        order = list(range(len(episodes)))
        rng.shuffle(order)
        asyncio.run(_schedule(settings, [episodes[i] for i in order], runs))

    try:
        check()
    finally:
        asyncio.run(_drop_prefix(settings.redis_url, settings.prefix))


async def _schedule(settings, episodes, runs) -> None:
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9)
    redis = connect(s.redis_url)
    tag = uuid.uuid4().hex[:8]
    live, once = f"live-{tag}", f"once-{tag}"
    try:
        worker = make_worker(s, redis)
        cons = Consolidator(s, redis, s.embed_dim)
        client = EngramClient(redis, namespace=live, prefix=s.prefix)
        chunk = 1 + len(episodes) // 4
        for k in range(0, len(episodes), chunk):
            await asyncio.gather(*(client.record(e) for e in episodes[k : k + chunk]))
            await drain(worker)
            if runs[k // chunk]:
                await cons.consolidate(FactScope(live))
        await cons.consolidate(FactScope(live))
        got = await facts(redis, s, namespace=live, level="namespace", include_superseded=True)
        want = await consolidated_once(s, redis, episodes, once)
        assert view(got) == view(want)
    finally:
        await redis.aclose()


async def _drop_prefix(url: str, prefix: str) -> None:
    redis = connect(url)
    try:
        for name in await redis.execute_command("FT._LIST"):
            if name.decode().startswith(prefix):
                await redis.execute_command("FT.DROPINDEX", name)
        async for key in redis.scan_iter(match=f"{prefix}*", count=1000):
            await redis.unlink(key)
    finally:
        await redis.aclose()


TOPICS = {
    # five unrelated topics, four episodes each: the task varies in a word, the notes by outcome
    "migration": (
        "migrate the {} table schema in the postgres database with an alembic migration",
        ["orders", "users", "invoices", "payments"],
        [
            "added the column as nullable, backfilled it, then set not null",
            "the migration timed out waiting for a table lock",
        ],
    ),
    "flaky": (
        "fix the flaky {} button test in the react login page",
        ["submit", "reset", "cancel", "signup"],
        [
            "waited for the network request instead of sleeping; 100 runs green",
            "still flaky: element not found after 4 seconds",
        ],
    ),
    "docs": (
        "write markdown api documentation for the {} endpoint of the billing service",
        ["invoices", "refunds", "plans", "taxes"],
        [
            "documented every field with an example request and response",
            "reviewers rejected it: the examples use the v1 endpoints",
        ],
    ),
    "flight": (
        "book a flight from berlin to {} for the conference next month",
        ["lisbon", "madrid", "vienna", "oslo"],
        ["booked the cheapest direct flight and sent the e-ticket", "the card was declined at payment"],
    ),
    "refund": (
        "answer the customer asking for a refund of the damaged {}",
        ["blender", "kettle", "toaster", "lamp"],
        [
            "apologised and issued a full refund with a return label",
            "the order is too old for a refund by the payment provider",
        ],
    ),
}


async def test_distinct_topics_give_one_fact_each_at_the_default_distance(settings, redis):
    """Five unrelated topics of four episodes each in one scope, the hashing embedder at its default
    dimension (384): the old fixed 0.5 split the flaky-test topic into groups too small for a fact; the
    calibrated default (ENGRAM_FACTS_DISTANCE unset) gives one fact per topic, none mixing topics."""
    s = settings.with_(facts_every=10_000, facts_importance_threshold=1e9, embed_dim=384)
    assert s.facts_distance is None
    batch = []
    for topic, (template, words, notes) in TOPICS.items():
        for k, word in enumerate(words):
            ok = k % 2 == 0
            batch.append(
                {
                    "episode_id": f"{topic}-{k}",
                    "agent_id": "coder",
                    "completed_at": T0 + k * MINUTE,
                    "task": {"description": template.format(word), "category": "misc"},
                    "outcome": "success" if ok else "failure",
                    "solution" if ok else "outcome_details": notes[k % 2],
                }
            )
    for namespace in ("fixed", "calibrated"):
        await publish(s, redis, batch, namespace=namespace)
    await drain(make_worker(s, redis))
    cons = Consolidator(s, redis, s.embed_dim)
    assert await cons.distance(1) == DEFAULT_DISTANCE["hashing-v1"]
    await cons.consolidate(FactScope("calibrated"))
    await Consolidator(s.with_(facts_distance=0.5), redis, s.embed_dim).consolidate(FactScope("fixed"))

    def topics(found):
        return sorted(tuple(sorted({e.split("-")[0] for e in f.evidence})) for f in found)

    assert topics(await facts(redis, s, namespace="calibrated")) == [(t,) for t in sorted(TOPICS)]
    assert ("flaky",) not in topics(await facts(redis, s, namespace="fixed"))
