"""Arguments no HTTP request can carry are refused by the client as InvalidEpisode naming the argument,
before anything is sent (no server is needed: the address below is never reached)."""

from __future__ import annotations

import inspect

import pytest

from engram_episodic import AsyncEngram, Engram, InvalidEpisode
from engram_episodic.calls import MAX_WAIT, Calls, _wait
from engram_episodic.types import FactPage, IngestResult, Suggestion

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


LONE = "\udcff"  # what a command line's invalid UTF-8 byte 0xFF becomes (surrogateescape)
TEXT_CALLS = [
    # (method, positional arguments, keyword arguments, the field named, the surrogate's position in it)
    ("recall", ("a" + LONE,), {}, "query", 1),
    ("recall", ("q",), {"agent_id": "ag" + LONE}, "agent_id", 2),
    ("recall", ("q",), {"category": ["ok", LONE + "x"]}, "category[1]", 0),
    ("context", (LONE,), {}, "task", 0),
    ("context", ("t",), {"category": "c" + LONE}, "category", 1),
    ("strategy", ("t" + LONE,), {}, "task", 1),
    ("suggest", ("t",), {"session_id": "s" + LONE}, "session_id", 1),
    ("search_facts", ("deploy " + LONE,), {}, "query", 7),
    ("search_facts", (), {"kind": ["k" + LONE]}, "kind[0]", 1),
    ("skills", (), {"user_id": LONE}, "user_id", 0),
    ("learning_curve", (), {"category": "c" + LONE}, "category", 1),
    ("list_episodes", (), {"agent_id": "a" + LONE}, "agent_id", 1),
    ("list_episodes", (), {"cursor": LONE}, "cursor", 0),
    ("list_facts", (), {"episode_id": "e" + LONE}, "episode_id", 1),
    ("consolidate", (), {"agent_id": "a" + LONE}, "agent_id", 1),
    ("forget_episodes", (["e1", "e" + LONE],), {}, "episode_ids[1]", 1),
    ("redrive_dead_letters", ([LONE],), {}, "ids[0]", 0),
    ("discard_dead_letters", (["1-0" + LONE],), {}, "ids[0]", 3),
]


def lone_at(at: int) -> str:
    return f"must be valid Unicode text (a lone surrogate at character {at})"


@pytest.mark.parametrize(("method", "args", "kwargs", "field", "at"), TEXT_CALLS)
def test_a_lone_surrogate_in_any_text_names_its_field(method, args, kwargs, field, at) -> None:
    """A string with no UTF-8 form, in a body or a query parameter, is refused naming the parameter or
    the body path (as the service and `record` do), before anything is sent."""
    with Engram(NOWHERE, max_retries=0) as memory, pytest.raises(InvalidEpisode) as refused:
        getattr(memory, method)(*args, **kwargs)
    assert refused.value.errors == [(field, lone_at(at))]


@pytest.mark.parametrize(("method", "args", "kwargs", "field", "at"), TEXT_CALLS)
async def test_the_async_client_names_the_same_fields(method, args, kwargs, field, at) -> None:
    async with AsyncEngram(NOWHERE, max_retries=0) as memory:
        with pytest.raises(InvalidEpisode) as refused:
            await getattr(memory, method)(*args, **kwargs)
        assert refused.value.errors == [(field, lone_at(at))]


async def test_every_field_with_a_lone_surrogate_is_named_in_one_error() -> None:
    reason = lone_at(0)
    with Engram(NOWHERE, max_retries=0) as memory, pytest.raises(InvalidEpisode) as refused:
        memory.recall(LONE, agent_id=LONE, weights={"recency": 1.0}, category=[LONE])
    assert refused.value.errors == [("query", reason), ("agent_id", reason), ("category[0]", reason)]
    with Engram(NOWHERE, max_retries=0) as memory, pytest.raises(InvalidEpisode) as refused:
        memory.recall("q", weights={"recency" + LONE: 1.0})
    assert refused.value.errors == [("weights", "has a key that is not valid Unicode text")]
    with Engram(NOWHERE, max_retries=0) as memory, pytest.raises(InvalidEpisode) as refused:
        list(memory.iter_episodes(session_id=LONE))
    assert refused.value.errors == [("session_id", reason)]
    async with AsyncEngram(NOWHERE, max_retries=0) as memory:
        with pytest.raises(InvalidEpisode) as refused:
            [e async for e in memory.iter_episodes(outcome=LONE)]
        assert refused.value.errors == [("outcome", reason)]


