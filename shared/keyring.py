"""The data keys of one deployment in Redis: created race-free, cached, destroyed, re-wrapped
(docs/reliability.md, Keys). `shared.crypto` makes and wraps keys; this module stores them
(`Keys.data_key(ref)` = {k: key id, w: wrapped key, t: creation ms by Redis's clock}) and gives the
codec its key lookup. Publishers check in their XADD script (`streams.PUBLISH_LUA`) that each key
still has the id sealed with (first proposal wins); consumers cache keys `ttl` seconds (a key
destroyed elsewhere opens only events that predate the forget, which tombstones drop anyway).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from engram_episodic.errors import ConfigError, PublishError
from engram_episodic.events import (
    ActionRecorded,
    EpisodeCompleted,
    EpisodeStarted,
    EpisodeUpdated,
    Event,
    UserForgotten,
)
from shared import streams
from shared.codec import SEALED_FIELDS, encode, seal
from shared.crypto import DEPLOYMENT_SLOT, DataKey, Deployment, MasterKey, new_data_key, wrapped_master_id
from shared.keys import Keys

CREATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'k', ARGV[1], 'w', ARGV[2],
             't', t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000)))
end
return redis.call('HGET', KEYS[1], 'w')
"""
"""Create a key hash unless it exists (the deployment secret); returns the stored wrapped key."""

DESTROY_LUA = """
local key = redis.call('HMGET', KEYS[1], 't', 'k')
if key[1] and tonumber(key[1]) <= tonumber(ARGV[1]) then redis.call('DEL', KEYS[1]) return key[2] end
return false
"""
"""Delete a data key created no later than ARGV[1] (ms) and return its id: a forget shreds what its user
had, never the key of activity that began after it."""

REWRAP_LUA = """
if redis.call('HGET', KEYS[1], 'w') == ARGV[1] then redis.call('HSET', KEYS[1], 'w', ARGV[2]) return 1 end
return 0
"""

MAX_KEY_ATTEMPTS = 6
EPISODE_USERS = 100_000
"""Episodes whose user this process remembers, so that its ActionRecorded events (which carry no
user_id) are sealed with the user's key, as the EpisodeStarted before them was."""


