"""The only module that issues stream commands (XADD, XREADGROUP, XAUTOCLAIM, XACK, XDEL, ...).

Entries have one field, `e`, the codec envelope (msgpack); dead letters add `sid`, `reason`, the
consumer and the time. Commands on a stream are module functions of (redis, stream); those of a
consumer group methods of `StreamGroup`; `Partitions` is one group on every partition stream.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

from shared.replies import as_text

FIELD = b"e"


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry: its id (e.g. b"1732900000000-0") and raw payload: None if the entry was deleted
    while pending (XDEL by a forget), b"" if it exists without the payload field (not ours: dead-lettered);
    `stream` is the key of the (partition) stream it was read from ("" when not read from one)."""

    stream_id: bytes
    payload: bytes | None
    deliveries: int = 1
    stream: str = ""


PUBLISH_LUA = f"""#!lua
local m, d = tonumber(ARGV[1]), tonumber(ARGV[2])
if #KEYS > 1 + m + d and redis.call('EXISTS', KEYS[#KEYS]) == 1 then
  return redis.error_reply('ENCRYPTED the stream is encrypted')
end
for j = 1, m do
  local cur = redis.call('HGET', KEYS[1 + j], 'k')
  if cur then
    if cur ~= ARGV[1 + 2 * j] then return {{0, j, redis.call('HGET', KEYS[1 + j], 'w')}} end
  elseif ARGV[2 + 2 * j] == '' then return {{0, j, false}} end
end
for j = 1, m do
  if ARGV[2 + 2 * j] ~= '' and redis.call('EXISTS', KEYS[1 + j]) == 0 then
    local t = redis.call('TIME')
    redis.call('HSET', KEYS[1 + j], 'k', ARGV[1 + 2 * j], 'w', ARGV[2 + 2 * j],
               't', t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000)))
  end
end
for j = 1, d do redis.call('DEL', KEYS[1 + m + j]) end
local out = {{1}}
for i = 3 + 2 * m, #ARGV do out[#out + 1] = redis.call('XADD', KEYS[1], '*', '{FIELD.decode()}', ARGV[i]) end
return out
"""
"""XADD of every payload (ARGV[3 + 2m]...) to KEYS[1] in one atomic call (a script: a MULTI's replies
cost far more CPU), refused before any XADD when Redis is out of memory (`#!lua`: no `allow-oom`) or
the key after the others exists (ENCRYPTED). Given m data keys (KEYS[2..], ARGV[1] = m, each with a
kid and a wrapped proposal), it XADDs only if every one is the key sealed with (same kid); a missing
one is created from its proposal (first wins), never from b"" (destroyed); the d `destroy` keys
(ARGV[2] = d) go in the same step. Returns {1, ids...}, or {0, j, stored wrapped key or nil} for the
first failed check j (nothing written)."""


async def publish(
    r: aioredis.Redis, stream: str, payloads: Sequence[bytes], *, unless_exists: str | None = None
) -> list[bytes]:
    """XADD each payload in one script call (all or none); returns stream ids. With `unless_exists`,
    nothing is added if that key exists: ResponseError `ENCRYPTED` (`is_encrypted_refusal`). On a
    cluster, a key outside the stream's slot (one stream, ENGRAM_STREAM_PARTITIONS=1) is checked apart,
    with the window that leaves."""
    if not payloads:
        return []
    if (
        unless_exists is not None
        and isinstance(r, RedisCluster)
        and key_slot(unless_exists.encode()) != key_slot(stream.encode())
    ):
        if await r.exists(unless_exists):
            raise ResponseError("ENCRYPTED the stream is encrypted")
        unless_exists = None
    keys = [stream] if unless_exists is None else [stream, unless_exists]
    return list(await r.register_script(PUBLISH_LUA)(keys=keys, args=[0, 0, *payloads]))[1:]


def is_encrypted_refusal(exc: Exception) -> bool:
    """Whether `exc` is PUBLISH_LUA's refusal of `unless_exists`."""
    return str(exc).startswith("ENCRYPTED")


