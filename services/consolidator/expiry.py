"""Erasing expired episodes: past `expires_at`, an episode is forgotten like `DELETE /v1/episodes/{id}`.

Reads hide it from the instant it expires (the `expires_at` filter of every `Scope`), so this sweep
need not be on time: every `Settings.expiry_interval` one worker (`Keys.expiry_lock`) publishes an
`EpisodeForgotten` per expired document of every namespace (searched per namespace on its primary on
a shard-local cluster, `shared.cluster.search_targets`), and the projection erases them.
"""

from __future__ import annotations

import logging
import time

import redis.asyncio as aioredis

from engram_episodic.events import EpisodeForgotten
from services.consolidator.forgetting import documents_ids
from shared.cluster import search_targets
from shared.index import numeric_clause
from shared.index_pages import every_key
from shared.keys import Keys
from shared.sdk import EngramClient
from shared.settings import Settings

log = logging.getLogger("engram.consolidator")

MAX_PER_SWEEP = 10_000  # forgets one sweep publishes; the rest wait for the next


async def expired(r: aioredis.Redis, keys: Keys, now: float) -> dict[str, list[str]]:
    """{namespace: [episode_id, ...]} of the documents whose `expires_at` is at or before `now`."""
    query = numeric_clause("expires_at", None, now)
    found: list[bytes] = []
    # on a shard-local cluster no index sees every namespace: each namespace's, on its primary
    for index, target in await search_targets(r, keys.episode_index_alias):
        found += await every_key(r, index, query, **target)
        if len(found) >= MAX_PER_SWEEP:
            break
    return await documents_ids(r, found[:MAX_PER_SWEEP])


async def sweep(r: aioredis.Redis, settings: Settings, *, now: float | None = None) -> int:
    """One sweep if no other worker holds the lease: publish the forgets of every expired episode.
    Returns how many were published (0 when another worker is sweeping)."""
    keys = settings.keys
    if not await r.set(keys.expiry_lock, "1", nx=True, px=int(settings.expiry_interval * 1000)):
        return 0
    total = 0
    for ns, ids in (await expired(r, keys, time.time() if now is None else now)).items():
        client = EngramClient(
            r,
            namespace=ns,
            prefix=settings.prefix,
            publish_timeout=settings.publish_timeout,
            retries=settings.publish_retries,
            consumer_group=settings.consumer_group,
            master_key=settings.master_key,
            partitions=settings.partitions,
        )
        at = time.time()
        for start in range(0, len(ids), 1000):  # one atomic XADD script per chunk
            chunk = ids[start : start + 1000]
            await client.publish(
                [EpisodeForgotten(namespace=ns, episode_id=e, occurred_at=at) for e in chunk]
            )
        total += len(ids)
    if total:
        log.info("expiry ◆ %d expired episodes forgotten", total)
    return total
