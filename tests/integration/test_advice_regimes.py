"""Advice follows the newest regime of what the agent did (real Redis, through the HTTP API).

Week 1 the agent installs dependencies with `pip` and succeeds; week 2 `pip` fails and `uv` works.
The old episodes are the nearest to the task (their text is the task's own words), so the `k` nearest
alone are all week 1 (with 300 of them, so are the first search's 100): /v1/strategy and /v1/suggest
must still name `uv`, whether the tool is recorded as the strategy or only as the tool the agent
called (`actions[].action_type`). A run of successes with no change must not be reported as one.
"""

from __future__ import annotations

import pytest

from tests.integration.test_consolidator import drain
from tests.integration.test_facts import make_worker, publish
from tests.integration.test_query_support import make_client  # noqa: F401  (fixture)

DAY = 86400.0
T0 = 1_750_000_000.0
TASK = "install the python dependencies of the billing service"


def episode(i: int, tool: str, ok: bool, at: float, *, as_strategy: bool) -> dict:
    """One attempt; week-2 texts carry extra words, so week 1 is nearer to TASK."""
    words = TASK if at < T0 + 3 * DAY else f"{TASK} after the lockfile update on the build host"
    data = {
        "episode_id": f"dep-{i}",
        "task": {"description": words, "category": "setup"},
        "outcome": "success" if ok else "failure",
        "completed_at": at,
        "agent_id": "builder",
        "actions": [
            {"action_type": tool, "success": ok, **({} if ok else {"error": f"{tool}: resolution failed"})}
        ],
    }
    if as_strategy:
        data["strategy_used"] = tool
    return data


def weeks(old: list[tuple[str, bool]], new: list[tuple[str, bool]], *, as_strategy: bool) -> list[dict]:
    out = [episode(i, t, ok, T0 + i * 60, as_strategy=as_strategy) for i, (t, ok) in enumerate(old)]
    return out + [
        episode(10_000 + j, t, ok, T0 + 7 * DAY + j * 60, as_strategy=as_strategy)
        for j, (t, ok) in enumerate(new)
    ]


def interleaved(failures: int, successes: int) -> list[tuple[str, bool]]:
    """`failures` pip failures and `successes` uv successes, alternating while both last."""
    out: list[tuple[str, bool]] = []
    for j in range(max(failures, successes)):
        if j < failures:
            out.append(("pip", False))
        if j < successes:
            out.append(("uv", True))
    return out


SWITCHES = {
    "8-then-4-failing": ([("pip", True)] * 8, interleaved(4, 6)),
    "6-then-3-failing": ([("pip", True)] * 6, interleaved(3, 3)),
    # more alike old successes than one search of advice reads (insights.ADVICE_POOL)
    "300-then-4-failing": ([("pip", True)] * 300, interleaved(4, 5)),
}


async def advice(api) -> tuple[dict, dict]:
    choice = await (await api.post("/v1/strategy", json={"task": TASK})).json()
    tip = await (await api.post("/v1/suggest", json={"task": TASK})).json()
    return choice, tip


@pytest.mark.parametrize("as_strategy", [True, False], ids=["strategy", "actions-only"])
@pytest.mark.parametrize("switch", sorted(SWITCHES))
async def test_advice_names_the_tool_that_works_now(make_client, settings, redis, switch, as_strategy):  # noqa: F811
    api = await make_client()
    old, new = SWITCHES[switch]
    await publish(settings, redis, weeks(old, new, as_strategy=as_strategy), namespace="default")
    await drain(make_worker(settings, redis))
    choice, tip = await advice(api)
    assert (choice["strategy"], choice["rule"]) == ("uv", "reuse"), choice
    assert [c["strategy"] for c in choice["evidence"]["changed"]] == ["pip"]
    assert tip["successful_strategies"][0]["strategy"] == "uv", tip
    (changed,) = tip["changed"]
    assert (changed["strategy"], changed["earlier_successes"], changed["successes"]) == ("pip", len(old), 0)


