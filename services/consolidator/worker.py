"""The consolidator loop (docs/architecture.md, The consolidator): `settings.in_flight` lanes per
process, each turn reading (`Worker.turn`), projecting and acking only what was written. A transport
failure or an unavailable embedder (`EmbedderUnavailable`) leaves the whole batch pending, read again
after a backoff (each read a delivery). Another embedder's index (`EmbedderMismatch`) is exit 2 at
start, and later pauses the lanes until the index matches again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis import exceptions as redis_errors
from redis.backoff import ExponentialBackoff

from engram_episodic.errors import Conflict
from services.consolidator import deadletters, erasure, expiry, retention
from services.consolidator.decoding import BatchResult
from services.consolidator.metrics import WorkerMetrics
from services.consolidator.projector import Projector
from shared import cluster, generations, streams, tracing
from shared.codec import trace_of
from shared.embedding_base import Embedder, EmbedderUnavailable, report_passes
from shared.generations import StaleGeneration
from shared.index import (
    EmbedderMismatch,
    VectorParams,
    current_generation,
    embedder_setting,
    ensure_episode_index,
)
from shared.keyring import KeyRing
from shared.partitions import check_partitions
from shared.retry import TRANSIENT, Backoff, until_available, wait_or_stop
from shared.settings import Settings

log = logging.getLogger("engram.consolidator")
MISMATCH_LOG_SECONDS = 30.0  # how often a paused worker says why
MISMATCH_CHECK_SECONDS = 2.0  # how often a paused worker re-reads the live index's embedder
EMBEDDER_BACKOFF = (0.5, 30.0)
"""(base, cap) seconds between reads of a batch while the embedder is unavailable: 1, 2, 4, ... 30 s,
so with ENGRAM_MAX_DELIVERIES 5 about half a minute of outage dead-letters it."""
OWN_PENDING_CHECK_SECONDS = 2.0
"""How often an idle worker looks for entries pending to its name that no lane holds (`OwnPending`)."""
OUTAGES: tuple[type[Exception], ...] = (EmbedderUnavailable, *TRANSIENT)  # waited out, the batch pending
SWEEP_CHECK_SECONDS = 5.0  # how often lane 0 asks whether dead generations are to be swept


def consumer_name(settings: Settings) -> str:
    """Unique per process: host, pid and a random suffix (containers may share pids)."""
    return settings.consumer_name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class OwnPending:
    """Entries delivered to this consumer name and not acked that no lane of this process holds, read
    again at the next turns (`read`) rather than after the lease (ENGRAM_LEASE_MS). Three lost replies,
    one recovery: a predecessor under the same name crashed with a batch in hand (read at start); a
    read raised after Redis delivered (`again`); a read's reply was lost silently, redis-py retrying it
    after a socket timeout (`check`, an idle lane's look every OWN_PENDING_CHECK_SECONDS). A lane
    `hold`s what it read before any await, so no entry is projected by two lanes at once."""

    def __init__(self, groups: list[streams.StreamGroup], name: str):
        self.groups = groups
        self.name = name
        self.todo: list[tuple[streams.StreamGroup, bytes]] = [(g, b"0") for g in groups]  # (group, after)
        self.in_hand: set[tuple[str, bytes]] = set()  # (stream, id) held by a lane now
        self.checked = time.monotonic()

    def again(self) -> None:
        """Read every partition's own pending entries from the start at the next turns."""
        self.todo = [(g, b"0") for g in self.groups]

    def hold(
        self, group: streams.StreamGroup, entries: list[streams.Entry], held: set[tuple[str, bytes]]
    ) -> list[streams.Entry]:
        """Mark `entries` as a lane's (here and in its turn's `held`); returns them."""
        mine = {(group.stream, e.stream_id) for e in entries}
        held |= mine
        self.in_hand |= mine
        return entries

    async def check(self, limit: int) -> None:
        """Queue a read from the first pending entry (of up to `limit` + 1 per partition) no lane holds."""
        self.checked = time.monotonic()
        for group in self.groups:
            ids = await group.own_pending_ids(self.name, count=limit + 1)
            for i, sid in enumerate(ids):
                if (group.stream, sid) not in self.in_hand:
                    after = ids[i - 1] if i else b"0"
                    if (group, after) not in self.todo:
                        self.todo.append((group, after))
                    break

    async def read(
        self, count: int, held: set[tuple[str, bytes]], keep: Callable[..., Awaitable[list[streams.Entry]]]
    ) -> tuple[streams.StreamGroup, list[streams.Entry]]:
        """Up to `count` queued entries of one partition that no lane holds, held, and passed through
        `keep(group, entries)`; ([], the first group) once every queued read is done."""
        while self.todo:
            group, after = self.todo.pop()  # before any await: the lanes share the list
            entries = await group.read_own_pending(self.name, count=count, after=after)
            if len(entries) == count:  # maybe more: the next lane reads on after this batch
                self.todo.append((group, entries[-1].stream_id))
            entries = [e for e in entries if (group.stream, e.stream_id) not in self.in_hand]
            entries = await keep(group, self.hold(group, entries, held))
            if entries:
                return group, entries
        return self.groups[0], []


class Worker:
    """One consumer of the episode stream's group; `on_batch(result)` is awaited after each batch
    with completed episodes (the facts triggers)."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        embedder: Embedder,
        *,
        metrics: WorkerMetrics | None = None,
        name: str | None = None,
        on_batch: Callable[[BatchResult], Awaitable[object]] | None = None,
    ):
        self.settings = settings
        self.redis = redis
        self.embedder = embedder
        self.keys = settings.keys
        self.partitions = streams.Partitions(redis, self.keys.streams, settings.consumer_group)
        self.metrics = metrics or WorkerMetrics()
        self.name = name or consumer_name(settings)
        self.on_batch = on_batch
        self.last_errors: dict[tuple[str, bytes], str] = {}  # (partition stream, id) → last failure
        self.projector: Projector | None = None
        self.processed = 0
        # the last read returned entries: a burst may still be arriving (background facts runs defer)
        self.backlogged = False
        # a whole batch per lane: model embedders are ~50% faster on 256 texts than on 64 (less padding);
        # a slow batch keeps its lease by renewal (`_renew_lease`)
        self.lane_batch = settings.batch_size
        self.keyring = KeyRing.from_settings(settings)  # None: no master key, plaintext stream
        self._erasure: asyncio.Task | None = None  # the AOF rewrite after forgets, off the lanes
        # when each housekeeping task was last due (`_due`); the first trim and expiry wait their interval
        self._last_due = {"trim": time.monotonic(), "expiry": time.monotonic()}
        self.paused_by: EmbedderMismatch | None = None
        self._paused_said = 0.0
        # /healthz: when each lane last came round its loop, and a batch was last acked (monotonic)
        self.lane_beats: dict[int, float] = {}
        self.last_batch_at: float | None = None
        self.own = OwnPending(self.partitions.groups, self.name)
        # the live generation this process last swept dead ones under (None: not yet) and when it checked
        self._swept_under: int | None = None

    async def setup(self) -> bool:
        """Ensure the consumer group on every partition and the live generation's index (Conflict on
        another embedder); ConfigError when the deployment records another number of partitions.
        Returns True (for `until_available`)."""
        await cluster.check_search(self.redis)  # before anything is created
        await check_partitions(
            self.redis,
            self.keys,
            sealed=self.keyring is not None,
            explicit=self.settings.stream_partitions is not None,
        )
        await self.partitions.ensure()
        if self.keyring is not None:  # MasterKeyMismatch (a Conflict): another master key wrapped them
            await self.keyring.load(self.redis)
        await self._projector()
        return True

    async def _projector(self) -> Projector:
        gen = await current_generation(self.redis, self.keys)
        if self.projector is None or self.projector.gen != gen:
            tag_key = (await self.keyring.load(self.redis)).tag_key if self.keyring is not None else None
            tags = await ensure_episode_index(
                self.redis,
                self.keys,
                gen,
                VectorParams.of(self.settings, self.embedder.dim),
                self.embedder.name,
                tag_key=tag_key,
                point_alias=True,
            )
            self.projector = Projector(
                self.redis,
                self.embedder,
                gen,
                self.metrics,
                keyring=self.keyring,
                tags=tags,
                settings=self.settings,
            )
        return self.projector

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set, with `settings.in_flight` lanes sharing the consumer name (safe as
        N workers are). A Conflict in a lane stops the others after their batch in hand and is raised."""
        if await until_available(self.setup, what=f"start of worker {self.name}", log=log, stop=stop) is None:
            return
        log.info(
            "worker %s ◆ consuming %s%s as group %s ◆ %d batch(es) in flight",
            self.name,
            self.keys.partition_stream(0),
            f" and {self.keys.partitions - 1} more partitions" if self.keys.partitions > 1 else "",
            self.settings.consumer_group,
            self.settings.in_flight,
        )
        halt = asyncio.Event()
        conflicts: list[Conflict] = []
        try:
            # a lane never raises out of the group: cancelling one mid-batch is unsafe (redis-py can
            # swallow a cancellation)
            async with asyncio.TaskGroup() as lanes:
                for i in range(self.settings.in_flight):
                    lanes.create_task(self._lane(stop, halt, conflicts, lane=i), name=f"lane-{i}")
        finally:
            if self._erasure is not None:  # a rewrite in progress goes on in Redis; the mark stays pending
                self._erasure.cancel()
        if conflicts:
            raise conflicts[0]
        try:  # a worker that stopped cleanly leaves no consumer behind in XINFO CONSUMERS
            await self.partitions.retire_consumer(self.name)
        except (redis_errors.RedisError, OSError) as exc:
            log.warning("worker %s ◆ could not remove its consumer: %s", self.name, exc)
        log.info("worker %s ◆ stopped ◆ %d processed", self.name, self.processed)

    def _beat(self, lane: int) -> None:
        """`lane` is turning now (`/healthz`: `services.consolidator.health`)."""
        self.lane_beats[lane] = time.monotonic()

    async def _lane(
        self, stop: asyncio.Event, halt: asyncio.Event, conflicts: list[Conflict], *, lane: int
    ) -> None:
        backoff = Backoff()
        embedder_backoff = Backoff(ExponentialBackoff(cap=EMBEDDER_BACKOFF[1], base=EMBEDDER_BACKOFF[0]))
        report_passes(lambda: self._beat(lane))  # each forward pass of a long embedding is a turn too
        while not stop.is_set() and not halt.is_set():
            self._beat(lane)
            try:
                await self.turn()
                backoff.reset()
                embedder_backoff.reset()
                self._resume()
                if lane == 0:
                    await self._housekeep()
            except EmbedderMismatch as exc:  # rebuilt under us (`reindex`): pause, never exit (an exit would stop `make run`'s whole stack)
                self._pause(exc)
                await wait_or_stop(stop, MISMATCH_CHECK_SECONDS)
            except Conflict as exc:
                conflicts.append(exc)
                halt.set()
                return
            except OUTAGES as exc:
                down = isinstance(exc, EmbedderUnavailable)
                delay = (embedder_backoff if down else backoff).next()
                log.warning(
                    "worker %s ◆ %s unavailable (%s); the batch stays pending, read again in %.1fs",
                    self.name,
                    "embedder" if down else "redis",
                    str(exc)[:300],
                    delay,
                )
                self.own.again()
                await wait_or_stop(stop, delay)
            except redis_errors.ResponseError as exc:
                if "NOGROUP" in str(exc):  # the stream was deleted or Redis restarted empty
                    await self.partitions.ensure()
                    continue
                log.exception("worker %s ◆ redis error", self.name)
                await wait_or_stop(stop, backoff.next())

    def _resume(self) -> None:
        """After a turn that ran: a pause (`_pause`) is over, said once."""
        if self.paused_by is not None:
            log.warning(
                "worker %s ◆ the live index uses this worker's embedder %r (dim %d) again; resuming",
                self.name,
                self.embedder.name,
                self.embedder.dim,
            )
            self.paused_by = None

    def _pause(self, exc: EmbedderMismatch) -> None:
        """Note that the live index uses another embedder; say so now and every MISMATCH_LOG_SECONDS
        (once for all lanes). Nothing is read while paused."""
        first = self.paused_by is None
        self.paused_by = exc
        now = time.monotonic()
        if not first and now - self._paused_said < MISMATCH_LOG_SECONDS:
            return
        self._paused_said = now
        log.error(
            "worker %s ◆ paused: index generation %d now uses embedder %r (dim %d), this worker %r "
            "(dim %d); nothing is projected until it is restarted with %s (the stream keeps the "
            "entries)",
            self.name,
            exc.gen,
            exc.index_embedder,
            exc.index_dim,
            exc.embedder,
            exc.dim,
            embedder_setting(exc.index_embedder, exc.index_dim),
        )

    def _due(self, what: str, seconds: float) -> bool:
        """Whether `seconds` passed since `what` was last due; if so, it is due now."""
        now = time.monotonic()
        if now - self._last_due.get(what, -math.inf) < seconds:
            return False
        self._last_due[what] = now
        return True

    async def _housekeep(self) -> None:
        """Lane 0, after each turn: the lag gauges, stream retention, expiry, the AOF rewrite after
        forgets (in the background, `erasure`) and the sweep of dead generations."""
        s = self.settings
        if self._due("lag", 5):
            await self.refresh_lag()
        if s.stream_retention is not None and self._due("trim", s.retention_interval):
            removed = await retention.trim(self.redis, self.keys, retention_seconds=s.stream_retention)
            if removed:
                log.info(
                    "worker %s ◆ trimmed %d projected entries older than %gs",
                    self.name,
                    removed,
                    s.stream_retention,
                )
        if self._due("expiry", s.expiry_interval):
            await expiry.sweep(self.redis, s)
        if (
            s.erasure_interval is not None
            and (self._erasure is None or self._erasure.done())
            and self._due("erasure", 5)
        ):
            self._erasure = asyncio.create_task(self._erase(s.erasure_interval))
        if self._due("sweep", SWEEP_CHECK_SECONDS):
            await self._sweep()

    async def _sweep(self) -> None:
        """Sweep dead generations (`shared.generations`) when `due`; one worker at a time (a lease)."""
        is_due, live = await generations.due(self.redis, self.keys, self._swept_under)
        if not is_due:
            return
        lock = self.keys.sweep_lock
        if not await self.redis.set(lock, self.name, nx=True, px=self.settings.lease_ms):
            return
        try:
            await generations.sweep(self.redis, self.keys)
            self._swept_under = live
        finally:
            await self.redis.delete(lock)

    async def _erase(self, interval: float) -> None:
        try:
            await erasure.housekeep(
                self.redis,
                self.keys,
                interval=interval,
                lease_ms=self.settings.lease_ms,
            )
        except (redis_errors.RedisError, OSError, TimeoutError) as exc:  # retried on the next check
            log.warning("worker %s ◆ erasure housekeeping failed: %s", self.name, exc)

    async def turn(self) -> int:
        """One cycle; returns how many entries it handled. Reads this consumer's own pending entries
        (`OwnPending`), else entries idle past the lease (`XAUTOCLAIM`; past `max_deliveries` they are
        dead-lettered), filled up with new ones (`XREADGROUP`); a failing batch is retried entry by entry."""
        s = self.settings
        projector = await self._projector()
        held: set[tuple[str, bytes]] = set()  # this turn's entries, in `own.in_hand` until it ends
        try:
            group, entries = await self.own.read(self.lane_batch, held, self._drop_exhausted)
            if not entries:
                group = self.partitions.next_for_reclaim()
                claimed, _deleted = await group.reclaim(
                    self.name, min_idle_ms=s.lease_ms, count=self.lane_batch
                )
                entries = await self._drop_exhausted(group, self.own.hold(group, claimed, held))
            if entries:  # a turn stays within one partition: fill up from the reclaimed one
                more = await group.read_new(self.name, count=self.lane_batch - len(entries), block_ms=1)
                entries += self.own.hold(group, more, held)
            else:
                group, entries = await self.partitions.read_any(
                    self.name, count=self.lane_batch, block_ms=s.block_ms
                )
                self.own.hold(group, entries, held)
            self.backlogged = bool(entries)
            if not entries:
                if time.monotonic() - self.own.checked >= OWN_PENDING_CHECK_SECONDS:
                    await self.own.check(self.settings.in_flight * self.lane_batch)
                return 0
            # again after the read, which may have waited `block_ms`: a replay may have swapped its
            # generation in meanwhile (EmbedderMismatch for another embedder's: the entries stay pending)
            projector = await self._projector()
            done = asyncio.Event()
            renewal = asyncio.create_task(self._renew_lease(group, [e.stream_id for e in entries], done))
            try:
                try:
                    return await self._project(group, projector, entries)
                except StaleGeneration as exc:  # swapped during the batch: project it into the new one
                    log.info("worker %s ◆ %s; projecting the batch again", self.name, exc)
                try:
                    return await self._project(group, await self._projector(), entries)
                except StaleGeneration as exc:  # swapped twice in one batch: left pending, read again
                    log.info("worker %s ◆ %s; the batch stays pending", self.name, exc)
                    self.own.again()
                    return 0
            finally:
                # stopped by an event, not by cancel(): redis-py can swallow the cancellation of a
                # command in flight, and `await renewal` would wait forever
                done.set()
                await asyncio.wait({renewal}, timeout=1.0)
        finally:
            self.own.in_hand -= held

    async def _renew_lease(self, group: streams.StreamGroup, ids: list[bytes], done: asyncio.Event) -> None:
        """Until `done` is set, renew the lease of a batch every third of `lease_ms`, so a batch slower
        than the lease is not reclaimed and projected twice."""
        period = self.settings.lease_ms / 3000.0
        while not await wait_or_stop(done, period):
            try:
                await group.renew(self.name, ids, min_idle_ms=int(self.settings.lease_ms / 3))
            except Exception as exc:  # the batch's own calls will surface a real outage
                log.warning("worker %s ◆ lease renewal failed: %s", self.name, exc)

    async def _project(
        self, group: streams.StreamGroup, projector: Projector, entries: list[streams.Entry]
    ) -> int:
        started = time.perf_counter()
        links = self._delivered(entries) if tracing.enabled() else []
        with tracing.span("engram.consolidator.batch", links=links, entries=len(entries), consumer=self.name):
            result = await self._apply(projector, entries)
            if result is None and len(entries) > 1:
                # isolate the entry that fails: its neighbours are projected and acked now, and only
                # the culprit stays pending until it succeeds or reaches the delivery limit
                ok = [r for e in entries if (r := await self._apply(projector, [e])) is not None]
                result = BatchResult(
                    ok=[i for r in ok for i in r.ok],
                    dead=[d for r in ok for d in r.dead],
                    completed=[c for r in ok for c in r.completed],
                )
            if result is None:
                return 0
            await self._finish(group, result)
            self.last_batch_at = time.monotonic()
            self.metrics.batch_seconds.observe(time.perf_counter() - started)
            self.processed += len(result.ok) + len(result.dead)
            if self.on_batch is not None and result.completed:
                await self.on_batch(result)
            return len(entries)

    def _delivered(self, entries: list[streams.Entry]) -> list[str]:
        """A `engram.stream.deliver` span in each entry's publisher's trace; their traceparents."""
        out = []
        for entry in entries:
            tp = trace_of(entry.payload)
            if tp is not None:
                with tracing.span(
                    "engram.stream.deliver", kind="consumer", parent=tp, stream_id=entry.stream_id.decode()
                ):
                    out.append(tp)
        return out

    async def _apply(self, projector: Projector, entries: list[streams.Entry]) -> BatchResult | None:
        """Project `entries`; None (left pending, error remembered) on a failure that retrying entry by
        entry may isolate. Transport faults, Conflicts and an unavailable embedder propagate."""
        try:
            return await projector.apply(entries)
        except StaleGeneration:  # not this batch's fault: `turn` projects it again
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"[:500]
            for e in entries:
                self.last_errors[(e.stream, e.stream_id)] = reason
            if isinstance(
                exc, Conflict | redis_errors.ConnectionError | redis_errors.TimeoutError | EmbedderUnavailable
            ):
                raise
            log.exception(
                "worker %s ◆ %d entr%s failed; left pending",
                self.name,
                len(entries),
                "y" if len(entries) == 1 else "ies",
            )
            return None

    async def _dead_letter(self, group: streams.StreamGroup, entry: streams.Entry, reason: str) -> None:
        await deadletters.dead_letter(group, self.keys, entry, reason, consumer=self.name)
        self.metrics.dead_letters.labels(reason.split(":", 1)[0]).inc()
        log.warning("worker %s ◆ dead-lettered %s ◆ %s", self.name, entry.stream_id.decode(), reason[:200])

    async def _finish(self, group: streams.StreamGroup, result: BatchResult) -> None:
        for entry, reason in result.dead:
            await self._dead_letter(group, entry, reason)
        await group.ack(result.ok)
        for sid in result.ok:
            self.last_errors.pop((group.stream, sid), None)

    async def _drop_exhausted(
        self, group: streams.StreamGroup, claimed: list[streams.Entry]
    ) -> list[streams.Entry]:
        """Dead-letter claimed entries (of `group`'s partition) delivered more than `max_deliveries` times."""
        if not claimed:
            return []
        counts = await group.delivery_counts([e.stream_id for e in claimed])
        keep = []
        for entry in claimed:
            n = counts.get(entry.stream_id, 1)
            if n > self.settings.max_deliveries:
                reason = (
                    f"DeliveryLimit: failed {n - 1} deliveries; last error: "
                    f"{self.last_errors.get((group.stream, entry.stream_id), 'unknown (worker died or timed out)')}"
                )
                exhausted = streams.Entry(entry.stream_id, entry.payload, n, stream=group.stream)
                await self._dead_letter(group, exhausted, reason)
            else:
                keep.append(entry)
        return keep

    async def refresh_lag(self) -> None:
        """Set the lag and pending gauges: sums over the partitions, and per partition when several."""
        rows = await self.partitions.each()
        self.metrics.lag.set(sum(row["lag"] for row in rows))
        self.metrics.pending.set(sum(row["pending"] for row in rows))
        if len(rows) > 1:  # P <= 256 label values (shared.keys.MAX_PARTITIONS)
            for i, row in enumerate(rows):
                self.metrics.partition_lag.labels(str(i)).set(row["lag"])