async def publish_sealed(
    r: aioredis.Redis,
    stream: str,
    payloads: Sequence[bytes],
    checks: Sequence[tuple[str, bytes, bytes]],
    destroy: Sequence[str] = (),
) -> list:
    """XADD sealed `payloads` in one script call if every `(data key hash, kid, proposal)` check holds
    (proposal b"" = the key must exist with that kid), deleting the `destroy` keys in the same step.
    Returns the script's reply (PUBLISH_LUA)."""
    args: list = [len(checks), len(destroy)]
    for _key, kid, proposal in checks:
        args += [kid, proposal]
    return list(
        await r.register_script(PUBLISH_LUA)(
            keys=[stream, *(key for key, _, _ in checks), *destroy], args=args + list(payloads)
        )
    )


def _entries(raw, stream: str) -> list[Entry]:
    out = []
    for stream_id, fields in raw or []:
        if fields is None:  # deleted while pending (XDEL after a forget)
            out.append(Entry(stream_id, None, stream=stream))
            continue
        # b"": present but without our field
        out.append(Entry(stream_id, fields.get(FIELD, b""), stream=stream))
    return out


async def delete(r: aioredis.Redis, stream: str, ids: Sequence[bytes | str]) -> int:
    """XDEL entries (used by forgetting so the stream no longer holds forgotten data)."""
    if not ids:
        return 0
    return int(await r.xdel(stream, *ids))


async def read_range(
    r: aioredis.Redis, stream: str, start: bytes | str = "-", end: bytes | str = "+", count: int = 1000
) -> list[Entry]:
    """XRANGE a page of entries (for replay and for the dead-letter listing)."""
    # ids may be bytes (redis-py takes them); the stale types-redis 4.6 stubs, where installed, say str
    return _entries(await r.xrange(stream, min=start, max=end, count=count), stream)  # type: ignore[arg-type, unused-ignore]


async def delete_entries(r: aioredis.Redis, entries: Iterable[Entry]) -> int:
    """XDEL `entries` from the streams they were read from (one XDEL per stream); returns the count."""
    by_stream: dict[str, list[bytes]] = defaultdict(list)
    for entry in entries:
        if not entry.stream:
            raise ValueError("an entry to delete must name its stream")
        by_stream[entry.stream].append(entry.stream_id)
    return sum([await delete(r, stream, ids) for stream, ids in by_stream.items()])


async def read_range_raw(
    r: aioredis.Redis, stream: str, start: bytes | str = "-", end: bytes | str = "+", count: int = 1000
) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """XRANGE returning all fields (dead letters have several)."""
    # bytes replies (decode_responses=False); redis-py annotates bytes | str and an optional reply
    raw = cast(
        list[tuple[bytes, dict[bytes, bytes]]], await r.xrange(stream, min=start, max=end, count=count)
    )  # type: ignore[arg-type, unused-ignore]
    return list(raw)


async def length(r: aioredis.Redis, stream: str) -> int:
    return int(await r.xlen(stream))


async def _in_order(r: aioredis.Redis, steps: Sequence[Callable[[Any], Any]]) -> list[Any]:
    """The replies of `steps` (each called with the client or a pipeline) run in one MULTI; on a cluster
    (several slots) one by one, in order, so that a failure leaves a copy too many, never a loss."""
    if isinstance(r, RedisCluster):
        return [await step(r) for step in steps]
    async with r.pipeline(transaction=True) as pipe:
        for step in steps:
            step(pipe)
        return await pipe.execute()


async def requeue(
    r: aioredis.Redis,
    stream: str,
    dead_stream: str,
    dead_id: bytes | str,
    payload: bytes,
    original_id: bytes | str | None = None,
) -> bytes:
    """Re-publish a dead letter's payload to `stream`, removing it from `dead_stream` and its original
    entry from `stream` (`_in_order`); the new id."""
    steps = [lambda c: c.xadd(stream, {FIELD: payload})]
    if original_id:
        steps.append(lambda c: c.xdel(stream, original_id))
    steps.append(lambda c: c.xdel(dead_stream, dead_id))
    return (await _in_order(r, steps))[0]


def id_tuple(value: bytes | str | None) -> tuple[int, int]:
    """A stream id as (ms, seq), comparable; None is 0-0."""
    text = value.decode() if isinstance(value, bytes) else str(value or "0-0")
    ms, _, seq = text.partition("-")
    return int(ms or 0), int(seq or 0)


async def groups(r: aioredis.Redis, stream: str) -> list[dict]:
    """XINFO GROUPS (empty when the stream does not exist)."""
    try:
        return list(await r.xinfo_groups(stream))
    except ResponseError:
        return []


