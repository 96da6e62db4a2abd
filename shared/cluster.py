"""Search commands on a Redis Cluster: where each `FT.*` command goes (docs/scaling.md, Search: two
paths). `coordinator` passes them unchanged; `shard` gives each namespace its own index on its primary
(`shard_name`), made from the FT.CREATE recorded in meta (`ftcreate:`), aliases in meta (`ftalias:`),
waiting after a slot move for the new owner's index (`settle`) and dropping the copy left behind
(`drop_stale`). The namespace of a search is a context variable (`route`, `set_route`). Only redis-py's
public API is used (tests/unit/test_cluster_routing.py scans this module).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
import time
from collections.abc import Awaitable, Iterable, Iterator
from typing import Any, cast

import msgpack
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engram_episodic.errors import ConfigError
from shared.keys import ns_tag
from shared.retry import Backoff

SEARCH_SHARD = "shard"
SEARCH_COORDINATOR = "coordinator"
TEMPLATE = "ftcreate:"
"""Meta-hash field prefix: `ftcreate:<index>` holds the msgpack of its FT.CREATE arguments."""
ALIAS = "ftalias:"
"""Meta-hash field prefix: `ftalias:<alias>` names the index the alias points at."""
ALIAS_TTL = 1.0
"""Seconds an alias is cached: a replay's swap reaches a running process within this."""
SHARD = "ftshard:"
"""Meta-hash field prefix: `ftshard:<namespace's index>` names the node (host:port) it was created on."""
SETTLE_TIMEOUT = 10.0
"""Seconds a search waits for a namespace's index its node is still building after a slot move,
before `IndexBuilding`."""

log = logging.getLogger("engram.cluster")


class IndexBuilding(RedisTimeoutError):
    """A namespace's index is still indexing documents a slot move brought; retry. A redis-py
    TimeoutError, so the query service answers 503 with Retry-After and the consolidator retries."""


_ROUTE: contextvars.ContextVar[str | None] = contextvars.ContextVar("engram_search_route", default=None)
_SHARD = re.compile(r":\{[0-9a-f]{12}\}$")


PASS, LIST, RECORD, DROP, ALIAS_SET, ALIAS_DEL, EXISTS, ROUTED, CURSOR, UNROUTED = (
    "pass list record drop alias-set alias-del exists routed cursor unrouted".split()
)


def decide(search: str, command: str, namespace: str | None, *, targeted: bool = False) -> str:
    """What `EngramCluster` does with `command` (upper case): `PASS` it unchanged (coordinator mode, a
    non-search command, one sent to chosen nodes), or shard-local: `LIST`, `RECORD` an FT.CREATE, `DROP`
    every namespace's copy, set or delete an alias, `EXISTS` (FT.INFO / FT.EXPLAIN without a namespace),
    `ROUTED` / `CURSOR` to the namespace's index, or `UNROUTED` (no namespace: RuntimeError)."""
    if search != SEARCH_SHARD or not command.startswith("FT.") or targeted:
        return PASS
    fixed = {
        "FT._LIST": LIST,
        "FT.CREATE": RECORD,
        "FT.DROPINDEX": DROP,
        "FT.ALIASADD": ALIAS_SET,
        "FT.ALIASUPDATE": ALIAS_SET,
        "FT.ALIASDEL": ALIAS_DEL,
    }
    if command in fixed:
        return fixed[command]
    if namespace is None:
        return EXISTS if command in ("FT.INFO", "FT.EXPLAIN") else UNROUTED
    return CURSOR if command == "FT.CURSOR" else ROUTED


@contextlib.contextmanager
def route(namespace: str) -> Iterator[None]:
    """Within the block, search commands are for `namespace` (its index, on its primary)."""
    token = _ROUTE.set(namespace)
    try:
        yield
    finally:
        _ROUTE.reset(token)


def set_route(namespace: str) -> None:
    """`route` for the rest of the current task (an HTTP request's handler)."""
    _ROUTE.set(namespace)


def shard_name(index: str, namespace: str) -> str:
    """The name of `index` for `namespace` on a shard-local cluster (a key of the namespace's slot)."""
    return f"{index}:{ns_tag(namespace)}"


def is_missing_index(exc: ResponseError) -> bool:
    """Whether RediSearch refused a command because the index does not exist (2.x and 8.x wordings)."""
    return any(phrase in str(exc).lower() for phrase in ("unknown index name", "no such index"))


