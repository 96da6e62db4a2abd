"""Instants from a skewed agent clock: a bounded skew is accepted, beyond it a 422 names the field."""

from __future__ import annotations

import time

from engram_episodic.timeutil import format_instant
from tests.integration.test_query_support import episode

pytest_plugins = ["tests.integration.test_query_support"]


async def test_future_instants_beyond_the_skew_are_refused_naming_the_field(api):
    now = time.time()
    ok = await api.post("/v1/episodes", json=episode("near", completed_at=now + 60))  # within 5 minutes
    assert ok.status == 202, await ok.text()
    far = await api.post("/v1/episodes", json=episode("far", completed_at=format_instant(now + 3 * 3600)))
    assert far.status == 422
    [err] = (await far.json())["errors"]
    assert (
        err["field"] == "completed_at"
        and "in the future" in err["reason"]
        and "ENGRAM_MAX_CLOCK_SKEW" in err["reason"]
    )
    batch = {
        "episodes": [
            episode("b0", completed_at=now),
            episode(
                "b1",
                completed_at=now,
                started_at=now - 5,
                actions=[{"action_type": "run", "timestamp": now + 7200}],
            ),
        ]
    }
    resp = await api.post("/v1/episodes", json=batch)
    assert resp.status == 422
    assert [e["field"] for e in (await resp.json())["errors"]] == ["episodes[1].actions[0].timestamp"]


async def test_the_skew_is_a_setting(make_client):
    api = await make_client(max_clock_skew=4 * 3600.0)
    resp = await api.post("/v1/episodes", json=episode("far", completed_at=time.time() + 3 * 3600))
    assert resp.status == 202, await resp.text()
