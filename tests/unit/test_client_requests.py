"""Arguments no HTTP request can carry are refused by the client as InvalidEpisode naming the argument,
before anything is sent (no server is needed: the address below is never reached)."""

from __future__ import annotations

import pytest

from engram_episodic import AsyncEngram, Engram, InvalidEpisode

NOWHERE = "http://127.0.0.1:9"  # the discard port: a request that got this far would fail differently
ID_METHODS = [
    ("get_episode", "episode_id"),
    ("forget_episode", "episode_id"),
    ("forget_user", "user_id"),
    ("forget_agent", "agent_id"),
    ("forget_session", "session_id"),
    ("forget_job", "job_id"),
    ("get_fact", "fact_id"),
]


@pytest.mark.parametrize(("method", "field"), ID_METHODS)
def test_a_lone_surrogate_in_an_id_names_the_argument(method: str, field: str) -> None:
    with Engram(NOWHERE, max_retries=0) as memory, pytest.raises(InvalidEpisode) as refused:
        getattr(memory, method)("ok\ud800")
    assert refused.value.errors == [(field, "must be valid Unicode text (a lone surrogate at character 2)")]


@pytest.mark.parametrize(("method", "field"), ID_METHODS)
async def test_the_async_client_refuses_the_same_ids(method: str, field: str) -> None:
    async with AsyncEngram(NOWHERE, max_retries=0) as memory:
        with pytest.raises(InvalidEpisode) as refused:
            await getattr(memory, method)("\udfff")
        assert refused.value.errors[0][0] == field
        with pytest.raises(InvalidEpisode) as too_long:
            await getattr(memory, method)("x" * 70_000)
        assert too_long.value.errors[0][0] == "request" and "URL too long" in str(too_long.value)
