"""Recall, `/v1/context` and `/v1/strategy` give one answer to one question (real Redis, through the
HTTP API): what works now is decided on the episodes that are experience of the task, a cosine of at
least `insights.MIN_SIMILARITY` (advice's `min_similarity` default) to it, in every mode but keyword.

Week 1 `pip` installs the billing service's dependencies, each task worded as the question; week 2 `pip`
fails and `uv` succeeds on tasks about CI runners and containers that share no word with it. Nothing
shows that `pip` stopped working for this task: no answer may lead with a barely related `uv` success.
"""

from __future__ import annotations

import pytest

from tests.integration.test_consolidator import drain
from tests.integration.test_facts import make_worker, publish
from tests.integration.test_query_support import make_client  # noqa: F401  (fixture)
from tests.integration.test_recall_regimes import CASES, DAY, T0, TASK, attempt, history, kind, tool_of

AWAY = {
    "pip": [
        "bootstrap venv on new runner",
        "provisioning step broke in CI container",
        "nightly pipeline env",
    ],
    "uv": ["sync environment from uv.lock on runner", "provision CI container environment", "nightly venv"],
}


def away_history(recorded: str) -> list[dict]:
    """8 pip successes worded as TASK; a week later 3 pip failures and 3 uv successes worded AWAY."""
    out = [attempt(i, "pip", True, T0 + i * 60, recorded) for i in range(8)]
    for j, (tool, ok, text) in enumerate(
        (tool, ok, text)
        for a, b in zip(AWAY["pip"], AWAY["uv"], strict=True)
        for tool, ok, text in (("pip", False, a), ("uv", True, b))
    ):
        e = attempt(1000 + j, tool, ok, T0 + 7 * DAY + j * 60, recorded)
        e["task"]["description"] = text
        out.append(e)
    return out


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
@pytest.mark.parametrize("recorded", ["strategy", "actions"])
async def test_a_barely_related_success_is_never_lifted(make_client, settings, redis, mode, recorded):  # noqa: F811
    api = await make_client(recall_mode=mode)
    await publish(settings, redis, away_history(recorded), namespace="default")
    await drain(make_worker(settings, redis))
    recalled = await (await api.post("/v1/recall", json={"query": TASK, "top_k": 14, "mode": mode})).json()
    context = await (await api.post("/v1/context", json={"task": TASK, "top_k": 5})).json()
    choice = await (await api.post("/v1/strategy", json={"task": TASK})).json()
    assert (choice["strategy"], choice["rule"]) == ("pip", "reuse") and "changed" not in choice["evidence"], (
        choice
    )
    assert all("regime" not in r["components"] for r in recalled["results"]), recalled["results"]
    assert tool_of(recalled["results"][0]) == "pip" and tool_of(context["results"][0]) == "pip"
    proven = [s["strategy"] for s in context["replay_context"]["strategies"] if s["success_rate"]]
    assert proven[0] == "pip", context["replay_context"]


@pytest.mark.parametrize("top_k", [1, 2, 3, 5, 8])
async def test_replay_context_reads_the_pools_roles_whatever_top_k(make_client, settings, redis, top_k):  # noqa: F811
    """The old successes the pool shows superseded are earlier episodes of their strategy even when
    `top_k` cuts the failures that tell so: no entry says `pip` works."""
    api = await make_client()
    await publish(settings, redis, history(CASES["pip-uv-8-4-6"], "strategy"), namespace="default")
    await drain(make_worker(settings, redis))
    for weights in (None, {"similarity": 1.0}):
        body = {"query": TASK, "top_k": top_k, **({"weights": weights} if weights else {})}
        answer = await (await api.post("/v1/recall", json=body)).json()
        replay, results = answer["replay_context"], answer["results"]
        pip = [s for s in replay["strategies"] if s["strategy"] == "pip"]
        assert not pip or (pip[0]["success_rate"] or 0.0) < 0.5, replay
        if any(kind(r, "pip") == "stale" for r in results):
            assert pip[0]["changed_at"] is not None and pip[0]["earlier_success_rate"] == 1.0, replay