WAITING_CALLS = [
    ("record", lambda m, wait: m.record(task="t", outcome="success", wait=wait)),
    ("publish", lambda m, wait: m.publish([{"task": "t", "outcome": "success"}], wait=wait)),
    ("update_episode", lambda m, wait: m.update_episode("e1", importance=3, wait=wait)),
    ("forget_episode", lambda m, wait: m.forget_episode("e1", wait=wait)),
    ("forget_user", lambda m, wait: m.forget_user("u1", wait=wait)),
]


@pytest.mark.parametrize(
    ("wait", "shown"),
    [
        (60, "the number 60"),
        (30.001, "the number 30.001"),
        (-1, "the number -1"),
        (float("nan"), "the number nan"),
        (True, "a boolean"),
        ("5", "a string"),
    ],
)
@pytest.mark.parametrize(("name", "call"), WAITING_CALLS)
def test_a_wait_the_service_would_refuse_is_refused_before_sending(name, call, wait, shown) -> None:
    with Engram(NOWHERE, max_retries=0) as memory, pytest.raises(InvalidEpisode) as refused:
        call(memory, wait)
    assert refused.value.errors == [("wait", f"must be a number of seconds between 0 and 30, not {shown}")]


async def test_the_async_client_refuses_the_same_waits() -> None:
    async with AsyncEngram(NOWHERE, max_retries=0) as memory:
        for _, call in WAITING_CALLS:
            with pytest.raises(InvalidEpisode) as refused:
                await call(memory, 60)
            assert refused.value.errors[0][0] == "wait"


def test_the_client_and_the_service_bound_wait_alike() -> None:
    """One bound: what the client sends at MAX_WAIT the service takes, a hair over it both refuse."""
    from services.query.views.episodes import WaitQuery

    assert WaitQuery.model_validate({"wait": _wait(MAX_WAIT)["wait"]}).wait == MAX_WAIT
    with pytest.raises(ValueError, match="between 0 and 30"):
        WaitQuery.model_validate({"wait": repr(MAX_WAIT + 0.001)})
    with pytest.raises(InvalidEpisode):
        _wait(MAX_WAIT + 0.001)


def test_a_waiting_request_may_take_its_wait_on_top_of_the_timeout() -> None:
    """The service holds a ?wait= call up to `wait` seconds before it answers: the HTTP timeout covers it."""
    with Engram(NOWHERE, timeout=5.0) as memory:
        assert memory._request_args(Calls.forget_episode("e1", wait=MAX_WAIT))["timeout"] == 5.0 + MAX_WAIT
        assert memory._request_args(Calls.forget_episode("e1"))["timeout"] == 5.0


def test_a_route_method_shows_its_own_parameters_and_answer() -> None:
    """What help() and notebooks show for `memory.recall`: the call's parameters and the answer's type."""
    with Engram(NOWHERE) as memory:
        shown = inspect.signature(memory.recall)
        assert list(shown.parameters) == ["query", "options"] and shown.return_annotation == "Recall"
        assert str(inspect.signature(memory.update_episode)).endswith("-> 'Updated'")


def test_every_result_keeps_the_json_it_was_read_from() -> None:
    """`raw` holds what a newer service adds, on nested results too; a listing's items are its `results`."""
    answer = {"accepted": 1, "results": [{"episode_id": "e1", "event_id": "1-0", "added_later": 1}]}
    result = IngestResult.from_json(answer)
    assert result.raw is answer and result.results[0].raw["added_later"] == 1
    page = FactPage.from_json({"results": [{"fact_id": "f1", "kind": "strategy", "text": "t"}]})
    assert [f.fact_id for f in page] == ["f1"] and page.next_cursor is None


def test_a_suggestion_reads_its_counts_by_each_list_s_own_key() -> None:
    counts = {"common_failures": [{"message": "timeout", "count": 2}], "failed_action_types": None}
    shown = {"confidence": "low", "similar": 2, "successes": 0, "failures": 2, "success_share": 0.0}
    suggestion = Suggestion.from_json({**shown, **counts})
    assert suggestion.common_failures == (("timeout", 2),) and suggestion.failed_action_types == ()
