"""Recall answers what works now when what used to work stopped (real Redis, through the HTTP API).

Week 1 the agent installs a project's dependencies with one tool and succeeds; week 2 that tool fails
and another works. The week-1 successes are more numerous and at least as relevant, yet a question
about the task must lead with the tool that works now, rank the old successes below it and show the
old tool's recent failures — whether the tool is recorded as the strategy, only as the tool called,
or only in the solution's words (a failure's perhaps in its outcome details alone). A namespace where
nothing changed ranks as before.
"""

from __future__ import annotations

import random

import pytest

from tests.integration.test_consolidator import drain
from tests.integration.test_facts import make_worker, publish
from tests.integration.test_query_support import make_client  # noqa: F401  (fixture)

DAY = 86400.0
T0 = 1_750_000_000.0
TASK = "install the python dependencies of the billing service"
QUESTION = "how do I install the dependencies"
GREEK = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()
COMMANDS = {
    "pip": "pip install -r requirements.txt",
    "uv": "uv sync --frozen",
    "npm": "npm install",
    "pnpm": "pnpm install --frozen-lockfile",
}


def attempt(i: int, tool: str, ok: bool, at: float, recorded: str, rewarded: bool = False) -> dict:
    """One attempt; week-2 texts carry extra words, so week 1 is nearer to the task."""
    words = TASK if at < T0 + 3 * DAY else f"{TASK} after the lockfile update on the build host"
    data: dict = {
        "episode_id": f"dep-{i}",
        "task": {"description": words, "category": "setup"},
        "outcome": "success" if ok else "failure",
        "completed_at": at,
        "agent_id": "builder",
    }
    if rewarded:
        data["feedback"] = {"reward": 1.0 if ok else 0.0}
    if recorded == "strategy":
        data["strategy_used"] = tool
    if recorded in ("strategy", "actions"):
        data["actions"] = [
            {"action_type": tool, "success": ok, **({} if ok else {"error": "resolution failed"})}
        ]
    elif recorded == "solution" or ok:  # the solution's words alone
        data["solution"] = COMMANDS[tool]
        if not ok:
            data["outcome_details"] = "resolution failed"
    else:  # "details": a failure names the command in its outcome details only
        data["outcome_details"] = f"{COMMANDS[tool]} failed: resolution impossible"
    return data


def history(case: tuple, recorded: str) -> list[dict]:
    """`before` successes of `old`; a week later `failures` of `old` and `successes` of `new`, alternating
    (or the failures first)."""
    old, new, before, failures, successes, alternate, rewarded = case
    week2: list[tuple[str, bool]] = []
    for j in range(max(failures, successes)):
        week2 += [(old, False)] if j < failures else []
        week2 += [(new, True)] if j < successes else []
    if not alternate:
        week2.sort(key=lambda row: row[1])
    out = [attempt(i, old, True, T0 + i * 60, recorded, rewarded) for i in range(before)]
    return out + [
        attempt(1000 + j, t, ok, T0 + 7 * DAY + j * 60, recorded, rewarded) for j, (t, ok) in enumerate(week2)
    ]


def tool_of(result: dict) -> str:
    ep = result["episode"]
    if ep.get("strategy_used"):
        return ep["strategy_used"]
    if ep.get("actions"):
        return ep["actions"][0]["action_type"]
    return (ep.get("solution") or ep["outcome_details"]).split()[0]


def kind(result: dict, old: str) -> str:
    """ "now" (a success of the new tool), "evidence" (a recent failure of the old), "stale" (its old success)."""
    ep = result["episode"]
    if tool_of(result) != old:
        return "now" if ep["outcome"] == "success" else "other"
    return "stale" if int(ep["episode_id"].split("-")[1]) < 1000 else "evidence"


