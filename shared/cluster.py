"""Search commands on a Redis Cluster: where each `FT.*` command goes.

Keys are cluster-ready (`shared.keys`: every key of a namespace shares its hash tag, so one primary
holds a namespace whole), and redis-py's `RedisCluster` routes every key command by its slot. The
search commands are the exception, and two deployments answer them differently
(`ENGRAM_CLUSTER_SEARCH`):

- `shard` (the embedded RediSearch 2.10, and any search module without a coordinator). Measured
  (tests/integration/test_cluster.py, test_cluster_stack.py): an index name is treated as a key
  (`MOVED` elsewhere); an index sees only its own node's documents; and a search loads the fields of
  only the documents in the *index name's* slot (the others come back as keys without fields: no
  `doc`, no KNN distance). So each namespace gets its own index on its primary, named with the
  namespace's hash tag (`shard_name`: `<index>:{<tag>}`, over the prefixes `<prefix>{<tag>}:`): its
  documents share its slot, every field loads, and the query goes to the one node that answers it
  whole. `FT.CREATE` only records the index's arguments in the meta hash (`ftcreate:<index>`); a
  namespace's index is created from them before the first document of the namespace is written
  (`ensure_shards`), and again on a node that lacks it (a slot migrated there: documents already there
  are indexed in the background). Aliases are resolved here (`ftalias:<alias>` in the meta hash,
  cached for a second), `FT.DROPINDEX` drops every namespace's index, and `FT._LIST` names the
  recorded indexes.
- `coordinator` (Redis 8's Query Engine in cluster mode): `FT.CREATE` is distributed and `FT.SEARCH`
  fans out and merges on whichever node receives it, so the commands pass through unchanged. This is
  what production on Redis 8 uses; the embedded module here has no coordinator, so this path is not
  tested on this machine.

The namespace a search is for is a context variable (`route`, `set_route`): the query service sets it
per request (auth), the consolidator around the work it does for one namespace.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from shared.keys import ns_tag

SEARCH_SHARD = "shard"
SEARCH_COORDINATOR = "coordinator"
TEMPLATE = "ftcreate:"
"""Meta-hash field prefix: `ftcreate:<index>` holds the msgpack of that index's FT.CREATE arguments."""
ALIAS = "ftalias:"
"""Meta-hash field prefix: `ftalias:<alias>` names the index the alias points at."""
ALIAS_TTL = 1.0
"""Seconds an alias is cached: a replay's swap reaches a running process within this."""

_ROUTE: contextvars.ContextVar[str | None] = contextvars.ContextVar("engram_search_route", default=None)
_SHARD = re.compile(r":\{[0-9a-f]{12}\}$")


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


def base_name(name: str) -> str:
    """The index a `shard_name` is of."""
    return _SHARD.sub("", name)


