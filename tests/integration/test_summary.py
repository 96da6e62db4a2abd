"""`GET /v1/summary`: the namespace's counts from the index (episodes, distinct agents, users, sessions,
facts) and the episodes expiring soonest, of the caller's namespace only."""

from __future__ import annotations

import time

from tests.helpers import wait_until
from tests.integration.test_query_support import KEY_A, KEY_B, auth, episode, fully_indexed, put_all

pytest_plugins = ["tests.integration.test_query_support"]


async def test_the_summary_counts_the_namespace_and_lists_what_expires_first(tenants, settings, redis):
    now = time.time()
    items = [
        episode("e1", agent_id="a1", user_id="u1", session_id="s1"),
        episode("e2", agent_id="a1", user_id="u2", session_id="s1", expires_at=now + 7200),
        episode("e3", agent_id="a2", expires_at=now + 3600),
        episode("e4"),  # no agent, user or session: counted as an episode only
        episode("gone", agent_id="a3", expires_at=now - 5),  # expired: hidden from every read
    ]
    await put_all(redis, settings.prefix, "ns-a", items)
    await put_all(redis, settings.prefix, "ns-b", [episode("b1", agent_id="b", user_id="ub")])
    await wait_until(lambda: fully_indexed(redis, settings.prefix), message="indexed")
    got = await (await tenants.get("/v1/summary", headers=auth(KEY_A))).json()
    assert {k: got[k] for k in ("episodes", "agents", "users", "sessions", "facts")} == {
        "episodes": 4,
        "agents": 2,
        "users": 2,
        "sessions": 1,
        "facts": 0,
    }
    assert [e["episode_id"] for e in got["expiring"]] == ["e3", "e2"]
    assert got["expiring"][0]["expires_at"].endswith("Z")
    other = await (await tenants.get("/v1/summary", headers=auth(KEY_B))).json()
    assert (other["episodes"], other["agents"], other["users"], other["expiring"]) == (1, 1, 1, [])
    assert (await tenants.get("/v1/summary")).status == 401
    assert (await tenants.get("/v1/summary?x=1", headers=auth(KEY_A))).status == 422
