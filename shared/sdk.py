"""The agent SDK: publish episodes to the Engram stream from Python (asyncio).

    async with EngramClient.connect("redis://localhost:6379/0", namespace="team-a") as client:
        async with client.episode(task="fix flaky test", category="debugging", agent_id="coder") as ep:
            await ep.action("run_tests", input="pytest -x", output="1 failed", success=False)
            await ep.complete(outcome="success", feedback={"reward": 1.0, "tests_passed": 12, "tests_total": 12})

An exception inside the block completes the episode as a `failure` with the error recorded, then
re-raises. A block left without `complete()` is recorded as `abandoned`. `await client.record({...})`
publishes an already finished episode in one event.

Connection errors are retried with backoff until `publish_timeout` seconds have passed (a retried event
keeps its `event_id`); `PublishError` when Redis did not acknowledge the events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster
from redis.backoff import EqualJitterBackoff, ExponentialBackoff

from engram_episodic.drafts import EpisodeDraft, finished_episode
from engram_episodic.errors import Backpressure, ConfigError, InvalidEpisode, PublishError
from engram_episodic.events import (
    EVENT_TYPES,
    ActionRecorded,
    Episode,
    EpisodeCompleted,
    EpisodeForgotten,
    EpisodeStarted,
    Event,
    UserForgotten,
)
from engram_episodic.validation import Collector, check_id
from shared import streams
from shared.codec import encode
from shared.keyring import KeyRing, shared_ring
from shared.keys import CLUSTER_PARTITIONS, MAX_PARTITIONS, Keys
from shared.partitions import check_partitions, recorded
from shared.redis_conn import connect
from shared.retry import TRANSIENT, Backoff

_EVENT_CLASSES = frozenset(EVENT_TYPES.values())
_CHECKED: set[tuple[int, Keys]] = set()
"""(id of a Redis client, keys) whose given number of partitions this process checked against the
deployment's record (the query service makes a publisher per request)."""


