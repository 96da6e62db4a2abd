"""Recall finds what works now when the similarity lists hold only what used to (real Redis, through the
HTTP API).

Week 1 the agent installs a project's dependencies with `pip` hundreds of times, its tasks worded
close to the question (a few almost as the question itself); week 2 `pip` fails on the same task and
`uv`, described a little differently, succeeds. The old successes alone fill the nearest-neighbour
list and outrank any episode outside it by more than the other signals could make up, so without
looking further the pool never holds a `uv` episode and the old successes lead.
"""

from __future__ import annotations

import random

import pytest

from tests.integration.test_consolidator import drain
from tests.integration.test_facts import make_worker, publish
from tests.integration.test_query_support import make_client  # noqa: F401  (fixture)
from tests.integration.test_recall_regimes import DAY, GREEK, T0, attempt, kind

QUESTION = "how do I install the dependencies"


def history(before: int) -> list[dict]:
    """`before` pip successes (one in 20 worded as the question), then 3 pip failures worded as the
    question and 7 uv successes worded otherwise, alternating."""
    rng = random.Random(before)
    out = []
    for i in range(before):
        e = attempt(i, "pip", True, T0 + i * 60, "actions")
        e["task"]["description"] = (
            f"{'how do I ' if i % 20 == 0 else ''}install the dependencies {rng.choice(GREEK)}"
        )
        out.append(e)
    week2 = [("uv", True), ("pip", False)] * 3 + [("uv", True)] * 4
    for j, (tool, ok) in enumerate(week2):
        e = attempt(1000 + j, tool, ok, T0 + 7 * DAY + j * 60, "actions")
        e["task"]["description"] = (
            "install the dependencies with the lockfile"
            if ok
            else f"how do I install the dependencies {GREEK[j]}"
        )
        out.append(e)
    return out


@pytest.mark.parametrize("before", [60, 150, 400])
async def test_recall_reaches_what_works_now_beyond_the_nearest_list(make_client, settings, redis, before):  # noqa: F811
    api = await make_client(recall_mode="vector")
    await publish(settings, redis, history(before), namespace="default")
    await drain(make_worker(settings, redis))
    body = await (await api.post("/v1/recall", json={"query": QUESTION, "top_k": 5})).json()
    top = [kind(r, "pip") for r in body["results"]]
    assert "now" in top and "stale" not in top, top
    context = await (await api.post("/v1/context", json={"task": QUESTION, "top_k": 5})).json()
    shown = [kind(r, "pip") for r in context["results"]]
    assert "now" in shown and "stale" not in shown, shown