def _missing(exc: ResponseError) -> bool:
    return any(phrase in str(exc).lower() for phrase in ("unknown index name", "no such index"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class EngramCluster(RedisCluster):
    """redis-py's asyncio `RedisCluster` that routes `FT.*` commands as the module docstring says.

    `search` is `shard` or `coordinator`; `meta` is the deployment's meta-hash key (where index
    arguments and aliases are recorded). Other commands are redis-py's own.
    """

    search: str = SEARCH_SHARD
    meta: str = "engram:meta"
    _scripts: dict[str, str] | None = None  # sha -> source of every registered script
    _loaded: set[str] | None = None  # shas loaded on every primary
    _aliases: dict[str, tuple[float, str]] | None = None  # alias -> (monotonic time read, index)
    _ensured: set[tuple[str, str]] | None = None  # (index, namespace) known to exist

    # --- scripts -------------------------------------------------------------------------------
    def register_script(self, script: Any) -> Any:
        """redis-py's, remembering the script so that a pipeline can load it on every primary first
        (a script call queued in a cluster pipeline cannot load itself on NOSCRIPT)."""
        registered = super().register_script(script)
        if self._scripts is None:
            self._scripts, self._loaded = {}, set()
        self._scripts[registered.sha] = _text(registered.script)
        return registered

    async def load_scripts(self, *, again: bool = False) -> None:
        """SCRIPT LOAD every registered script on every primary (`again`: even those loaded before,
        after a NOSCRIPT: a replica promoted by a failover may lack them)."""
        if self._scripts is None or self._loaded is None:
            return
        if again:
            self._loaded.clear()
        for sha, source in list(self._scripts.items()):
            if sha not in self._loaded:
                await self.script_load(source)
                self._loaded.add(sha)

    # --- routing -------------------------------------------------------------------------------
    async def _determine_slot(self, command: Any, *args: Any) -> int:
        """redis-py's, but the slot of an XREADGROUP is read from its arguments: its keys follow
        STREAMS (movable keys), and redis-py asked a node with COMMAND GETKEYS before every call
        (measured: ~650 COMMAND GETKEYS/s on one primary beside an idle worker's ~330 XREADGROUP/s over
        16 stream partitions)."""
        if _text(command).upper() == "XREADGROUP":
            words = [_text(a).upper() if isinstance(a, str | bytes) else "" for a in args]
            if "STREAMS" in words and words.index("STREAMS") + 1 < len(args):
                return self.keyslot(args[words.index("STREAMS") + 1])
        return await super()._determine_slot(command, *args)

    # --- search --------------------------------------------------------------------------------
    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        command = _text(args[0]).upper() if args else ""
        if self.search != SEARCH_SHARD or not command.startswith("FT.") or "target_nodes" in kwargs:
            return await super().execute_command(*args, **kwargs)
        if command == "FT._LIST":
            fields = await super().execute_command("HKEYS", self.meta)
            return sorted(f[len(TEMPLATE) :].encode() for f in map(_text, fields) if f.startswith(TEMPLATE))
        name = _text(args[1])
        if command == "FT.CREATE":
            if not await super().execute_command(
                "HSETNX", self.meta, TEMPLATE + name, msgpack.packb(args[2:])
            ):
                raise ResponseError("Index already exists")
            return b"OK"
        if command == "FT.DROPINDEX":
            return await self._drop(name, args[2:])
        if command in {"FT.ALIASADD", "FT.ALIASUPDATE"}:
            await super().execute_command("HSET", self.meta, ALIAS + name, _text(args[2]))
            self._aliases = None
            return b"OK"
        if command == "FT.ALIASDEL":
            await super().execute_command("HDEL", self.meta, ALIAS + name)
            self._aliases = None
            return b"OK"
        index = await self.resolve(name)
        namespace = _ROUTE.get()
        if namespace is None:
            if command == "FT.INFO":  # "does the index exist?" (every namespace's is made from it)
                if await super().execute_command("HEXISTS", self.meta, TEMPLATE + index):
                    return []
                raise ResponseError(f"Unknown index name {index}")
            raise RuntimeError(
                f"{command} on a shard-local cluster needs its namespace (shared.cluster.route)"
            )
        return await self._routed(command, index, namespace, args[2:], kwargs)

    async def _routed(self, command: str, index: str, namespace: str, rest: tuple, kwargs: dict) -> Any:
        shard = shard_name(index, namespace)
        node = self.get_node_from_key(shard)
        try:
            return await super().execute_command(command, shard, *rest, target_nodes=node, **kwargs)
        except ResponseError as exc:
            if not _missing(exc) or not await self.create_shard(index, namespace):
                raise
        node = self.get_node_from_key(shard)
        return await super().execute_command(command, shard, *rest, target_nodes=node, **kwargs)

    async def resolve(self, name: str) -> str:
        """The index `name` names: itself, or the index of the alias `name`."""
        now = time.monotonic()
        if self._aliases is None:
            self._aliases = {}
        cached = self._aliases.get(name)
        if cached is not None and now - cached[0] < ALIAS_TTL:
            return cached[1]
        target = await super().execute_command("HGET", self.meta, ALIAS + name)
        index = _text(target) if target is not None else name
        self._aliases[name] = (now, index)
        return index

    async def create_shard(self, index: str, namespace: str) -> bool:
        """Create `namespace`'s index of `index` on its primary from the recorded arguments, its
        prefixes narrowed to the namespace's keys; False when `index` was never created."""
        raw = await super().execute_command("HGET", self.meta, TEMPLATE + index)
        if raw is None:
            return False
        args = list(msgpack.unpackb(raw))
        tag = ns_tag(namespace)
        at = [_text(a).upper() for a in args].index("PREFIX")
        for i in range(at + 2, at + 2 + int(args[at + 1])):
            args[i] = f"{_text(args[i])}{tag}:"
        shard = shard_name(index, namespace)
        try:
            await super().execute_command(
                "FT.CREATE", shard, *args, target_nodes=self.get_node_from_key(shard)
            )
        except ResponseError as exc:
            if "already exists" not in str(exc).lower():
                raise
        if self._ensured is None:
            self._ensured = set()
        self._ensured.add((index, namespace))
        return True

    async def ensure_shards(self, indexes: Iterable[str], namespaces: Iterable[str]) -> None:
        """Every namespace's index of every index in `indexes` exists (created if this process has not
        seen it yet), so that documents written next are indexed as they are written."""
        known = self._ensured or set()
        for index in indexes:
            for namespace in namespaces:
                if (index, namespace) in known:
                    continue
                with route(namespace):
                    await self.execute_command("FT.INFO", index)  # creates it where it is missing
                if self._ensured is None:
                    self._ensured = set()
                self._ensured.add((index, namespace))

    async def _drop(self, index: str, options: tuple) -> Any:
        had = await super().execute_command("HDEL", self.meta, TEMPLATE + index)
        for node in self.get_primaries():
            for name in await super().execute_command("FT._LIST", target_nodes=node):
                if base_name(_text(name)) == index and _text(name) != index:
                    try:
                        await super().execute_command("FT.DROPINDEX", name, *options, target_nodes=node)
                    except ResponseError as exc:
                        if not _missing(exc) and "moved" not in str(exc).lower():
                            raise
        self._ensured = {(i, ns) for i, ns in self._ensured or set() if i != index}
        if not had:
            raise ResponseError(f"Unknown index name {index}")
        return b"OK"

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        return EngramClusterPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py's own


class EngramClusterPipeline(ClusterPipeline):
    """A cluster pipeline that can queue Engram's scripts, and whose search commands run one by one
    through `EngramCluster` (which routes them; a search cannot be pipelined with key commands there:
    it raises RuntimeError)."""

    _searches: list[tuple[tuple, dict]] | None = None
    _others = 0

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """Queue an EVALSHA, routed by its keys' slot. redis-py blocks it in cluster pipelines (a script's
        keys could span slots); Engram's scripts are single-slot (tests/integration/test_key_slots.py),
        and `execute` loads them on every primary first. A coroutine, as `AsyncScript` awaits it (awaiting
        the pipeline itself would re-initialise it and drop what it queued)."""
        self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)
        return self

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        client = self.cluster_client
        command = _text(args[0]).upper() if args else ""
        if isinstance(client, EngramCluster) and client.search == SEARCH_SHARD and command.startswith("FT."):
            if self._searches is None:
                self._searches = []
            self._searches.append((args, kwargs))
            return self
        self._others += 1
        return super().execute_command(*args, **kwargs)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        client = self.cluster_client
        searches, self._searches = self._searches, None
        if searches:
            others, self._others = self._others, 0
            await self.reset()
            if others:
                raise RuntimeError("a shard-local cluster pipeline cannot mix search and key commands")
            return [await client.execute_command(*args, **kwargs) for args, kwargs in searches]
        self._others = 0
        if isinstance(client, EngramCluster):
            await client.load_scripts()
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except NoScriptError:
            if isinstance(client, EngramCluster):
                await client.load_scripts(again=True)  # the caller's retry finds them
            raise


async def ensure_shards(redis: aioredis.Redis, indexes: Iterable[str], namespaces: Iterable[str]) -> None:
    """`EngramCluster.ensure_shards` on a shard-local cluster client; nothing on any other client."""
    if isinstance(redis, EngramCluster) and redis.search == SEARCH_SHARD:
        await redis.ensure_shards(list(indexes), list(namespaces))