async def trim_before(r: aioredis.Redis, stream: str, min_id: str) -> int:
    """XTRIM MINID (exact): remove every entry with an id lower than `min_id`; returns the count."""
    return int(await r.xtrim(stream, minid=min_id, approximate=False))


@dataclass(frozen=True, slots=True)
class StreamGroup:
    """The consumer group `group` on `stream`: every command bound to a group goes through one of these
    (cheap: `redis` is the caller's client). Methods acting for a consumer take its name first. Unless
    said otherwise redis-py's errors propagate: ResponseError `NOGROUP` when the stream or the group is
    missing (`ensure` re-creates them), ConnectionError/TimeoutError on transport faults."""

    redis: aioredis.Redis
    stream: str
    group: str

    async def ensure(self, start: str = "0") -> None:
        """Create the group (and the stream) if missing, reading from id `start` ("0": all, "$": new);
        ResponseError other than BUSYGROUP (e.g. WRONGTYPE)."""
        try:
            await self.redis.xgroup_create(self.stream, self.group, id=start, mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read_new(self, consumer: str, *, count: int, block_ms: int | None) -> list[Entry]:
        """XREADGROUP `>` for `consumer`: up to `count` entries never delivered to the group, waiting at
        most `block_ms` ms when there is none (None: not at all; 0 would wait forever)."""
        return await self._read(consumer, ">", count, block_ms)

    async def _read(self, consumer: str, start: bytes | str, count: int, block_ms: int | None) -> list[Entry]:
        if count <= 0:  # no command sent
            return []
        # RESP2 (pinned by shared.redis_conn): [[stream, entries]]; redis-py annotates the RESP3 dict
        res = cast(
            list[Any],
            await self.redis.xreadgroup(
                self.group, consumer, {self.stream: start}, count=count, block=block_ms
            ),
        )
        return _entries(res[0][1], self.stream) if res else []

    async def own_pending_ids(self, consumer: str, *, count: int) -> list[bytes]:
        """The ids of up to `count` entries delivered to `consumer` and not acked, oldest first (XPENDING
        with a consumer: ids only, no payloads)."""
        rows = await self.redis.xpending_range(
            self.stream, self.group, min="-", max="+", count=count, consumername=consumer
        )
        return [cast(bytes, row["message_id"]) for row in rows]

    async def read_own_pending(self, consumer: str, *, count: int, after: bytes | str = b"0") -> list[Entry]:
        """Up to `count` entries delivered to `consumer` and not acked, with ids after `after` ("0": all),
        without waiting; one deleted meanwhile comes back with `payload` None."""
        return await self._read(consumer, after, count, None)

    async def reclaim(
        self, consumer: str, *, min_idle_ms: int, count: int
    ) -> tuple[list[Entry], list[bytes]]:
        """XAUTOCLAIM for `consumer` up to `count` pending entries idle longer than `min_idle_ms` ms,
        whoever held them (a delivery each): (claimed entries, ids deleted while pending)."""
        if count <= 0:
            return [], []
        res = await self.redis.xautoclaim(
            self.stream, self.group, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count
        )
        claimed = _entries(res[1], self.stream)
        deleted = list(res[2]) if len(res) > 2 else []
        return claimed, deleted

    async def renew(self, consumer: str, ids: Sequence[bytes], *, min_idle_ms: int) -> int:
        """Reset the idle time of `consumer`'s pending `ids` idle at least `min_idle_ms` ms (`XCLAIM
        JUSTID`: no delivery counted; one reclaimed by another consumer meanwhile stays its); the count."""
        if not ids:
            return 0
        return len(
            await self.redis.xclaim(
                self.stream,
                self.group,
                consumer,
                min_idle_time=min_idle_ms,
                message_ids=list(ids),
                justid=True,
            )
        )

    async def delivery_counts(self, ids: Sequence[bytes]) -> dict[bytes, int]:
        """How many times each pending id has been delivered (XPENDING extended form, one call per id);
        ids no longer pending are absent from the result."""
        counts: dict[bytes, int] = {}
        for sid in ids:
            res = await self.redis.xpending_range(self.stream, self.group, min=sid, max=sid, count=1)
            if res:
                counts[sid] = int(res[0]["times_delivered"])
        return counts

    async def ack(self, ids: Sequence[bytes]) -> int:
        """XACK `ids`; returns how many were pending and are now acknowledged (0 for no ids)."""
        if not ids:
            return 0
        return int(await self.redis.xack(self.stream, self.group, *ids))

    async def dead_letter(self, dead_stream: str, entry: Entry, reason: str, consumer: str) -> bytes:
        """Copy `entry` to `dead_stream` with its `reason` (cut to 2000 bytes), `consumer`, time (epoch s),
        delivery count and source partition (`src`), then XACK the original (`_in_order`). Its dead id."""
        fields: dict[FieldT, EncodableT] = {
            b"e": entry.payload or b"",
            b"sid": entry.stream_id,
            b"src": self.stream.encode(),
            b"reason": reason.encode()[:2000],
            b"consumer": consumer.encode(),
            b"at": repr(time.time()).encode(),
            b"deliveries": str(entry.deliveries).encode(),
        }
        steps = [
            lambda c: c.xadd(dead_stream, fields),
            lambda c: c.xack(self.stream, self.group, entry.stream_id),
        ]
        return (await _in_order(self.redis, steps))[0]

    async def settled(self) -> str | None:
        """The stream's last entry id once this group was delivered and acked every entry (a version of
        what its consumers built, unchanged until the next publish); None while an entry waits or is
        pending or the group does not exist; "0-0" for no stream. One round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xinfo_stream(self.stream)
            pipe.xinfo_groups(self.stream)
            stream, rows = await pipe.execute(raise_on_error=False)
        if isinstance(stream, ResponseError) or isinstance(rows, ResponseError):
            if "no such key" in str(stream).lower():
                return "0-0"
            raise stream if isinstance(stream, ResponseError) else rows
        row = next((g for g in rows if as_text(g["name"]) == self.group), None)
        if row is None:  # entries nobody has read yet
            return None
        last = id_tuple(stream.get("last-generated-id"))
        if int(row.get("pending") or 0) or id_tuple(row.get("last-delivered-id")) < last:
            return None
        return f"{last[0]}-{last[1]}"

    async def _row(self) -> dict | None:
        """This group's XINFO GROUPS row; None when the stream or the group does not exist."""
        for g in await groups(self.redis, self.stream):
            if as_text(g["name"]) == self.group:
                return g
        return None

    async def info(self) -> dict[str, int]:
        """{pending, lag, consumers} counts from XINFO GROUPS (zeros when the stream or group is missing;
        lag 0 when Redis cannot tell it, see `lag`)."""
        g = await self._row()
        if g is None:
            return {"pending": 0, "lag": 0, "consumers": 0}
        lag = g.get("lag")
        return {
            "pending": int(g.get("pending") or 0),
            "lag": int(lag) if lag is not None else 0,
            "consumers": int(g.get("consumers") or 0),
        }

    async def lag(self) -> int:
        """Entries published but not yet delivered to the group (0 when the stream or group is missing):
        XINFO GROUPS's `lag`, or `entries-added - entries-read` when deletions made it nil."""
        g = await self._row()
        if g is None:
            return 0
        info = await self.redis.execute_command("XINFO", "STREAM", self.stream)
        fields = dict(zip(info[::2], info[1::2], strict=False))
        # entries deleted unread stay counted in entries-added (Redis's lag then never returns to 0):
        # nothing after the last delivered id is no lag, and the lag is at most the length
        if id_tuple(g.get("last-delivered-id")) >= id_tuple(fields.get(b"last-generated-id")):
            return 0
        if g.get("lag") is not None:
            lag = int(g["lag"])
        else:
            lag = int(fields.get(b"entries-added") or 0) - int(g.get("entries-read") or 0)
        return max(0, min(lag, int(fields.get(b"length") or 0)))

    async def pending_summary(self) -> dict:
        """XPENDING summary: {pending (a count), min and max (ids), consumers}."""
        return await self.redis.xpending(self.stream, self.group)

    async def retire_consumer(self, consumer: str) -> bool:
        """Remove `consumer` from the group unless it holds pending entries (XAUTOCLAIM hands those on);
        whether it was removed."""
        try:
            consumers = await self.redis.xinfo_consumers(self.stream, self.group)
        except ResponseError:
            return False
        for c in consumers:
            if as_text(c["name"]) == consumer and not int(c.get("pending") or 0):
                await self.redis.xgroup_delconsumer(self.stream, self.group, consumer)
                return True
        return False

    async def unprojected(self, *, limit: int) -> list[bytes]:
        """Payloads the group has not acked yet, at most `limit` of each kind: the oldest pending and the
        newest undelivered (the whole stream while the group does not exist). How a read tells "accepted,
        not yet projected" from "never seen" without a write on the ingest path."""
        g = await self._row()
        last: bytes | None = None
        if g is not None:
            value = g.get("last-delivered-id")
            last = value if isinstance(value, bytes) else str(value).encode()
        r, stream = self.redis, self.stream
        rows = [] if g is None else await r.xpending_range(stream, self.group, min="-", max="+", count=limit)
        async with r.pipeline(transaction=False) as pipe:
            for row in rows:
                pipe.xrange(stream, min=row["message_id"], max=row["message_id"], count=1)
            # an exclusive bytes id; the stale types-redis 4.6 stubs, where installed, take str ids only
            pipe.xrevrange(stream, max="+", min=b"(" + last if last else "-", count=limit)  # type: ignore[arg-type, unused-ignore]
            replies = await pipe.execute()
        return [fields[FIELD] for reply in replies for _, fields in reply if FIELD in fields]

    async def acked(self, ids: Sequence[str]) -> list[bool]:
        """For each entry id: delivered to the group (at or before its last delivered id) and no longer
        pending, i.e. acknowledged. False for all while the group does not exist."""
        g = await self._row()
        if g is None or not ids:
            return [False] * len(ids)
        last = id_tuple(g.get("last-delivered-id"))
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry in ids:
                pipe.xpending_range(self.stream, self.group, min=entry, max=entry, count=1)
            pending = await pipe.execute()
        return [id_tuple(entry) <= last and not rows for entry, rows in zip(ids, pending, strict=True)]


IDLE_BLOCK_MS = 100
"""How long an idle lane blocks on one partition (`Partitions.read_any`; several streams in one read are
CROSSSLOT on a cluster): the most entries on the others wait, for P + 1 reads per 100 ms."""


class Partitions:
    """The consumer group `group` on every partition stream of `streams`; a worker's turn works on one
    partition's `StreamGroup`, the reclaims (`next_for_reclaim`) and reads (`read_any`) rotating over
    them so that none is favoured."""

    def __init__(self, redis: aioredis.Redis, streams: Sequence[str], group: str):
        if not streams:
            raise ValueError("a partitioned group needs at least one stream")
        self.groups = [StreamGroup(redis, s, group) for s in streams]
        self._read_next = 0
        self._reclaim_next = 0

    async def ensure(self, start: str = "0") -> None:
        """`StreamGroup.ensure` on every partition (concurrently: a cluster spreads them over nodes)."""
        await asyncio.gather(*(g.ensure(start) for g in self.groups))

    def next_for_reclaim(self) -> StreamGroup:
        """The partition whose idle entries the next turn reclaims (round robin)."""
        group = self.groups[self._reclaim_next % len(self.groups)]
        self._reclaim_next = (self._reclaim_next + 1) % len(self.groups)
        return group

    async def read_any(self, consumer: str, *, count: int, block_ms: int) -> tuple[StreamGroup, list[Entry]]:
        """(group, up to `count` new entries of its partition): non-blocking reads from a rotating start,
        then, all empty, one read blocking min(`block_ms`, IDLE_BLOCK_MS) on the first."""
        if len(self.groups) == 1:
            return self.groups[0], await self.groups[0].read_new(consumer, count=count, block_ms=block_ms)
        start = self._read_next
        self._read_next = (start + 1) % len(self.groups)
        for k in range(len(self.groups)):
            group = self.groups[(start + k) % len(self.groups)]
            entries = await group.read_new(consumer, count=count, block_ms=None)
            if entries:
                return group, entries
        first = self.groups[start]
        return first, await first.read_new(consumer, count=count, block_ms=min(block_ms, IDLE_BLOCK_MS))

    async def each(self) -> list[dict[str, int]]:
        """`StreamGroup.info` of every partition, in partition order."""
        return list(await asyncio.gather(*(g.info() for g in self.groups)))

    async def lag(self) -> int:
        """`StreamGroup.lag` summed over the partitions (entries not yet delivered, a count)."""
        return sum(await asyncio.gather(*(g.lag() for g in self.groups)))

    async def retire_consumer(self, consumer: str) -> bool:
        """`StreamGroup.retire_consumer` on every partition; True if removed from any of them."""
        return any(await asyncio.gather(*(g.retire_consumer(consumer) for g in self.groups)))