async def unless_missing(call: Awaitable[Any]) -> Any:
    """The reply of `call`, a search command, or None when its index does not exist (other
    ResponseErrors propagate)."""
    try:
        return await call
    except ResponseError as exc:
        if is_missing_index(exc):
            return None
        raise


def _indexing(info: Any) -> bool:
    """Whether an `FT.INFO` reply (RESP2 flat list or RESP3 map) says a background scan is running."""
    fields = info if isinstance(info, dict) else dict(zip(info[::2], info[1::2], strict=False))
    value = fields.get(b"indexing", fields.get("indexing", 0))
    return _text(value) not in {"0", "0.0"}


def _stream(args: tuple) -> Any:
    """The first stream key of `XREADGROUP GROUP <group> <consumer> [options] STREAMS <key> ...`, or None."""
    words = [_text(a).upper() if isinstance(a, str | bytes) else "" for a in args[4:-1]]
    return args[4 + words.index("STREAMS") + 1] if "STREAMS" in words else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class EngramCluster(RedisCluster):
    """redis-py's asyncio `RedisCluster` routing `FT.*` commands as the module docstring says and
    each XREADGROUP straight to its stream's primary. `search`: `shard` or `coordinator`; `meta`: the
    deployment's meta-hash key."""

    search: str = SEARCH_SHARD
    meta: str = "engram:meta"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """redis-py's (the same arguments), with Engram's caches empty."""
        self._scripts: dict[str, str] = {}  # sha -> source of every registered script
        self._loaded: set[str] = set()  # shas loaded on every primary
        self._aliases: dict[str, tuple[float, str]] = {}  # alias -> (monotonic time read, index)
        self._exists: dict[str, str] = {}  # namespace's index -> node it is known to exist on
        self._complete: dict[str, str] = {}  # namespace's index -> node it was seen fully indexed on
        super().__init__(*args, **kwargs)

    # --- scripts -------------------------------------------------------------------------------
    def register_script(self, script: Any) -> Any:
        """redis-py's, remembering the script so a pipeline can load it on every primary first."""
        registered = super().register_script(script)
        self._scripts[registered.sha] = _text(registered.script)
        return registered

    async def load_scripts(self, *, again: bool = False) -> None:
        """SCRIPT LOAD every registered script on every primary (`again`: even those loaded
        before, after a NOSCRIPT from a promoted replica)."""
        if again:
            self._loaded.clear()
        for sha, source in list(self._scripts.items()):
            if sha not in self._loaded:
                await self.script_load(source)
                self._loaded.add(sha)

    # --- health --------------------------------------------------------------------------------
    async def ping(self, **kwargs: Any) -> bool:
        """Whether every primary says `cluster_state:ok` (not one node's PING); raises ConnectionError or
        TimeoutError when one cannot be reached. With options (`target_nodes`), redis-py's PING."""
        if kwargs:
            return await super().ping(**kwargs)
        await self.initialize()  # the slot map, on a client's first command
        for node in self.get_primaries():
            info = await super().execute_command("CLUSTER", "INFO", target_nodes=node)
            if "cluster_state:ok" not in _text(info):
                return False
        return True

    # --- search --------------------------------------------------------------------------------
    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        command = _text(args[0]).upper() if args else ""
        how = decide(self.search, command, _ROUTE.get(), targeted="target_nodes" in kwargs)
        if how == PASS:
            stream = _stream(args) if command == "XREADGROUP" and "target_nodes" not in kwargs else None
            if stream is not None:  # movable keys: redis-py would ask a node (COMMAND GETKEYS) each call
                return await self._keyed(stream, args, kwargs)
            return await super().execute_command(*args, **kwargs)
        if how == LIST:
            fields = await super().execute_command("HKEYS", self.meta)
            return sorted(f[len(TEMPLATE) :].encode() for f in map(_text, fields) if f.startswith(TEMPLATE))
        if how == CURSOR:  # to the node of the namespace's index, where its FT.AGGREGATE left the cursor
            shard = shard_name(await self.resolve(_text(args[2])), cast(str, _ROUTE.get()))
            return await super().execute_command(
                *args[:2], shard, *args[3:], target_nodes=self._owner(shard), **kwargs
            )
        name = _text(args[1])
        if how == RECORD:
            if not await super().execute_command(
                "HSETNX", self.meta, TEMPLATE + name, msgpack.packb(args[2:])
            ):
                raise ResponseError("Index already exists")
            return b"OK"
        if how == DROP:
            return await self._drop(name, args[2:])
        if how in (ALIAS_SET, ALIAS_DEL):
            change = ("HSET", _text(args[2])) if how == ALIAS_SET else ("HDEL",)
            await super().execute_command(change[0], self.meta, ALIAS + name, *change[1:])
            self._aliases = {}  # a new cache, swapped in: a resolve awaiting its read writes to the old one
            return b"OK"
        index = await self.resolve(name)
        try:
            return await self._resolved(how, command, index, args[2:], kwargs)
        except ResponseError as exc:
            # a replay moved the alias and dropped the index this client still had it name (ALIAS_TTL)
            if index == name or not is_missing_index(exc):
                raise
            self._aliases.pop(name, None)
            fresh = await self.resolve(name)
            if fresh == index:
                raise
            return await self._resolved(how, command, fresh, args[2:], kwargs)

    async def _resolved(self, how: str, command: str, index: str, rest: tuple, kwargs: dict) -> Any:
        """`command` on `index` (an alias resolved): EXISTS from the record; else on the namespace's
        index on the node owning its slot, once `settle`d, again (up to 3 times) if the slot moved."""
        namespace = _ROUTE.get()
        if how == EXISTS:  # "does the index exist?" (every namespace's is made from it)
            if await super().execute_command("HEXISTS", self.meta, TEMPLATE + index):
                return []
            raise ResponseError(f"Unknown index name {index}")
        if namespace is None:  # how == UNROUTED
            raise RuntimeError(
                f"{command} on a shard-local cluster needs its namespace (shared.cluster.route)"
            )
        shard = shard_name(index, namespace)
        for _ in range(3):
            node = await self.settle(index, namespace)
            try:
                reply = await super().execute_command(command, shard, *rest, target_nodes=node, **kwargs)
            except ResponseError as exc:
                if not is_missing_index(exc):
                    raise
                self._forget(shard)  # dropped, or MOVED to a node without it: settle again
                continue
            if self._owner(shard).name == node.name:
                return reply
            self._forget(shard)
        raise IndexBuilding(f"{shard} kept moving between nodes; retry")

    async def _keyed(self, key: Any, args: tuple, kwargs: dict) -> Any:
        """`args` sent to the primary owning `key`'s slot, retried as redis-py retries a command it
        routes (connection fault, timeout, CLUSTERDOWN, uncovered slot)."""
        backoff = Backoff(ExponentialBackoff(cap=2.0, base=0.05))  # shared.redis_conn's policy
        while True:
            await self.initialize()  # the refresh the last fault asked for, once due; else nothing
            try:
                return await super().execute_command(*args, target_nodes=self._owner(key), **kwargs)
            except self.ERRORS_ALLOW_RETRY as exc:
                delay = backoff.next()
                # exact types, as redis-py: not AuthenticationError, IndexBuilding, ...
                if backoff.failures > self.retry.get_retries() or type(exc) not in self.ERRORS_ALLOW_RETRY:
                    raise
                await asyncio.sleep(delay)

    def _owner(self, name: Any) -> Any:
        """The primary owning `name`'s slot; SlotNotCoveredError when none covers it."""
        return self.get_node_from_key(name)

    def _forget(self, shard: str) -> None:
        self._exists.pop(shard, None)
        self._complete.pop(shard, None)

    async def settle(self, index: str, namespace: str, *, complete: bool = True) -> Any:
        """The node owning `namespace`'s index of `index` once it exists there (created from the
        record if missing) and, with `complete`, has indexed every document (`FT.INFO` `indexing` 0); cached
        per node. Raises ResponseError when `index` was never created, IndexBuilding after `SETTLE_TIMEOUT`."""
        shard = shard_name(index, namespace)
        known = self._complete if complete else self._exists
        node = self._owner(shard)
        if known.get(shard) == node.name:
            return node
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            node = self._owner(shard)
            try:
                info = await super().execute_command("FT.INFO", shard, target_nodes=node)
            except ResponseError as exc:
                if not is_missing_index(exc) or not await self.create_shard(index, namespace):
                    raise
                info = None  # created: ask again (the create may have gone to a new owner)
            if info is not None and self._owner(shard).name == node.name:  # else MOVED while asking
                self._exists[shard] = node.name
                if not _indexing(info):
                    self._complete[shard] = node.name
                    return node
                if not complete:
                    return node
            if time.monotonic() > deadline:
                raise IndexBuilding(f"{shard} on {node.name} is not ready (a slot move in progress); retry")
            if info is not None:  # the module has no notification of a finished scan: poll it
                await asyncio.sleep(0.05)

    async def resolve(self, name: str) -> str:
        """The index `name` names: itself, or the alias's index (cached `ALIAS_TTL`). An alias
        change swaps in a new cache, so an answer read before it lands in the discarded one."""
        now = time.monotonic()
        aliases = self._aliases  # this read's cache: an alias change swaps in a new one
        cached = aliases.get(name)
        if cached is not None and now - cached[0] < ALIAS_TTL:
            return cached[1]
        target = await super().execute_command("HGET", self.meta, ALIAS + name)
        index = _text(target) if target is not None else name
        aliases[name] = (now, index)
        return index

    async def create_shard(self, index: str, namespace: str) -> bool:
        """Create `namespace`'s index of `index` on its primary from the record, prefixes narrowed
        to the namespace's keys, and drop the copy a slot move left on the node recorded before; False when
        `index` was never created."""
        raw = await super().execute_command("HGET", self.meta, TEMPLATE + index)
        if raw is None:
            return False
        args = list(msgpack.unpackb(raw))
        tag = ns_tag(namespace)
        at = [_text(a).upper() for a in args].index("PREFIX")
        for i in range(at + 2, at + 2 + int(args[at + 1])):
            args[i] = f"{_text(args[i])}{tag}:"
        shard = shard_name(index, namespace)
        node = self._owner(shard)
        try:
            await super().execute_command("FT.CREATE", shard, *args, target_nodes=node)
        except ResponseError as exc:
            if "already exists" not in str(exc).lower():
                raise
        node = self._owner(shard)  # where it went, had the create been MOVED
        before = await super().execute_command("HGET", self.meta, SHARD + shard)
        await super().execute_command("HSET", self.meta, SHARD + shard, node.name)
        if before is not None and _text(before) != node.name:
            old = self.get_node(node_name=_text(before))
            if old is not None and old in self.get_primaries():
                await self.drop_stale(old, shard)
        return True

    async def _listed(self, index: str) -> list[tuple[str, Any, bool]]:
        """(namespace's index of `index`, the primary listing it, whether that primary owns its slot)."""
        found = []
        for node in self.get_primaries():
            for name in map(_text, await super().execute_command("FT._LIST", target_nodes=node)):
                if name != index and _SHARD.sub("", name) == index:  # a shard_name of `index`
                    found.append((name, node, self._owner(name).name == node.name))
        return found

    async def drop_stale(self, node: Any, name: str) -> bool:
        """Drop the index `name` left on `node`, a primary no longer owning its slot, as
        `redis-cli --cluster fix` does: `SETSLOT <slot> IMPORTING`, `ASKING` + `FT.DROPINDEX` on one
        connection, `SETSLOT <slot> STABLE`. False when skipped: `node` importing or migrating that slot,
        owning it again, or the ACL refusing `CLUSTER` (logged)."""
        slot = self.keyslot(name)
        owner = self._owner(name)
        if owner.name == node.name:
            return False
        try:
            for line in _text(await node.execute_command("CLUSTER", "NODES")).splitlines():
                fields = line.split()
                if "myself" in fields[2] and any(f.startswith(f"[{slot}-") for f in fields[8:]):
                    return False
            owner_id = _text(await owner.execute_command("CLUSTER", "MYID"))
            await node.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", owner_id)
        except ResponseError as exc:
            log.warning("stale index %s left on %s ◆ %s", name, node.name, exc)
            return False
        connection = node.acquire_connection()
        replies: list[Any] = []
        try:
            await connection.send_packed_command(
                connection.pack_commands([("ASKING",), ("FT.DROPINDEX", name)])
            )
            for _ in range(2):  # both, so that no reply is left for the connection's next user
                try:
                    replies.append(await connection.read_response())
                except ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            await connection.disconnect()  # replies may be in flight on it
            raise
        finally:
            node.release(connection)
            await node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        dropped = not isinstance(replies[-1], Exception)
        if dropped:
            log.info("dropped stale index %s on %s (its slot %d is on %s)", name, node.name, slot, owner.name)
        elif not is_missing_index(replies[-1]):
            log.warning("stale index %s left on %s ◆ %s", name, node.name, replies[-1])
        return dropped

    async def _drop(self, index: str, options: tuple) -> Any:
        had = await super().execute_command("HDEL", self.meta, TEMPLATE + index)
        await self.nodes_manager.initialize()  # every primary, a node that joined since the last MOVED too
        for name, node, owned in await self._listed(index):
            if not owned:
                await self.drop_stale(node, name)  # a copy its slot left behind (a DROPINDEX is MOVED)
            else:
                await unless_missing(
                    super().execute_command("FT.DROPINDEX", name, *options, target_nodes=node)
                )

            await super().execute_command("HDEL", self.meta, SHARD + name)
            self._forget(name)
        if not had:
            raise ResponseError(f"Unknown index name {index}")
        return b"OK"

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        return EngramClusterPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py's own