class KeyRing:
    """The keys of one deployment as one process holds them; `ttl` (seconds) bounds how long a
    cached key is trusted without asking Redis again."""

    def __init__(self, keys: Keys, master: MasterKey, *, ttl: float = 30.0):
        self.keys = keys
        self.master = master
        self.ttl = ttl
        self.deployment: Deployment | None = None
        self._known: dict[bytes, tuple[DataKey, float]] = {}
        self._gone: OrderedDict[tuple[bytes, bytes], None] = OrderedDict()
        self._episode_users: OrderedDict[tuple[str, str], str | None] = OrderedDict()

    @classmethod
    def from_settings(cls, settings) -> KeyRing | None:
        """A ring for `settings.master_key`, or None when encryption is off (no master key)."""
        if settings.master_key is None:
            return None
        return cls(settings.keys, MasterKey(settings.master_key))

    # --- the deployment secret --------------------------------------------------------------------
    async def load(self, redis: aioredis.Redis) -> Deployment:
        """The deployment (its reference key), creating its secret on first use. MasterKeyMismatch
        when the stored secret was wrapped by another master key."""
        if self.deployment is None:
            if self.keys.partitions == 1 and isinstance(redis, RedisCluster):
                # the one stream and the data keys would be in different slots: CROSSSLOT
                raise ConfigError(
                    f"a master key on a Redis Cluster needs stream partitions (ENGRAM_PREFIX={self.keys.prefix!r} "
                    "has one stream): docs/scaling.md, Ingest partitions"
                )
            if self.keys.partitions > 1:
                # markers first: no plaintext publish can follow a sealed one (`Keys.encrypted_marker`)
                async with redis.pipeline(transaction=False) as pipe:
                    for i in range(self.keys.partitions):
                        pipe.set(self.keys.encrypted_marker(i), "1")
                    await pipe.execute()
            _kid, secret = await self._create(redis, self.keys.deployment_key, DEPLOYMENT_SLOT)
            self.deployment = Deployment(secret)
        return self.deployment

    async def _create(self, redis: aioredis.Redis, name: str, slot: bytes) -> tuple[bytes, bytes]:
        """(kid, key) of the wrapped key of `slot` stored at `name`, created (race-free) unless it exists."""
        kid, key = new_data_key()
        stored = await redis.register_script(CREATE_LUA)(
            keys=[name], args=[kid, self.master.wrap(slot, kid, key)]
        )
        return self.master.unwrap(slot, stored)

    def ref(self, namespace: str, user_id: str | None) -> bytes:
        assert self.deployment is not None, "load() first"
        return self.deployment.ref(namespace, user_id)

    # --- publishing ------------------------------------------------------------------------------
    def _user_for(self, event: Event) -> str | None:
        if isinstance(event, EpisodeStarted | EpisodeCompleted):
            ident = (event.namespace, event.episode_id)
            self._episode_users[ident] = event.episode.user_id
            self._episode_users.move_to_end(ident)
            if len(self._episode_users) > EPISODE_USERS:
                self._episode_users.popitem(last=False)
            return event.episode.user_id
        if isinstance(event, ActionRecorded):
            return self._episode_users.get((event.namespace, event.episode_id))
        if isinstance(event, EpisodeUpdated):
            return event.user_id
        return None

    async def publish(self, redis: aioredis.Redis, stream: str, events: Sequence[Event]) -> list[bytes]:
        """Seal and XADD `events` atomically (all or none) with the key checks of the module docstring;
        their stream ids. A failed check (another publisher's key won, or the key was destroyed) is resolved
        and the call sealed again, at most MAX_KEY_ATTEMPTS times (then PublishError)."""
        deployment = await self.load(redis)
        users = [self._user_for(e) for e in events]
        fresh: dict[bytes, tuple[DataKey, bytes]] = {}
        for _attempt in range(MAX_KEY_ATTEMPTS):
            used: dict[bytes, tuple[DataKey, bytes]] = {}
            namespaces: dict[bytes, str] = {}  # a ref is an HMAC of (namespace, user): one namespace
            payloads: list[bytes] = []
            destroy: list[tuple[bytes, str]] = []
            for event, user in zip(events, users, strict=True):
                if event.TYPE not in SEALED_FIELDS:
                    payloads.append(encode(event))
                    continue
                ref = deployment.ref(event.namespace, user)
                namespaces[ref] = event.namespace
                if ref not in used:
                    known = self._known.get(ref)
                    if known is not None:
                        used[ref] = (known[0], b"")
                    else:
                        if ref not in fresh:
                            kid, key = new_data_key()
                            fresh[ref] = (DataKey.from_bytes(kid, key), self.master.wrap(ref, kid, key))
                        used[ref] = fresh[ref]
                payloads.append(seal(event, ref, used[ref][0]))
                if isinstance(event, UserForgotten):
                    gone = deployment.ref(event.namespace, event.user_id)
                    destroy.append((gone, self.keys.data_key(gone, event.namespace)))
            refs = list(used)
            reply = await streams.publish_sealed(
                redis,
                stream,
                payloads,
                [(self.keys.data_key(ref, namespaces[ref]), used[ref][0].kid, used[ref][1]) for ref in refs],
                [key for _, key in destroy],
            )
            if int(reply[0]) == 1:
                now = time.monotonic()
                for ref in refs:
                    self._known[ref] = (used[ref][0], now)
                    fresh.pop(ref, None)
                for gone, _ in destroy:
                    self.forget(gone)
                return reply[1:]
            ref, stored = refs[int(reply[1]) - 1], reply[2]
            self._known.pop(ref, None)
            if stored:  # another publisher's key won (or the key was re-created): seal with it
                self._known[ref] = (self.master.open_key(ref, stored), time.monotonic())
                fresh.pop(ref, None)
            # else: the key was destroyed: the next attempt proposes a fresh one
        raise PublishError(
            f"the data keys of {len(events)} event(s) kept changing during {MAX_KEY_ATTEMPTS} "
            "attempts (concurrent forgets?); nothing was published"
        )

    async def key_for(self, redis: aioredis.Redis, ref: bytes, namespace: str) -> DataKey:
        """The live data key of `ref` (of a user of `namespace`), created (race-free) if it does not
        exist, outside the publish script: a namespace's own key (`live_keys`)."""
        known = self._known.get(ref)
        if known is not None and time.monotonic() - known[1] <= self.ttl:
            return known[0]
        opened = DataKey.from_bytes(*await self._create(redis, self.keys.data_key(ref, namespace), ref))
        self._known[ref] = (opened, time.monotonic())
        return opened

    async def live_keys(
        self, redis: aioredis.Redis, namespace: str, users: Iterable[str | None]
    ) -> dict[str | None, DataKey]:
        """The live data key of each of `users` of `namespace` (None: the namespace's own, created if
        missing); a user whose key is gone is left out, never re-created (that would outlive its forget)."""
        deployment = await self.load(redis)
        users = set(users)
        wanted = sorted(u for u in users if u is not None)
        out: dict[str | None, DataKey] = {}
        if None in users:
            ref = deployment.ref(namespace, None)
            out[None] = await self.key_for(redis, ref, namespace)
        if wanted:
            async with redis.pipeline(transaction=False) as pipe:
                for user in wanted:
                    pipe.hget(self.keys.data_key(deployment.ref(namespace, user), namespace), "w")
                stored = await pipe.execute()
            for user, blob in zip(wanted, stored, strict=True):
                if blob is not None:
                    out[user] = self.master.open_key(deployment.ref(namespace, user), blob)
        return out

    # --- consuming -------------------------------------------------------------------------------
    async def prefetch(self, redis: aioredis.Redis, wanted: Iterable[tuple[bytes, bytes, str]]) -> None:
        """Make `lookup` answer for every (ref, kid, namespace) in `wanted`: one pipeline for those not
        cached (the namespace names the data key's partition, `Keys.data_key`)."""
        now = time.monotonic()
        need: dict[bytes, str] = {}
        for ref, kid, namespace in wanted:
            if (ref, kid) in self._gone or ref in need:
                continue
            known = self._known.get(ref)
            if known is None or known[0].kid != kid or now - known[1] > self.ttl:
                need[ref] = namespace
        if not need:
            return
        if self.deployment is None:
            await self.load(redis)
        async with redis.pipeline(transaction=False) as pipe:
            for ref, namespace in need.items():
                pipe.hget(self.keys.data_key(ref, namespace), "w")
            stored = await pipe.execute()
        now = time.monotonic()
        for ref, blob in zip(need, stored, strict=True):
            if blob is None:
                self._known.pop(ref, None)
                continue
            self._known[ref] = (self.master.open_key(ref, blob), now)

    def lookup(self, ref: bytes, kid: bytes) -> DataKey | None:
        """The data key (ref, kid) after `prefetch`; None when it was destroyed (remembered as gone)."""
        known = self._known.get(ref)
        if known is not None and known[0].kid == kid:
            return known[0]
        self._gone[(ref, kid)] = None
        if len(self._gone) > 100_000:
            self._gone.popitem(last=False)
        return None

    def forget(self, ref: bytes) -> None:
        """Drop a destroyed key from this process's memory."""
        known = self._known.pop(ref, None)
        if known is not None:
            self._gone[(ref, known[0].kid)] = None

    async def destroy_user(self, redis: aioredis.Redis, namespace: str, user_id: str, before: float) -> bool:
        """Delete the data key of (namespace, user_id) if created no later than `before` (epoch
        seconds); True if deleted. Covers forgets not published through the SDK (which deletes it itself)."""
        ref = (await self.load(redis)).ref(namespace, user_id)
        kid = await redis.register_script(DESTROY_LUA)(
            keys=[self.keys.data_key(ref, namespace)], args=[int(before * 1000)]
        )
        if kid is None:
            return False
        known = self._known.get(ref)
        if known is not None and known[0].kid == kid:
            self.forget(ref)
        self._gone[(ref, kid)] = None
        return True

    # --- rotation --------------------------------------------------------------------------------
    async def rotate(self, redis: aioredis.Redis, new: MasterKey) -> dict[str, int]:
        """Re-wrap the deployment secret and every data key from this ring's master key to `new`
        (same key ids). Keys already under `new` are counted, one under a third key is MasterKeyMismatch;
        passes repeat until one finds nothing left (keys created meanwhile)."""
        counts = {"rewrapped": 0, "already": 0, "vanished": 0}
        rewrap = redis.register_script(REWRAP_LUA)
        for _pass in range(10):
            moved = 0
            names = [self.keys.deployment_key]
            async for name in redis.scan_iter(match=f"{self.keys.data_key_prefix}*", count=1000):
                names.append(name.decode() if isinstance(name, bytes) else name)
            for name in names:
                blob = cast(bytes | None, await redis.hget(name, "w"))  # bytes replies (shared.redis_conn)
                if blob is None:
                    counts["vanished"] += 1
                    continue
                if wrapped_master_id(blob) == new.id:
                    counts["already"] += 1 if _pass == 0 else 0
                    continue
                slot = DEPLOYMENT_SLOT if name == self.keys.deployment_key else self.keys.data_key_ref(name)
                kid, key = self.master.unwrap(slot, blob)
                if await rewrap(keys=[name], args=[blob, new.wrap(slot, kid, key)]):
                    counts["rewrapped"] += 1
                    moved += 1
            if not moved:
                break
        return counts


_RINGS: dict[tuple[Keys, bytes], KeyRing] = {}


def shared_ring(keys: Keys, master_key: bytes) -> KeyRing:
    """The process's one KeyRing of (prefix, master key), so per-request publishers share its cache."""
    ring = _RINGS.get((keys, master_key))
    if ring is None:
        if len(_RINGS) > 64:  # tests make one deployment per test
            _RINGS.clear()
        ring = _RINGS[(keys, master_key)] = KeyRing(keys, MasterKey(master_key))
    return ring


async def deployment_tag_key(redis: aioredis.Redis, keys: Keys, master_key: bytes | None) -> bytes | None:
    """The key of the TAG fields' digests of ids (`shared.tags`): derived from the deployment secret,
    so None without a master key (digests are then unkeyed). MasterKeyMismatch as in `KeyRing.load`."""
    if master_key is None:
        return None
    return (await shared_ring(keys, master_key).load(redis)).tag_key
