"""A replay (or reindex) while episodes keep arriving: it ends however fast they arrive, and the new
generation holds every episode published before, during and after it exactly once."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from engram_episodic.drafts import finished_episode
from engram_episodic.events import EpisodeCompleted
from services.consolidator import replay as replay_module
from services.consolidator.replay import replay
from shared.embedding import HashingEmbedder
from shared.index import Scope, count
from shared.keys import Keys
from shared.sdk import EngramClient
from shared.tags import BLAKE2B
from tests.helpers import wait_until
from tests.integration.test_consolidator import _unprojected, docs, episode, make_worker

PAGE = 50
CAP = 4_000


@dataclass
class Paced:
    """The replay's progress: its phases as [name, total, advanced]; `read` counts the stream entries
    it projected (phases `stream` and `catch-up`) and `moved` wakes the publisher."""

    phases: list[list] = field(default_factory=list)
    read: int = 0
    moved: asyncio.Event = field(default_factory=asyncio.Event)

    def phase(self, name: str, total: int | None) -> None:
        self.phases.append([name, total, 0])

    def advance(self, n: int) -> None:
        self.phases[-1][2] += n
        if self.phases[-1][0] in ("stream", "catch-up"):
            self.read += n
            self.moved.set()

    def of(self, name: str) -> list[tuple[int | None, int]]:
        return [(total, done) for phase, total, done in self.phases if phase == name]


async def replay_under_ingest(settings, redis, *, before: int, ratio: float, lead: int):
    """Publish `before` episodes, start a worker, then replay while a publisher keeps `ratio` entries
    published for each one the replay projected, `lead` ahead (at most CAP episodes in all); publish
    20 more after it and let the worker drain. Returns (the replay's counts, its progress, every
    episode id published); AssertionError when the replay did not end within 30 s."""
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    published: list[str] = []

    async def publish(n: int, when: str) -> None:
        """`n` finished episodes in one XADD pipeline (as fast as ingest gets)."""
        ids = [f"{when}-{len(published) + i}" for i in range(n)]
        events = [
            EpisodeCompleted(
                namespace="ns",
                episode_id=eid,
                occurred_at=time.time(),
                episode=finished_episode(episode(eid)),
            )
            for eid in ids
        ]
        await client.publish(events)
        published.extend(ids)

    await publish(before, "before")
    stop = asyncio.Event()
    running = asyncio.create_task(make_worker(settings, redis).run(stop))
    progress = Paced()
    finished = asyncio.Event()

    async def publisher() -> None:
        while not finished.is_set() and len(published) < CAP:
            if len(published) - before < ratio * progress.read + lead:
                await publish(PAGE, "during")
            else:
                progress.moved.clear()
                await progress.moved.wait()

    feeding = asyncio.create_task(publisher())
    rebuilding = asyncio.create_task(replay(settings, redis, HashingEmbedder(settings.embed_dim), progress))
    try:
        try:
            await asyncio.wait({rebuilding}, timeout=30)
            assert rebuilding.done(), f"the replay did not end in 30 s under ingest: {progress.phases}"
            result = rebuilding.result()
        finally:
            finished.set()
            progress.moved.set()
            await feeding
            if not rebuilding.done():
                rebuilding.cancel()
                await asyncio.wait({rebuilding}, timeout=5)
        assert len(published) < CAP, f"the replay ended only after ingest did: {progress.phases}"
        await publish(20, "after")
        await wait_until(
            lambda: _unprojected(redis, Keys(settings.prefix).stream, settings.consumer_group, 0),
            timeout=60,
            message="the worker projected every entry",
        )
    finally:
        stop.set()
        await running
    return result, progress, published


async def every_episode_once(redis, settings, published: list[str]) -> None:
    keys = Keys(settings.prefix)
    assert sorted(await docs(redis, keys, "ns")) == sorted(published)
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == len(published)


async def test_replay_ends_while_ingest_outpaces_it_and_keeps_every_episode_once(
    settings, redis, monkeypatch
):
    """The replay read "until a page comes back empty": with a publisher adding two entries for each
    one it projected, that never came. It reads up to marks fixed at its start and at its swap."""
    monkeypatch.setattr(replay_module, "PAGE", PAGE)  # many short reads: the race in a few seconds
    result, progress, published = await replay_under_ingest(
        settings, redis, before=100, ratio=2, lead=2 * PAGE
    )
    assert len(published) - 100 > result["entries"]  # the publisher did outpace the replay
    assert result["generation"] == 2 and result["caught_up"] > 0
    # one pass before the swap (a second would have been longer), and bars that end: each phase
    # projected exactly the total it announced
    ((total, done),) = progress.of("stream")
    assert total == done > 0
    assert progress.of("catch-up") == [(result["caught_up"], result["caught_up"])]
    await every_episode_once(redis, settings, published)


async def test_under_slower_ingest_passes_shrink_before_the_swap(settings, redis, monkeypatch):
    """Entries left for after the swap are missing from the live generation until the catch-up has
    run: under ingest slower than the replay, passes before the swap make them a page or less."""
    monkeypatch.setattr(replay_module, "PAGE", PAGE)
    result, progress, published = await replay_under_ingest(settings, redis, before=500, ratio=0.4, lead=0)
    passes = progress.of("stream")
    assert len(passes) >= 2 and all(total == done for total, done in passes), passes
    assert all(later <= earlier // 2 for (earlier, _), (later, _) in zip(passes, passes[1:], strict=False))
    assert result["caught_up"] <= 3 * PAGE, progress.phases  # a single pass left 200 or more
    await every_episode_once(redis, settings, published)
