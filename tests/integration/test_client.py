"""The typed HTTP client (engram_episodic.Engram / AsyncEngram) against a real query service and Redis.

The service runs in the test's loop (aiohttp test server on a real port); the consolidator is driven
in-process (`drain`). The sync client runs in a worker thread so the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from aiohttp import web

from engram_episodic import (
    AsyncEngram,
    BadRequest,
    ConnectionFailed,
    Engram,
    Episode,
    EpisodeForgotten,
    InvalidEpisode,
    InvalidRequest,
    RateLimited,
    ResourceNotFound,
    Task,
    Unauthorized,
)
from engram_episodic.events import Feedback
from engram_episodic.types import Recall, RecallHit
from shared import streams
from shared.keys import Keys
from tests.helpers import EMPTY_RECALL, wait_until
from tests.integration.test_query_e2e import drain
from tests.integration.test_query_support import KEY_A, KEY_B

pytest_plugins = ["tests.integration.test_query_support"]


def url(server) -> str:
    return str(server.make_url("")).rstrip("/")


async def test_async_client_reads_and_writes_every_route(tenants, settings, redis):
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        first = await memory.record(
            task="rotate the tls certificate of the api gateway",
            outcome="success",
            solution="certbot renew, then reload nginx",
            agent_id="ops",
            user_id="ann",
            strategy_used="iterative",
            feedback={"reward": 1.0},
            importance=6,
        )
        batch = await memory.publish(
            [
                {
                    "task": {"description": f"rotate the tls certificate of service {i}", "category": "ops"},
                    "outcome": "failure" if i == 2 else "success",
                    "agent_id": "ops",
                    "user_id": "bob",
                    "feedback": {
                        "reward": 0.0 if i == 2 else 0.9,
                        "message": "certbot rate limit" if i == 2 else None,
                    },
                    "strategy_used": "iterative",
                }
                for i in range(3)
            ]
        )
        assert batch.accepted == 3 and len({a.episode_id for a in batch.results}) == 3
        async with memory.episode("rotate the tls certificate by hand", category="ops", agent_id="ops") as ep:
            await ep.action("run", input="openssl x509 -noout -dates", output="notAfter=...", success=True)
            await ep.complete("partial", feedback={"reward": 0.5})
        await drain(settings, redis)
        stored = await memory.wait_until_recallable(first, timeout=10)
        assert stored.status == "completed" and stored.episode.solution == "certbot renew, then reload nginx"
        assert stored.episode.task == Task(description="rotate the tls certificate of the api gateway")

        recall = await memory.recall("renew the tls certificate", top_k=5, agent_id="ops")
        assert isinstance(recall, Recall) and all(isinstance(h, RecallHit) for h in recall)
        assert len(recall) == 5 and {h.episode.episode_id for h in recall} >= {first, ep.episode_id}
        assert [h.priority for h in recall] == sorted((h.priority for h in recall), reverse=True)
        hand = next(h.episode for h in recall if h.episode.episode_id == ep.episode_id)
        assert [a.action_type for a in hand.actions] == ["run"] and hand.outcome == "partial"
        assert recall.replay_context.strategies[0].strategy == "iterative"

        only_bob = await memory.recall("tls certificate", user_id="bob", outcome=["failure"])
        assert [h.episode.feedback.message for h in only_bob] == ["certbot rate limit"]

        context = await memory.context("renew the tls certificate", agent_id="ops", max_chars=2000)
        assert "tls certificate" in context.prompt and len(context.prompt) <= 2000 and context.results
        assert context.short_term and isinstance(context.short_term[0], Episode)
        choice = await memory.strategy("renew the tls certificate", agent_id="ops", min_similarity=0.0)
        assert choice.strategy == "iterative" and choice.rule == "reuse" and "iterative" in choice.reason
        suggestion = await memory.suggest("renew the tls certificate", min_similarity=0.0)
        assert suggestion.failures == 1 and suggestion.common_failures[0] == ("certbot rate limit", 1)
        skills = await memory.skills(agent_id="ops")
        assert {p.category for p in skills} == {"unknown", "ops"}
        curve = await memory.learning_curve(agent_id="ops")
        assert len(curve.results) == 5 and curve.results[-1].cumulative_reward == pytest.approx(3.3)

        run = await memory.consolidate()
        assert run.results and {r.status for r in run.results} <= {"published", "unchanged", "busy"}
        await drain(settings, redis)
        facts = await memory.search_facts("tls certificate")
        assert facts and facts[0].support >= 3 and facts[0].status == "current"
        detail = await memory.get_fact(facts[0].fact_id)
        assert detail.fact.fact_id == facts[0].fact_id and all(
            isinstance(e, Episode) for e in detail.evidence
        )

        forgot = await memory.forget_episode(first)
        assert forgot.episode_id == first and forgot.event_id
        assert (await memory.forget_user("bob")).user_id == "bob"
        await drain(settings, redis)
        with pytest.raises(ResourceNotFound) as missing:
            await memory.get_episode(first)
        assert missing.value.status == 404
        left = await memory.recall("tls certificate", top_k=10)
        assert [h.episode.episode_id for h in left] == [ep.episode_id]

    async with AsyncEngram(url(tenants), api_key=KEY_B) as other:  # tenancy is the server's
        assert len(await other.recall("tls certificate", top_k=10)) == 0
        with pytest.raises(ResourceNotFound):
            await other.get_episode(ep.episode_id)


async def test_sync_client_and_typed_errors(tenants, settings, redis):
    keys = Keys(settings.prefix)

    def scenario() -> dict:
        out: dict = {}
        with Engram(url(tenants), api_key=KEY_A) as memory:
            out["id"] = memory.record({"task": "bump the api version", "outcome": "success", "agent_id": "a"})
            with pytest.raises(RuntimeError), memory.episode("migrate the orders table", agent_id="a") as ep:
                ep.action("sql", input="ALTER TABLE orders ...", success=False, error="lock timeout")
                out["failed"] = ep.episode_id
                raise RuntimeError("deadlock detected")  # recorded as a failure with the error, re-raised
            with pytest.raises(BadRequest) as bad:
                memory.recall("x", top_k=0)
            out["bad"] = bad.value
            with pytest.raises(InvalidEpisode) as invalid:  # refused here: nothing is sent
                memory.record(task="t", outcome="maybe", feedback={"reward": float("nan")})
            out["invalid"] = invalid.value
        with Engram(url(tenants)) as anonymous, pytest.raises(Unauthorized) as denied:
            anonymous.recall("anything")
        out["denied"] = denied.value
        return out

    before = await redis.xlen(keys.stream)
    out = await asyncio.to_thread(scenario)
    assert await redis.xlen(keys.stream) == before + 2, "two episodes published; the invalid one never left"
    assert out["bad"].status == 422 and ("top_k", "must be an integer between 1 and 100") in out["bad"].errors
    assert {f for f, _ in out["invalid"].errors} == {"outcome", "feedback.reward"}
    assert out["denied"].status == 401 and "API key" in out["denied"].detail
    await drain(settings, redis)

    def read() -> tuple:
        with Engram(url(tenants), api_key=KEY_A) as memory:
            return memory.get_episode(out["failed"]), memory.recall("migrate the orders table", top_k=1)

    failed, recall = await asyncio.to_thread(read)
    assert failed.episode.outcome == "failure" and failed.episode.actions[0].error == "lock timeout"
    assert failed.episode.outcome_details == "RuntimeError: deadlock detected"
    assert recall.results[0].episode.episode_id == out["failed"]


async def test_an_episode_built_once_goes_over_http_or_the_stream(tenants, settings, redis):
    """The same Episode object is published by the HTTP client and read back equal, field by field."""
    built = Episode(
        episode_id="both-ways",
        agent_id="a",
        task=Task(description="index the audit log", category="ops"),
        solution="a partial index on created_at",
        outcome="success",
        importance=4.0,
        feedback=Feedback(reward=0.75, tests_passed=3, tests_total=4),
        started_at=1_700_000_000.0,
        completed_at=1_700_000_090.5,
    )
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        assert await memory.record(built) == "both-ways"
        await drain(settings, redis)
        back = (await memory.wait_until_recallable("both-ways", timeout=10)).episode
    assert back == built
    stored = [e for e in await streams.read_range(redis, Keys(settings.prefix).stream)]
    assert len(stored) == 1


# --- retries -----------------------------------------------------------------------------------------
@pytest.fixture
async def flaky(aiohttp_server):
    """A stand-in service: answers each route from a script of statuses; counts requests. A "hang"
    holds its answer until the test ends (the client's read timeout is what ends the attempt)."""
    state = {"count": 0, "script": []}
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        state["count"] += 1
        step = state["script"].pop(0) if state["script"] else 200
        if step == "hang":
            await release.wait()
        if step in (429, 503):
            return web.json_response(
                {"title": "busy", "detail": "retry later", "status": step},
                status=step,
                headers={"Retry-After": "0"},
                content_type="application/problem+json",
            )
        return web.json_response(EMPTY_RECALL)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = await aiohttp_server(app)
    yield server, state
    release.set()


async def test_retries_429_and_503_after_retry_after_then_gives_up(flaky):
    server, state = flaky
    async with AsyncEngram(url(server), max_retries=3) as memory:
        state["script"] = [429, 503]
        assert (await memory.recall("x")).mode == "hybrid"
        assert state["count"] == 3
        state["count"], state["script"] = 0, [429] * 10
        with pytest.raises(RateLimited) as limited:
            await memory.recall("x")
        assert state["count"] == 4 and limited.value.retry_after == 0.0


async def test_a_lost_answer_is_retried_only_when_repeating_is_harmless(flaky):
    server, state = flaky
    async with AsyncEngram(url(server), timeout=0.3, max_retries=2, max_retry_wait=0.01) as memory:
        state["script"] = ["hang"]
        assert (await memory.recall("x")).results == ()  # a read: repeated after the read timeout
        assert state["count"] == 2
        state["count"], state["script"] = 0, ["hang"]
        with pytest.raises(ConnectionFailed) as lost:
            await memory.recall("x", touch=True)  # counts accesses: a repeat would count twice
        assert lost.value.maybe_applied and state["count"] == 1


async def test_an_unreachable_service_is_a_connection_error_that_was_never_applied(unused_tcp_port):
    async with AsyncEngram(
        f"http://127.0.0.1:{unused_tcp_port}", max_retries=1, max_retry_wait=0.01
    ) as memory:
        with pytest.raises(ConnectionFailed) as down:
            await memory.record(task="t", outcome="success")
    assert not down.value.maybe_applied and "cannot reach" in str(down.value)


def test_from_env_reads_only_the_documented_variables():
    memory = Engram.from_env({"ENGRAM_PORT": "9123", "ENGRAM_API_KEY": "k"})
    assert memory.base_url == "http://127.0.0.1:9123" and memory._headers["Authorization"] == "Bearer k"
    assert Engram.from_env({"ENGRAM_URL": "https://mem.example/"}).base_url == "https://mem.example"
    with pytest.raises(ValueError, match="base_url"):
        Engram("localhost:8080")
    assert dataclasses.is_dataclass(Recall)


async def test_any_call_can_answer_the_raw_json(flaky):
    from engram_episodic.client import Calls

    server, _ = flaky
    async with AsyncEngram(url(server)) as memory:
        raw = await memory.call(Calls.recall("x", top_k=2).as_json())
    assert raw == EMPTY_RECALL


async def test_aware_datetimes_go_wherever_an_instant_does(tenants, settings, redis):
    from datetime import UTC, datetime, timedelta, timezone

    done = datetime(2026, 11, 30, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        eid = await memory.record(
            task="tz", outcome="success", started_at=done - timedelta(minutes=5), completed_at=done
        )
        async with memory.episode("tz block", started_at=datetime(2026, 11, 30, 9, 0, tzinfo=UTC)) as ep:
            await ep.action("run", timestamp=datetime(2026, 11, 30, 9, 1, tzinfo=UTC))
            await ep.complete("success", completed_at=datetime(2026, 11, 30, 9, 2, tzinfo=UTC))
        with pytest.raises(InvalidEpisode) as naive:
            await memory.record(task="tz", outcome="success", completed_at=datetime(2026, 11, 30, 12, 0))
        assert naive.value.errors[0][0] == "completed_at" and "UTC offset" in naive.value.errors[0][1]
        with pytest.raises(InvalidRequest) as nan:  # an InvalidEpisode too (what it raised before)
            await memory.recall("x", reward={"gte": float("nan")})
        assert nan.value.errors[0][0] == "reward.gte" and isinstance(nan.value, InvalidEpisode)
        with pytest.raises(InvalidEpisode):
            await ep.action("late")  # after complete(): it would be dropped
        await drain(settings, redis)
        stored = (await memory.wait_until_recallable(eid, timeout=10)).episode
        block = (await memory.wait_until_recallable(ep.episode_id, timeout=10)).episode
    assert stored.completed_at == done.timestamp() and stored.duration_s == 300
    assert block.actions[0].timestamp == datetime(2026, 11, 30, 9, 1, tzinfo=UTC).timestamp()


def test_an_api_key_the_service_could_never_accept_is_refused_at_construction():
    for bad in ("key ", " key", "ke\ny", "kéy"):
        with pytest.raises(ValueError, match="api_key"):
            Engram(api_key=bad)


async def test_a_completion_whose_answer_was_lost_is_not_rewritten_as_a_failure(flaky):
    """A success sent, its answer lost: the block's exit used to publish a `failure` over it."""
    server, state = flaky
    state["script"] = ["hang", "hang"]
    async with AsyncEngram(url(server), timeout=0.3, max_retries=1, max_retry_wait=0.01) as memory:
        with pytest.raises(ConnectionFailed) as lost:
            async with memory.episode("deploy", agent_id="a") as ep:
                await ep.complete("success", feedback={"reward": 1.0})
    assert lost.value.maybe_applied and lost.value.episode_ids == (ep.episode_id,)
    assert state["count"] == 2, "two attempts of the completion, and no failure published after them"


async def test_the_final_error_says_an_earlier_attempt_may_have_been_applied(flaky):
    server, state = flaky
    state["script"] = ["hang", 429, 429]
    async with AsyncEngram(url(server), timeout=0.3, max_retries=2, max_retry_wait=0.01) as memory:
        with pytest.raises(RateLimited) as limited:
            await memory.record(task="t", outcome="success", episode_id="fixed-id")
    assert limited.value.maybe_applied and limited.value.episode_ids == ("fixed-id",)


@pytest.mark.parametrize("odd_id", [".", "..", "a/b", "%2E", "x?y#z"])
async def test_ids_that_are_dot_segments_or_url_syntax_reach_their_route(tenants, settings, redis, odd_id):
    """`.` and `..` are valid ids but URL dot segments: normalisation turned `/v1/users/..` into `/v1`
    (a 404 on a forget that never answers 404). Both must reach the service as ids."""
    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        await memory.record(
            task="an episode with an odd id", outcome="success", episode_id=odd_id, user_id=odd_id
        )
        await drain(settings, redis)
        stored = await memory.get_episode(odd_id)
        assert stored.episode.episode_id == odd_id and stored.episode.user_id == odd_id
        assert (await memory.forget_user(odd_id)).user_id == odd_id
        await drain(settings, redis)
        with pytest.raises(ResourceNotFound):
            await memory.get_episode(odd_id)
        assert (await memory.forget_episode(odd_id)).episode_id == odd_id  # already forgotten, not a 404


async def test_an_episode_with_more_actions_than_one_request_takes_is_published_again(
    tenants, settings, redis
):
    """One episode posted twice with 600 distinct actions each is stored with 1,200; it could not
    be published again (`engram import`, `publish(get_episode(...))`: 'must hold at most 1000 actions').
    `publish` sends it in parts the fold unions; the copy in another namespace has every action."""
    from tests.integration.test_query_e2e import consolidating

    def acts(lo: int, hi: int) -> list[dict]:
        return [
            {"action_type": "step", "action_id": f"a{i:04d}", "timestamp": 1_700_000_000 + i}
            for i in range(lo, hi)
        ]

    base = {
        "episode_id": "long-1",
        "task": "a long refactor",
        "outcome": "success",
        "completed_at": 1_700_010_000,
    }
    async with consolidating(settings, redis):
        async with (
            AsyncEngram(url(tenants), api_key=KEY_A) as a,
            AsyncEngram(url(tenants), api_key=KEY_B) as b,
        ):
            await a.publish([{**base, "actions": acts(0, 600)}], wait=10)
            await a.publish([{**base, "actions": acts(600, 1200)}], wait=10)
            stored = (await a.get_episode("long-1")).episode
            assert len(stored.actions) == 1200
            result = await b.publish(
                [stored, {**base, "episode_id": "short-1", "actions": acts(0, 3)}], wait=10
            )
            assert result.accepted == 2 and result.projected is True
            assert [x.episode_id for x in result.results] == ["long-1", "short-1"]
            copy = (await b.get_episode("long-1")).episode
            assert copy.actions == stored.actions
            assert len((await b.get_episode("short-1")).episode.actions) == 3
        with Engram(url(tenants), api_key=KEY_B) as sync:  # the same in the sync client, again: no change
            again = await asyncio.to_thread(sync.publish, [stored], wait=10)
            assert again.projected is True
        async with AsyncEngram(url(tenants), api_key=KEY_B) as b:
            assert (await b.get_episode("long-1")).episode == copy


async def test_an_http_episode_block_keeps_every_action(tenants, settings, redis):
    """`with memory.episode(...)` over HTTP publishes all of its 1,500 actions, not the last 1,000: the
    completion carries all of them, in parts when they exceed one request (here 64 KiB)."""
    from tests.integration.test_query_e2e import consolidating

    inputs = [f"edit {i} " + "x" * 60 for i in range(1_500)]
    async with consolidating(settings, redis):
        async with AsyncEngram(url(tenants), api_key=KEY_A, max_body_bytes=64 * 1024) as memory:
            async with memory.episode("a long refactoring session") as ep:
                for text in inputs:
                    await ep.action("edit", input=text)
                await ep.complete("success")
            # recallable once the first part is folded; whole once the last is (parts are not atomic)
            back = await wait_until(lambda: _whole(memory, ep.episode_id, len(inputs)), timeout=20)
        assert [a.input for a in back.actions] == inputs

        def sync() -> str:
            with Engram(url(tenants), api_key=KEY_A) as m:
                with m.episode("another long session") as block:
                    for text in inputs[:1_200]:
                        block.action("edit", input=text)
                return block.episode_id

        episode_id = await asyncio.to_thread(sync)  # left without complete(): abandoned, every action
        async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
            back = await wait_until(lambda: _whole(memory, episode_id, 1_200), timeout=20)
        assert [a.input for a in back.actions] == inputs[:1_200] and back.outcome == "abandoned"


async def _whole(memory, episode_id: str, actions: int):
    """The stored episode once it holds `actions` actions, else None."""
    try:
        found = (await memory.get_episode(episode_id)).episode
    except ResourceNotFound:
        return None
    return found if found is not None and len(found.actions) == actions else None


async def test_record_splits_like_publish_and_both_take_the_services_limit(make_client, settings, redis):
    """`record` of 1,500 actions sends them in parts, as `publish` does, instead of one 6 MB body the
    service refuses with a bare 413. A client whose
    `max_body_bytes` is above the service's takes the limit the 413 names and sends again."""
    from tests.integration.test_query_e2e import consolidating

    limit = 64 * 1024
    small = await make_client(max_body_bytes=limit)
    acts = [{"action_type": "edit", "input": f"step {i} " + "y" * 40} for i in range(1_500)]
    async with consolidating(settings, redis):
        async with AsyncEngram(url(small)) as memory:  # default 4 MiB: above the service's 64 KiB
            eid = await memory.record(task="a long session", outcome="success", actions=acts, wait=10)
            assert memory.max_body_bytes == limit
            many = [
                {"episode_id": f"big-{i}", "task": "t", "outcome": "success", "solution": "\u4e2d" * 10_000}
                for i in range(12)  # 30 KB each: 360 KB in all
            ]
            async with AsyncEngram(url(small)) as fresh:
                result = await fresh.publish(many, wait=10)
            assert result.accepted == 12 and result.projected is True
            got = await wait_until(lambda: _whole(memory, eid, len(acts)), timeout=20)
            assert [a.input for a in got.actions] == [a["input"] for a in acts]

        def sync() -> int:
            with Engram(url(small)) as m:
                text = "\u4e2d" * 15_000  # 45 KB: two of them go in two parts
                m.record(task="t", outcome="success", solution=text, thoughts=text, wait=10)
                return m.max_body_bytes

        assert await asyncio.to_thread(sync) == limit


async def test_an_episode_forget_can_wait_until_it_is_erased_from_every_read(tenants, settings, redis):
    """Without `wait`, a forgotten episode showed in 2-9 of 40 reads made right after the 202 (the
    consolidator erases it a few ms later). With `wait` the answer comes once it has (it acks after
    the erase)."""
    from tests.integration.test_query_cli import run
    from tests.integration.test_reliability import running_worker

    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        early = await memory.record(task="prune the old snapshots", outcome="success")
        await drain(settings, redis)
        late = await memory.forget_episode(early, wait=0.3)  # no consolidator running: not in time
        assert late.forgotten is False and late.event_id
        async with running_worker(settings, "episode-forgetter"):
            kept = await memory.record(task="prune the stale branches", outcome="success", wait=10)
            assert (await memory.forget_episode(kept, wait=10)).forgotten is True
            with pytest.raises(ResourceNotFound):  # at once, no polling: erased before the answer
                await memory.get_episode(kept)
            assert not [
                h for h in await memory.recall("prune the stale branches", top_k=10) if h.episode_id == kept
            ]
            again = await memory.forget_episode(kept, wait=5)  # forgotten before: nothing to wait for
            assert again.already_forgotten and again.forgotten is True and again.event_id is None
            other = await memory.record(task="prune the dangling tags", outcome="success", wait=10)
            out = await run(tenants, "forget", "--episode", other, "--wait", "10", key=KEY_A)
            again_out = await run(tenants, "forget", "--episode", other, "--wait", "10", key=KEY_A)
        assert out.exit_code == 0 and f"forgot episode {other}" in out.output, out.output
        assert "erased from every read" in out.output
        assert again_out.exit_code == 0 and f"episode {other} was already forgotten" in again_out.output
        assert "event None" not in again_out.output, again_out.output
        # recording a forgotten id publishes nothing: said as such, with or without wait (not the id
        # back as if stored without wait, nor a WaitTimeout with it)
        for wait in (None, 5):
            with pytest.raises(EpisodeForgotten) as refused:
                await memory.record(task="prune again", outcome="success", episode_id=kept, wait=wait)
            assert refused.value.episode_ids == (kept,) and "forgotten before" in str(refused.value)
        for extra in ([], ["--wait", "5"]):
            out = await run(
                tenants,
                "record",
                "prune again",
                "--outcome",
                "success",
                "--episode-id",
                kept,
                *extra,
                key=KEY_A,
            )
            assert out.exit_code == 1 and "forgotten before" in out.output, (extra, out.output)
        assert (await memory.forget_episode(early)).forgotten is None  # without wait: not said


async def test_a_user_forget_can_wait_until_it_is_erased_from_every_read(tenants, settings, redis):
    """A user's forget says when it has applied: without a job or `wait`, a read 25 ms after the 202
    still returned the episode. With `wait` the answer comes once the consolidator has
    erased them (it acks the event after the erase)."""
    from tests.integration.test_query_cli import run
    from tests.integration.test_reliability import running_worker

    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        ids = [
            await memory.record(task=f"renew the lease {i}", outcome="success", user_id="wu")
            for i in range(3)
        ]
        await drain(settings, redis)
        late = await memory.forget_user("wu", wait=0.3)  # no consolidator running: not in time
        assert late.forgotten is False and late.event_id
        async with running_worker(settings, "forgetter"):
            kept = await memory.record(task="renew the lease 9", outcome="success", user_id="wv", wait=10)
            assert (await memory.forget_user("wv", wait=10)).forgotten is True
            with pytest.raises(ResourceNotFound):  # at once, no polling: erased before the answer
                await memory.get_episode(kept)
            for episode_id in ids:  # the first forget was applied meanwhile too
                with pytest.raises(ResourceNotFound):
                    await memory.get_episode(episode_id)
            assert not await memory.recall("renew the lease", top_k=10)
            out = await run(tenants, "forget", "--user", "wu", "--wait", "10", key=KEY_A)
        assert (
            out.exit_code == 0 and "forgot user wu" in out.output and "erased from every read" in out.output
        )
        assert (await memory.forget_user("wu")).forgotten is None  # without wait: not said


async def test_summary_dead_letters_and_the_facts_of_an_episode(tenants, settings, redis):
    """The console's routes from both clients: the namespace's summary, its dead letters listed,
    re-driven and discarded, and the facts one episode is evidence for."""
    from tests.integration.test_dead_letters_http import dead_lettered

    async with AsyncEngram(url(tenants), api_key=KEY_A) as memory:
        batch = await memory.publish(
            [
                {
                    "task": {"description": f"rotate the tls certificate of service {i}", "category": "ops"},
                    "outcome": "success",
                    "agent_id": "ops",
                    "user_id": "ann",
                    "ttl": "1d" if i == 0 else None,
                }
                for i in range(4)
            ]
        )
        await drain(settings, redis)
        await memory.consolidate()
        await drain(settings, redis)
        summary = await memory.summary()
        assert (summary.episodes, summary.agents, summary.users, summary.sessions) == (4, 1, 1, 0)
        assert summary.facts >= 1 and [e.episode_id for e in summary.expiring] == [
            batch.results[0].episode_id
        ]
        first = batch.results[0].episode_id
        mine = await memory.list_facts(episode_id=first)
        assert len(mine) >= 1 and all(first in f.evidence for f in mine)
        assert len(await memory.list_facts(episode_id="never-recorded")) == 0

        await dead_lettered(settings, redis, "ns-a", "bad-1")
        await dead_lettered(settings, redis, "ns-a", "bad-2")
        dead = await memory.dead_letters(limit=10)
        assert dead.total == 2 and [d.episode_id for d in dead] == ["bad-1", "bad-2"]
        assert isinstance(dead.dead_letters[0].at, float) and "vector" in dead.dead_letters[0].reason
        redriven = await memory.redrive_dead_letters([dead.dead_letters[0].id, "0-1"])
        assert (redriven.done, redriven.unknown) == (1, ("0-1",))
        with pytest.raises(ResourceNotFound):
            await memory.discard_dead_letters(["0-1"])

    def sync() -> tuple:
        with Engram(url(tenants), api_key=KEY_A) as memory:
            left = memory.dead_letters()
            gone = memory.discard_dead_letters([d.id for d in left])
            return memory.summary(), left, gone, memory.dead_letters(), memory.list_facts(episode_id=first)

    summary_again, left, gone, after, facts = await asyncio.to_thread(sync)
    assert summary_again.episodes == 4 and len(facts) == len(mine)
    assert left.total == 1 and gone.done == 1 and after.total == 0
