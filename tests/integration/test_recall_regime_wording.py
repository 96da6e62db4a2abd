"""Recall and advice agree on what works now when the new approach is worded away from the question
(real Redis, through the HTTP API).

Week 1 the agent installs the billing service's dependencies with `pip`, each task worded as the
question; week 2 `pip` fails and `uv` succeeds on tasks worded "refresh the python packages ... after
the lockfile change": more than SUPERSEDED_GAP less relevant than the old successes, yet alike enough
for `/v1/strategy` to read them and name `uv`. Recall and `/v1/context` must lead with `uv` too, whether
`pip`'s failures are worded as the question or as the `uv` successes, and behind hundreds of alike old
successes. A recent success of an unrelated task, with another tool, is never lifted.
"""

from __future__ import annotations

import pytest

from tests.integration.test_consolidator import drain
from tests.integration.test_facts import make_worker, publish
from tests.integration.test_query_support import make_client  # noqa: F401  (fixture)
from tests.integration.test_recall_regimes import DAY, T0, TASK, attempt, kind

REWORDED = "refresh the python packages of the billing service after the lockfile change"
NEAR_FAILURE = f"{TASK} after the lockfile update on the build host"
UNRELATED = "deploy the documentation website"  # cosine < MIN_SIMILARITY: no experience of TASK


def history(before: int, failure_text: str, unrelated: int = 0) -> list[dict]:
    """`before` pip successes worded as TASK; a week later 4 pip failures worded `failure_text` and 6 uv
    successes worded REWORDED, alternating; then `unrelated` certbot successes of another task."""
    out = [attempt(i, "pip", True, T0 + i * 60, "actions") for i in range(before)]
    week2 = [("pip", False), ("uv", True)] * 4 + [("uv", True)] * 2
    week2 += [("certbot", True)] * unrelated
    for j, (tool, ok) in enumerate(week2):
        e = attempt(1000 + j, tool, ok, T0 + 7 * DAY + j * 60, "actions")
        e["task"]["description"] = {"pip": failure_text, "uv": REWORDED}.get(tool, UNRELATED)
        out.append(e)
    return out


async def answers(api, mode: str, top_k: int) -> tuple[list[dict], list[dict], dict]:
    recalled = await (await api.post("/v1/recall", json={"query": TASK, "top_k": top_k, "mode": mode})).json()
    context = await (await api.post("/v1/context", json={"task": TASK, "top_k": 5})).json()
    choice = await (await api.post("/v1/strategy", json={"task": TASK})).json()
    return recalled["results"], context["results"], choice


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
@pytest.mark.parametrize(
    ("before", "failure_text"),
    [(8, NEAR_FAILURE), (8, REWORDED), (300, REWORDED)],
    ids=["failures-near", "failures-reworded", "failures-reworded-behind-300"],
)
async def test_recall_agrees_with_advice_on_a_reworded_successor(
    make_client,  # noqa: F811
    settings,
    redis,
    mode,
    before,
    failure_text,
):
    api = await make_client(recall_mode=mode)
    await publish(settings, redis, history(before, failure_text), namespace="default")
    await drain(make_worker(settings, redis))
    results, context, choice = await answers(api, mode, 10)
    assert (choice["strategy"], choice["rule"]) == ("uv", "reuse"), choice
    kinds = [kind(r, "pip") for r in results][:5]
    assert kinds[0] == "now" and "evidence" in kinds and "stale" not in kinds, kinds
    shown = [kind(r, "pip") for r in context]
    assert shown[0] == "now" and "stale" not in shown, shown
    for r in results:
        assert sum(r["components"].values()) == pytest.approx(r["priority"], abs=1e-9)
        assert 0.0 <= r["priority"] <= 1.0


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
async def test_an_unrelated_recent_success_is_not_lifted(make_client, settings, redis, mode):  # noqa: F811
    """Certbot succeeded on another task while pip was failing: it is no successor of pip, so it keeps
    its own priority and ranks below every uv success."""
    api = await make_client()
    await publish(settings, redis, history(8, NEAR_FAILURE, unrelated=3), namespace="default")
    await drain(make_worker(settings, redis))
    body = await (await api.post("/v1/recall", json={"query": TASK, "top_k": 21, "mode": mode})).json()
    results = body["results"]
    tools = [r["episode"]["actions"][0]["action_type"] for r in results]
    assert tools.count("certbot") == 3 and tools.count("uv") == 6, tools
    certbot = [r for r in results if r["episode"]["actions"][0]["action_type"] == "certbot"]
    assert all("regime" not in r["components"] for r in certbot), certbot
    assert max(i for i, t in enumerate(tools) if t == "uv") < tools.index("certbot"), tools
    assert kind(results[0], "pip") == "now", tools