class EngramClusterPipeline(ClusterPipeline):
    """A cluster pipeline that loads Engram's scripts on every primary before it runs (redis-py
    queues their EVALSHA by its keys' slot); its search commands run one by one through `EngramCluster`
    (mixed with key commands: RuntimeError)."""

    _searches: list[tuple[tuple, dict]] | None = None
    _others = 0

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        command = _text(args[0]).upper() if args else ""
        if decide(cast(EngramCluster, self.cluster_client).search, command, None) != PASS:
            if self._searches is None:
                self._searches = []
            self._searches.append((args, kwargs))
            return self
        self._others += 1
        return super().execute_command(*args, **kwargs)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        client = cast(EngramCluster, self.cluster_client)  # made by EngramCluster.pipeline only
        searches, self._searches = self._searches, None
        if searches:
            others, self._others = self._others, 0
            await self.reset()
            if others:
                raise RuntimeError("a shard-local cluster pipeline cannot mix search and key commands")
            return [await client.execute_command(*args, **kwargs) for args, kwargs in searches]
        self._others = 0
        await client.load_scripts()
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except NoScriptError:
            await client.load_scripts(again=True)  # the caller's retry finds them
            raise


async def ensure_shards(redis: aioredis.Redis, indexes: Iterable[str], namespaces: Iterable[str]) -> None:
    """On a shard-local cluster, every namespace's index of every index in `indexes` exists on its owner
    (created where missing), without waiting for it to finish indexing; nothing on any other client."""
    if isinstance(redis, EngramCluster) and redis.search == SEARCH_SHARD:
        for index in indexes:
            for namespace in namespaces:
                await redis.settle(index, namespace, complete=False)