class EngramClient:
    """Publishes events for one namespace. Shapes: events are `engram_episodic.events` dataclasses.

    `publish_timeout` (seconds) bounds how long a publish may hold the agent; `retries` bounds the
    attempts within it. Use `EngramClient.connect(url, ...)` or pass an existing redis client.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        namespace: str = "default",
        prefix: str = "engram:",
        publish_timeout: float = 5.0,
        retries: int = 100,
        owns_redis: bool = False,
        max_lag: int | None = None,
        wait_on_backpressure: bool = True,
        consumer_group: str = "consolidator",
        master_key: bytes | None = None,
        partitions: int | None = None,
    ):
        errs = Collector()
        check_id(namespace, "namespace", errs, required=True)
        if partitions is not None and not (isinstance(partitions, int) and 1 <= partitions <= MAX_PARTITIONS):
            errs.add("partitions", f"must be an integer from 1 to {MAX_PARTITIONS}")
        errs.raise_if_any()
        self.redis = redis
        self.namespace = namespace
        self._partitions = partitions  # else read at the first publish (`_resolve_partitions`)
        self.keys = Keys(prefix, partitions or 1)
        self._master_key = master_key
        self._resolved = False
        self.publish_timeout = publish_timeout
        self.retries = retries
        self._owns_redis = owns_redis
        self.max_lag = max_lag
        self.wait_on_backpressure = wait_on_backpressure
        self.consumer_group = consumer_group
        self._ring: KeyRing | None = None  # with a master key, after `_resolve_partitions`
        self._lag_checked_at = -1e9
        self._lag = 0

    @classmethod
    def connect(cls, url: str, **kwargs: Any) -> EngramClient:
        """A client owning its own connection pool to `url` (closed by `close()`)."""
        # redis-py's own retries are off: this class owns the retry budget and the deadline.
        return cls(
            connect(
                url,
                retries=0,
                socket_timeout=kwargs.get("publish_timeout", 5.0),
                prefix=kwargs.get("prefix", "engram:"),
            ),
            owns_redis=True,
            **kwargs,
        )

    async def close(self) -> None:
        if self._owns_redis:
            # aclose is redis >= 5; the stale types-redis 4.6 stubs, where installed, lack it
            await self.redis.aclose()  # type: ignore[attr-defined, unused-ignore]

    async def __aenter__(self) -> EngramClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # --- publishing -----------------------------------------------------------------------------
    async def _check_backpressure(self, deadline: float) -> None:
        """With `max_lag` set, wait (or raise Backpressure) while the group lags more than that.

        The lag is read at most every 0.25 s (XINFO GROUPS), so checking costs little per publish.
        """
        if self.max_lag is None:
            return
        backoff = Backoff(ExponentialBackoff(cap=2.0, base=0.05))  # 0.1, 0.2, ... 2 s
        delay = backoff.next()
        while True:
            now = time.monotonic()
            if now - self._lag_checked_at > 0.25:  # the lag of this client's partition
                group = streams.StreamGroup(
                    self.redis, self.keys.stream_of(self.namespace), self.consumer_group
                )
                self._lag = await group.lag()
                self._lag_checked_at = now
            if self._lag <= self.max_lag:
                return
            if not self.wait_on_backpressure or now + delay > deadline:
                raise Backpressure(self._lag, self.max_lag, retry_after=max(1.0, delay))
            await asyncio.sleep(delay)
            self._lag_checked_at = -1e9
            delay = backoff.next()

    async def publish(self, events: Iterable[Event]) -> list[str]:
        """XADD `events` atomically (all or none) per stream partition (a client's own events, of
        one namespace, are one); returns their stream ids.

        InvalidEpisode names any item that is not an event. PublishError after `retries` failed attempts or
        `publish_timeout` seconds; its subclass Backpressure while the consolidator lags more than `max_lag`
        (at once without `wait_on_backpressure`). An attempt that timed out may have stored the events
        (`PublishError.maybe_stored`): retry with the same events.
        """
        if (
            type(events) in _EVENT_CLASSES
            or isinstance(events, str | bytes | Mapping)
            or not isinstance(events, Iterable)
        ):
            raise InvalidEpisode(
                [("events", f"must be a list of Engram events, not {type(events).__name__}")]
            )
        events = list(events)  # a generator is read once: by the check below it would be gone
        wrong = [
            (f"events[{i}]", f"must be an Engram event ({', '.join(EVENT_TYPES)}), not {type(e).__name__}")
            for i, e in enumerate(events)
            if type(e) not in _EVENT_CLASSES
        ]
        if wrong:  # a clear error here, not an AttributeError from the encoder; nothing is published
            raise InvalidEpisode(wrong)
        payloads = [encode(e) for e in events] if self._master_key is None else []
        deadline = time.monotonic() + self.publish_timeout
        last: Exception | None = None
        try:  # bounded by the deadline: a Redis that hangs must not hold the agent past publish_timeout
            await asyncio.wait_for(self._resolve_partitions(), max(0.0, deadline - time.monotonic()))
            await asyncio.wait_for(self._check_backpressure(deadline), max(0.0, deadline - time.monotonic()))
        except TRANSIENT as exc:  # a cluster's faults too; TimeoutError (wait_for) is an OSError
            last = exc  # unreachable or hanging: the loop below retries and reports it
        attempt = 0
        backoff = Backoff(EqualJitterBackoff(cap=1.0, base=0.05))  # 50-100 ms, doubling up to 0.5-1 s
        maybe_stored = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                ids = await asyncio.wait_for(self._store(events, payloads), timeout=remaining)
                return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
            except (redis_errors.TimeoutError, TimeoutError) as exc:
                # the call may have reached Redis and run there (a large publish can time out here
                # although every event is in the stream: it must not be reported "not published")
                last, maybe_stored = exc, True
            except TRANSIENT as exc:  # before ResponseError: ClusterDownError and TryAgainError are ones
                last = exc
            except redis_errors.ResponseError as exc:  # e.g. OOM, MISCONF: Redis refused the write
                if streams.is_encrypted_refusal(exc):  # plaintext there would escape shredding
                    raise ConfigError(
                        f"this deployment (prefix {self.keys.prefix!r}) encrypts its stream: nothing was published; "
                        f"give the client its master key (master_key=, or ENGRAM_MASTER_KEY / "
                        f"ENGRAM_MASTER_KEY_FILE for the services)"
                    ) from None
                raise PublishError(f"Redis refused the events: {exc}") from exc
            attempt += 1
            if attempt > self.retries:
                break
            await asyncio.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))
        why = f"{type(last).__name__}: {last}" if last else "the deadline passed before an attempt"
        # the checks before the first attempt can outlast the deadline (a cluster that is down)
        tried = (
            f" after {attempt} attempt(s)"
            if attempt
            else " (no attempt: the checks before it waited for Redis)"
        )
        if maybe_stored:
            raise PublishError(
                f"{len(events)} event(s) not confirmed{tried} within "
                f"{self.publish_timeout:g}s ({why}): Redis may have stored them; retrying with the same "
                f"events is harmless (their event_ids deduplicate)",
                maybe_stored=True,
            ) from last
        raise PublishError(
            f"{len(events)} event(s) not published{tried} within {self.publish_timeout:g}s: {why}"
        ) from last

    async def _resolve_partitions(self) -> None:
        """Name the keys with the deployment's number of stream partitions, once per client:
        `partitions=` checked against the record, or the record adopted, or the topology's default recorded.
        ConfigError on a disagreement (`shared.partitions.check_partitions`)."""
        if self._resolved:
            return
        explicit = self._partitions is not None
        mark = (id(self.redis), self.keys)
        if not (explicit and mark in _CHECKED):
            if not explicit:
                have = await recorded(self.redis, self.keys)
                default = CLUSTER_PARTITIONS if isinstance(self.redis, RedisCluster) else 1
                self.keys = Keys(self.keys.prefix, have or default)
            await check_partitions(
                self.redis, self.keys, sealed=self._master_key is not None, explicit=explicit
            )
            if explicit:
                if len(_CHECKED) > 1024:  # tests make one deployment per test
                    _CHECKED.clear()
                _CHECKED.add(mark)
        self._resolved = True
        if self._master_key is not None:
            self._ring = shared_ring(self.keys, self._master_key)

    async def _store(self, events: list[Event], payloads: list[bytes]) -> list:
        """Publish, one script call per partition the events go to; stream ids in the events' order."""
        await self._resolve_partitions()  # when the first attempt's could not reach Redis
        by_partition: dict[int, list[int]] = {}
        for i, event in enumerate(events):
            by_partition.setdefault(self.keys.partition(event.namespace), []).append(i)
        ids: list = [None] * len(events)
        for part, positions in by_partition.items():
            stream = self.keys.partition_stream(part)
            if self._ring is None:
                got = await streams.publish(
                    self.redis,
                    stream,
                    [payloads[i] for i in positions],
                    unless_exists=self.keys.encrypted_marker(part),
                )
            else:
                got = await self._ring.publish(self.redis, stream, [events[i] for i in positions])
            for i, sid in zip(positions, got, strict=True):
                ids[i] = sid
        return ids

    async def record(self, episode: Episode | Mapping[str, Any]) -> str:
        """Publish a finished episode (an Episode or JSON-shaped dict, prepared by
        `engram_episodic.drafts.finished_episode`: InvalidEpisode naming bad fields) as one
        `EpisodeCompleted`; returns its `episode_id`."""
        episode = finished_episode(episode)
        await self._emit(EpisodeCompleted, episode_id=episode.episode_id, episode=episode)
        return episode.episode_id

    def episode(
        self,
        task: str | Mapping[str, Any],
        *,
        category: str | None = None,
        complexity: float | None = None,
        **fields: Any,
    ) -> EpisodeRecorder:
        """Open an episode (publishes `EpisodeStarted` on enter). `fields` are Episode fields."""
        return EpisodeRecorder(self, EpisodeDraft(task, category=category, complexity=complexity, **fields))

    async def forget_episode(self, episode_id: str) -> str:
        """Publish `EpisodeForgotten`; returns the event id."""
        return await self._emit(EpisodeForgotten, episode_id=episode_id)

    async def forget_user(self, user_id: str) -> str:
        """Publish `UserForgotten` for every episode of `user_id` in this namespace; returns the event id."""
        return await self._emit(UserForgotten, user_id=user_id)

    async def _emit(self, cls: Callable[..., Event], **fields: Any) -> str:
        """Publish one event of `cls` in this namespace, occurring now; returns its event id."""
        event = cls(namespace=self.namespace, occurred_at=time.time(), **fields)
        await self.publish([event])
        return event.event_id


