"""Operator tasks on a deployment's Redis, shared by the `engram` command line (its front door:
`engram-admin replay`, `reindex`, `dead-letters`, `redrive`) and `python -m services.consolidator`.

Each takes the Settings (read once by the caller) and opens what it needs, closing it however it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import redis.asyncio as aioredis

from services.consolidator.replay import Progress
from shared.partitions import deployment_keys
from shared.settings import Settings


@contextlib.asynccontextmanager
async def redis_of(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    from shared.redis_conn import connect

    if settings.redis_url is None:
        raise ValueError("REDIS_URL is not set")
    redis = connect(settings.redis_url, prefix=settings.prefix, cluster_search=settings.cluster_search)
    try:
        yield redis
    finally:
        await redis.aclose()


async def open_stack(stack: contextlib.AsyncExitStack, settings: Settings) -> tuple[aioredis.Redis, Any]:
    """Redis and the loaded embedder, each closed by `stack` (also when a later step of start-up fails)."""
    from shared.embedding import make_embedder

    redis = await stack.enter_async_context(redis_of(settings))
    embedder = make_embedder(settings)
    stack.push_async_callback(embedder.aclose)
    await embedder.load()
    await embedder.ensure_dim()
    return redis, embedder


async def replay(
    settings: Settings,
    progress: Progress | None = None,
    *,
    keep_embedder: bool = False,
) -> dict[str, int]:
    """Rebuild every projection into a new generation with `settings.embedder` (a reindex when it is
    another embedder); `services.consolidator.replay.replay`'s counts. `keep_embedder` (`replay`, not `reindex`): ConfigError, before anything is written, when
    `settings.embedder` is not the one the current generation was built with."""
    from services.consolidator.replay import replay as do_replay

    async with contextlib.AsyncExitStack() as stack:
        redis, embedder = await open_stack(stack, settings)
        if keep_embedder:
            await _same_embedder(redis, settings, embedder.name, embedder.dim)
        return await do_replay(settings, redis, embedder, progress)


async def _same_embedder(redis: aioredis.Redis, settings: Settings, name: str, dim: int) -> None:
    """ConfigError when the current generation was built with another embedder than (`name`, `dim`): a
    plain `engram-admin replay` with ENGRAM_EMBEDDER unset (`auto`, mpnet) re-embedded a hashing deployment,
    and every recall then answered 409 until the services were restarted with it."""
    from engram_episodic.errors import ConfigError
    from shared.index import current_generation, embedder_setting
    from shared.replies import as_text

    keys = settings.keys
    gen = await current_generation(redis, keys)
    recorded = await redis.hget(keys.meta, f"g{gen}:embedder")
    recorded_dim = int(await redis.hget(keys.meta, f"g{gen}:dim") or 0)
    if recorded is not None and (as_text(recorded) != name or recorded_dim != dim):
        raise ConfigError(
            f"generation {gen} was built with embedder {as_text(recorded)!r} (dim {recorded_dim}) and this "
            f"replay would embed with {name!r} (dim {dim}): replay keeps the index's embedder — run it with "
            f"{embedder_setting(as_text(recorded), recorded_dim)}; to change the embedder, `reindex --embedder`"
        )


async def dead_letters(settings: Settings, limit: int) -> list[dict[str, Any]]:
    """The oldest `limit` dead letters: `{id, stream_id, reason, consumer, at (UTC epoch s), bytes,
    namespace, episode_id}`; the last two are None when the payload names no episode (ids only: never
    the user or the content)."""
    from services.consolidator.deadletters import list_dead_letters
    from shared.codec import peek_identity

    async with redis_of(settings) as redis:
        keys = await deployment_keys(redis, settings.keys, explicit=settings.stream_partitions is not None)
        rows = []
        for d in await list_dead_letters(redis, keys, limit=limit):
            ident = peek_identity(d.payload) if d.payload else None
            rows.append(
                {
                    "id": d.dead_id,
                    "stream_id": d.stream_id,
                    "reason": d.reason,
                    "consumer": d.consumer,
                    "at": d.at,
                    "bytes": len(d.payload),
                    "namespace": ident[0] if ident else None,
                    "episode_id": ident[1] if ident else None,
                }
            )
        return rows


async def redrive(
    settings: Settings,
    ids: list[str] | None,
    on_start: Callable[[int], None] | None = None,
    on_each: Callable[[], None] | None = None,
) -> tuple[int, list[str]]:
    """Re-drive the dead letters `ids` (None: all); returns (how many were re-driven, the ids that name
    no dead letter). `on_start`/`on_each` as for `deadletters.redrive`."""
    from services.consolidator.deadletters import redrive as do_redrive

    return await _on_dead_letters(settings, ids, do_redrive, on_start, on_each)


async def discard(
    settings: Settings,
    ids: list[str] | None,
    on_start: Callable[[int], None] | None = None,
    on_each: Callable[[], None] | None = None,
) -> tuple[int, list[str]]:
    """Discard the dead letters `ids` (None: all): delete them and their original entries, publishing
    nothing (`deadletters.discard`); returns (how many were discarded, the ids that name no dead
    letter)."""
    from services.consolidator.deadletters import discard as do_discard

    return await _on_dead_letters(settings, ids, do_discard, on_start, on_each)


async def _on_dead_letters(
    settings: Settings, ids: list[str] | None, act, on_start, on_each
) -> tuple[int, list[str]]:
    """`act(redis, keys, ids, on_start=, on_each=)` on the dead letters `ids` (None: all) → (its count,
    the ids that name no dead letter)."""
    from services.consolidator.deadletters import list_dead_letters

    async with redis_of(settings) as redis:
        keys = await deployment_keys(redis, settings.keys, explicit=settings.stream_partitions is not None)
        unknown: list[str] = []
        if ids is not None:
            known = {d.dead_id for d in await list_dead_letters(redis, keys, limit=1_000_000)}
            unknown = [i for i in ids if i not in known]
        n = await act(redis, keys, ids, on_start=on_start, on_each=on_each)
    return n, unknown