@pytest.mark.parametrize("as_strategy", [True, False], ids=["strategy", "actions-only"])
async def test_no_change_is_not_reported(make_client, settings, redis, as_strategy):  # noqa: F811
    """pip keeps working (one failure in week 2): the advice is pip and nothing changed."""
    api = await make_client()
    new = [("pip", True)] * 5 + [("pip", False)] + [("pip", True)] * 4
    await publish(
        settings, redis, weeks([("pip", True)] * 8, new, as_strategy=as_strategy), namespace="default"
    )
    await drain(make_worker(settings, redis))
    choice, tip = await advice(api)
    assert (choice["strategy"], choice["rule"]) == ("pip", "reuse"), choice
    assert "changed" not in choice["evidence"] and tip["changed"] == []
    assert tip["successful_strategies"][0]["strategy"] == "pip" and tip["confidence"] == "high"


async def test_replay_context_names_tools_when_no_strategy_is_recorded(make_client, settings, redis):  # noqa: F811
    api = await make_client()
    old, new = SWITCHES["8-then-4-failing"]
    await publish(settings, redis, weeks(old, new, as_strategy=False), namespace="default")
    await drain(make_worker(settings, redis))
    body = await (await api.post("/v1/recall", json={"query": TASK, "top_k": 18})).json()
    by_name = {s["strategy"]: s for s in body["replay_context"]["strategies"]}
    assert set(by_name) == {"pip", "uv"} and by_name["uv"]["success_rate"] == 1.0
    assert by_name["pip"]["earlier_episodes"] == 8 and by_name["pip"]["success_rate"] == 0.0


@pytest.mark.parametrize("as_strategy", [True, False], ids=["strategy", "actions-only"])
@pytest.mark.parametrize("switch", sorted(SWITCHES))
async def test_the_fact_of_the_old_tool_is_superseded(make_client, settings, redis, switch, as_strategy):  # noqa: F811
    api = await make_client(facts_every=10_000, facts_importance_threshold=1e9)
    old, new = SWITCHES[switch]
    await publish(settings, redis, weeks(old, new, as_strategy=as_strategy), namespace="default")
    await drain(make_worker(settings, redis))
    await api.post("/v1/consolidate", json={"all_scopes": False})
    found = (await (await api.post("/v1/facts/search", json={"include_superseded": True})).json())["results"]
    (before,) = [f for f in found if f["status"] == "superseded"]
    (now,) = [f for f in found if f["status"] == "current"]
    assert sorted(before["evidence"]) == sorted(f"dep-{i}" for i in range(len(old)))
    assert now["supersedes"] == before["fact_id"] and len(now["evidence"]) == len(new)


def described(i: int, solution: str, ok: bool, at: float) -> dict:
    """An attempt recorded by its solution text alone: no strategy, no actions."""
    return {
        "episode_id": f"dep-{i}",
        "task": {"description": TASK, "category": "setup"},
        "outcome": "success" if ok else "failure",
        "completed_at": at,
        "agent_id": "builder",
        "solution": solution,
    }


async def test_advice_reads_the_tool_named_only_in_the_solution(make_client, settings, redis):  # noqa: F811
    """6 successes of `pip install`, then 4 failures of it alternating with 4 successes of `uv sync`."""
    api = await make_client()
    pip_ok, pip_broke = (
        "ran pip install -r requirements.txt",
        "tried pip install but it broke: ResolutionImpossible",
    )
    old = [described(i, pip_ok, True, T0 + i * 60) for i in range(6)]
    new = [
        described(
            10_000 + j,
            *(("ran uv sync with the lockfile", True) if j % 2 else (pip_broke, False)),
            T0 + 7 * DAY + j * 60,
        )
        for j in range(8)
    ]
    await publish(settings, redis, old + new, namespace="default")
    await drain(make_worker(settings, redis))
    choice, tip = await advice(api)
    assert (choice["strategy"], choice["rule"]) == ("uv", "reuse"), choice
    assert [c["strategy"] for c in choice["evidence"]["changed"]] == ["pip"]
    assert tip["successful_strategies"] == [{"strategy": "uv", "count": 4}], tip
    (changed,) = tip["changed"]
    assert (changed["strategy"], changed["earlier_successes"], changed["successes"]) == ("pip", 6, 0)
