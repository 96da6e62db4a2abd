"""ENGRAM_CONTEXT_EPISODES' windowed re-base (context.SessionContext._window) against the real Redis:
after random sequences of publishes (out of order, tied completed_at, several users, session moves,
re-timed episodes) and erasures, re-basing every session whole changes no byte (vector, context_text,
context_of): the window recomputed everything a whole-session re-base would."""

from __future__ import annotations

import dataclasses
import random

import pytest

from services.consolidator.context import CONTEXT_FIELD, CONTEXT_OF_FIELD, SessionContext
from shared.index import current_generation
from shared.keys import Keys
from shared.sdk import EngramClient
from tests.integration.test_consolidator import drain, make_worker

pytest_plugins = ["tests.integration.test_query_support"]

WORDS = "sunrise lake support group painting stories school hiking dinner guitar novel garden".split()


async def snapshot(redis, keys: Keys, ns: str, eids: list[str]) -> dict[str, tuple]:
    gen = await current_generation(redis, keys)
    out = {}
    for eid in eids:
        out[eid] = tuple(
            await redis.hmget(keys.episode_doc(gen, ns, eid), "vector", CONTEXT_FIELD, CONTEXT_OF_FIELD)
        )
    return out


@pytest.mark.parametrize("seed", range(4))
async def test_the_windowed_rebase_leaves_the_bytes_of_the_whole_session_rebase(settings, redis, seed):
    settings = dataclasses.replace(settings, context_episodes=1)
    keys = Keys(settings.prefix)
    rng = random.Random(seed)
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    worker = make_worker(settings, redis)
    eids = [f"e{i}" for i in range(40)]
    live: set[str] = set()
    for _step in range(14):
        for _ in range(rng.randint(1, 6)):  # one batch: out of order, ties, users, moves, re-timings
            eid = rng.choice(eids)
            at = float(rng.choice([rng.randint(1, 60), 30]))  # 30: many ties
            ep = {
                "episode_id": eid,
                "task": " ".join(rng.sample(WORDS, 3)) + f" {eid}",
                "outcome": "success",
                "session_id": rng.choice(["s1", "s1", "s1", "s2"]),
                "started_at": at,
                "completed_at": at,
            }
            user = rng.choice([None, None, "alice", "bob"])
            if user is not None:
                ep["user_id"] = user
            await client.record(ep)
            live.add(eid)
        if live and rng.random() < 0.4:
            await client.forget_episode(gone := rng.choice(sorted(live)))
            live.discard(gone)
        await drain(worker)
        got = await snapshot(redis, keys, "ns", eids)
        gen = await current_generation(redis, keys)
        context = SessionContext(redis, keys.episode_index(gen))
        touches = await context.sessions_of([keys.episode_doc(gen, "ns", e) for e in eids])
        assert await context.refresh_sessions(touches, whole=True) == 0
        assert await snapshot(redis, keys, "ns", eids) == got


async def test_a_category_names_the_prompt_and_picks_a_profile_but_does_not_filter(api, settings, redis):
    """A new-user trial: `POST /v1/context` and `/v1/strategy` filtered by `category`, though the docs
    say it only names the prompt's section (context) or picks the skill profile (strategy): a model that
    guessed `debugging` for episodes stored as `unknown` got an empty memory. `suggest` keeps its
    documented filter. A category longer than an episode's may be (128) is a 422."""
    from tests.integration.test_query_e2e import drain

    eps = [
        {
            "episode_id": f"c{i}",
            "task": {"description": "deploy the billing service", "category": cat},
            "outcome": "success",
        }
        for i, cat in enumerate(["debugging", "testing", "ops", "ops"])
    ]
    assert (await api.post("/v1/episodes", json={"episodes": eps})).status == 202
    await drain(settings, redis)
    task = "deploy the billing service"
    for category in (None, "debugging", "nonexistent"):
        body = {"task": task, **({"category": category} if category else {})}
        ctx = await (await api.post("/v1/context", json={**body, "top_k": 10})).json()
        assert {r["episode"]["episode_id"] for r in ctx["results"]} == {"c0", "c1", "c2", "c3"}, category
        assert len(ctx["short_term"]) == 4
        strategy = await (await api.post("/v1/strategy", json={**body, "min_similarity": -1})).json()
        assert strategy["evidence"]["similar_episodes"] == 4, (category, strategy)
    suggested = await api.post("/v1/suggest", json={"task": task, "category": "ops", "min_similarity": -1})
    assert suggested.status == 200
    long = await api.post("/v1/context", json={"task": task, "category": "x" * 129})
    assert long.status == 422 and (await long.json())["errors"][0]["field"] == "category"