class EpisodeRecorder:
    """An open episode (`async with client.episode(...) as ep:`): publishes the start, each action
    and the completion of its `engram_episodic.drafts.EpisodeDraft`."""

    def __init__(self, client: EngramClient, draft: EpisodeDraft):
        self.client = client
        self.draft = draft
        self._sent = False

    @property
    def episode_id(self) -> str:
        return self.draft.episode_id

    async def __aenter__(self) -> EpisodeRecorder:
        await self.client._emit(EpisodeStarted, episode_id=self.episode_id, episode=self.draft.start)
        return self

    async def action(
        self,
        action_type: str,
        *,
        input: str | None = None,
        output: str | None = None,
        success: bool | None = None,
        error: str | None = None,
        timestamp: float | None = None,
    ) -> str:
        """Publish one `ActionRecorded`; returns its event id (also the action's `action_id`).

        The action is kept by the draft only once Redis took it, so a failed publish can be retried."""
        act = self.draft.action(
            action_type, input=input, output=output, success=success, error=error, timestamp=timestamp
        )
        try:
            # draft.action always sets action_id (a fresh event id); Action types it optional
            await self.client._emit(
                ActionRecorded, episode_id=self.episode_id, event_id=cast(str, act.action_id), action=act
            )
        except BaseException:
            self.draft.actions.remove(act)
            raise
        return act.action_id  # type: ignore[return-value]

    async def complete(self, outcome: str, **fields: Any) -> Episode:
        """Publish `EpisodeCompleted` with the final snapshot; returns it (with every action).

        `fields` may set any Episode field. The event carries the last MAX_ACTIONS actions; the consolidator
        merges the ones published before by `action_id`, so a longer episode still completes whole.
        """
        snapshot = self.draft.completion(outcome, **fields)
        self._sent = True  # a completion Redis may have stored is never overwritten by the block's exit
        await self.client._emit(EpisodeCompleted, episode_id=self.episode_id, episode=snapshot)
        return self.draft.completed_with(snapshot)

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self.draft.completed is not None or self._sent:
            return
        outcome, fields = EpisodeDraft.exit_fields(exc_type, exc)
        await self.complete(outcome, **fields)