async def search_targets(redis: aioredis.Redis, name: str) -> list[tuple[str, dict[str, Any]]]:
    """Where a search over every namespace of `name` (an index or alias) goes: [(index, `execute_command`
    keyword arguments)]; `name` itself except on a shard-local cluster, where each namespace's index with
    `target_nodes` its primary (copies a slot move left behind are skipped)."""
    if isinstance(redis, EngramCluster) and redis.search == SEARCH_SHARD:
        listed = await redis._listed(await redis.resolve(name))
        return [(shard, {"target_nodes": node}) for shard, node, owned in listed if owned]
    return [(name, {})]


COORDINATOR_VERSION = 80000
"""`MODULE LIST` `ver` (major*10000 + minor*100 + patch) from which search has a coordinator (8.0)."""


async def check_search(redis: aioredis.Redis) -> None:
    """ConfigError naming `ENGRAM_CLUSTER_SEARCH` when it is `coordinator` on a cluster whose search
    module has none (the alias update would be CROSSSLOT); nothing when `MODULE LIST` is refused, on any
    other client or mode."""
    if not isinstance(redis, EngramCluster) or redis.search != SEARCH_COORDINATOR:
        return
    try:
        modules = await redis.execute_command("MODULE", "LIST", target_nodes=RedisCluster.RANDOM)
    except ResponseError:
        return  # MODULE refused (ACL, a managed service): trust the setting
    for module in modules:
        fields = module if isinstance(module, dict) else dict(zip(module[::2], module[1::2], strict=False))
        info = {_text(k): v for k, v in fields.items()}
        if (
            _text(info.get("name", "")).lower() in ("search", "ft")
            and int(info.get("ver", 0)) < COORDINATOR_VERSION
        ):
            raise ConfigError(
                f"ENGRAM_CLUSTER_SEARCH=coordinator, but this cluster's search module (version "
                f"{int(info['ver'])}) has no coordinator (Redis 8's Query Engine has one): set "
                f"ENGRAM_CLUSTER_SEARCH=shard (docs/scaling.md, Running on a cluster)"
            )