CASES = {  # old tool, new tool, old successes, then old failures, new successes, alternating, rewards
    "pip-uv-8-4-6": ("pip", "uv", 8, 4, 6, True, False),
    "npm-pnpm-6-3-3": ("npm", "pnpm", 6, 3, 3, True, False),
    "pip-uv-12-5-4-rewarded": ("pip", "uv", 12, 5, 4, True, True),
    "pip-uv-8-4-6-failures-first": ("pip", "uv", 8, 4, 6, False, False),
    "pip-uv-150-4-6": ("pip", "uv", 150, 4, 6, True, False),  # more old successes than a KNN list
}


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
@pytest.mark.parametrize("recorded", ["strategy", "actions", "solution", "details"])
@pytest.mark.parametrize("case", sorted(CASES))
async def test_recall_leads_with_what_works_now(make_client, settings, redis, case, recorded, mode):  # noqa: F811
    old, new, before, failures, successes = CASES[case][:5]
    api = await make_client()
    await publish(settings, redis, history(CASES[case], recorded), namespace="default")
    await drain(make_worker(settings, redis))
    n = before + failures + successes
    body = await (
        await api.post("/v1/recall", json={"query": QUESTION, "top_k": min(n, 100), "mode": mode})
    ).json()
    kinds = [kind(r, old) for r in body["results"]]
    top = kinds[:5]
    assert top[0] == "now" and "evidence" in top and "stale" not in top, kinds
    # every old success below every episode of the week that changed it
    assert kinds.index("stale") == failures + successes and set(kinds[failures + successes :]) == {"stale"}, (
        kinds
    )
    for r in body["results"]:
        assert sum(r["components"].values()) == pytest.approx(r["priority"], abs=1e-9)
        assert 0.0 <= r["priority"] <= 1.0
    context = await (await api.post("/v1/context", json={"task": QUESTION, "top_k": 5})).json()
    assert [kind(r, old) for r in context["results"]][0] == "now", context["results"]
    assert "stale" not in [kind(r, old) for r in context["results"]]


@pytest.mark.parametrize("mode", ["hybrid", "vector"])
async def test_recall_after_a_long_history(make_client, settings, redis, mode):  # noqa: F811
    """400 old successes, each task worded a little differently: more than the pool's similarity lists
    hold, yet the switch leads."""
    rng = random.Random(1)
    eps = history(("pip", "uv", 400, 4, 6, True, False), "actions")
    for e in eps:
        e["task"]["description"] += " " + " ".join(rng.sample(GREEK, 2))
    api = await make_client()
    await publish(settings, redis, eps, namespace="default")
    await drain(make_worker(settings, redis))
    body = await (await api.post("/v1/recall", json={"query": QUESTION, "top_k": 10, "mode": mode})).json()
    kinds = [kind(r, "pip") for r in body["results"]]
    assert kinds[0] == "now" and "evidence" in kinds[:5] and "stale" not in kinds, kinds


@pytest.mark.parametrize("recorded", ["strategy", "actions", "solution"])
async def test_recall_without_a_change_is_unchanged(make_client, settings, redis, recorded):  # noqa: F811
    """pip keeps working (one failure in week 2), uv works too: no episode gets a regime term."""
    api = await make_client()
    eps = [attempt(i, "pip", True, T0 + i * 60, recorded) for i in range(8)]
    week2 = [("pip", True)] * 3 + [("pip", False)] + [("uv", True)] * 3 + [("pip", True)] * 3
    eps += [attempt(1000 + j, t, ok, T0 + 7 * DAY + j * 60, recorded) for j, (t, ok) in enumerate(week2)]
    await publish(settings, redis, eps, namespace="default")
    await drain(make_worker(settings, redis))
    body = await (await api.post("/v1/recall", json={"query": QUESTION, "top_k": len(eps)})).json()
    assert all("regime" not in r["components"] for r in body["results"])
    priorities = [r["priority"] for r in body["results"]]
    assert priorities == sorted(priorities, reverse=True)
    assert tool_of(body["results"][0]) == "pip"
