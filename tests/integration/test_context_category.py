"""`POST /v1/context` (working memory) against the real Redis: what its `category` does."""

from __future__ import annotations

pytest_plugins = ["tests.integration.test_query_support"]


async def test_a_category_names_the_prompt_and_picks_a_profile_but_does_not_filter(api, settings, redis):
    """`POST /v1/context` and `/v1/strategy` do not filter by `category`: as the docs say, it only
    names the prompt's section (context) or picks the skill profile (strategy): a model that
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
