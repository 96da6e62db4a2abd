"""Erasure under load: a replay and a reindex while episodes keep arriving, a worker stopped and
restarted mid-way, users forgotten during each; then the erasure pass, and a scan of every key and of
every persistence file (the AOF's base and increments, an RDB written after it) for the forgotten text."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from deploy.embedded_redis import EmbeddedRedis, free_port
from engram_episodic.drafts import finished_episode
from engram_episodic.events import EpisodeCompleted
from services.consolidator import erasure
from services.consolidator.replay import replay
from shared.embedding import HashingEmbedder
from shared.keys import Keys
from shared.redis_conn import connect
from shared.sdk import EngramClient
from shared.settings import Settings
from tests.helpers import leaked_text
from tests.integration.test_consolidator import drain, episode, make_worker

CAP = 1_500  # episodes the background publisher sends at most


def _files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


class Ingest:
    """Publishes episodes of `users` in steps of 25 until stopped or CAP is reached."""

    def __init__(self, client: EngramClient) -> None:
        self.client, self.sent, self.stop = client, 0, asyncio.Event()

    async def publish(self, user: str, text: str, n: int) -> None:
        now = time.time()
        events = [
            EpisodeCompleted(
                namespace="ns",
                episode_id=f"{user}-{self.sent + i}",
                occurred_at=now,
                episode=finished_episode(
                    episode(f"{user}-{self.sent + i}", user_id=user, task={"description": f"{text} {i}"})
                ),
            )
            for i in range(n)
        ]
        await self.client.publish(events)
        self.sent += n

    async def run(self, user: str, text: str) -> None:
        while not self.stop.is_set() and self.sent < CAP:
            await self.publish(user, text, 25)


async def test_forgotten_text_is_in_no_key_and_no_file_after_replays_under_ingest(tmp_path):
    data_dir = tmp_path / "redis"
    server = EmbeddedRedis(port=free_port(), data_dir=data_dir, extra_args=["--rdbcompression", "no"])
    server.start()
    redis = connect(server.url)
    tag = uuid.uuid4().hex[:8]
    first, second, kept = f"FIRSTGONE{tag}", f"SECONDGONE{tag}", f"KEPTTEXT{tag}"
    settings = Settings(
        redis_url=server.url,
        prefix="load:",
        embedder="hashing",
        embed_dim=64,
        vector_algorithm="FLAT",
        block_ms=50,
        lease_ms=2000,
    )
    client = EngramClient(redis, namespace="ns", prefix=settings.prefix)
    ingest = Ingest(client)
    stop = asyncio.Event()
    try:
        await ingest.publish("first-user", first, 150)
        await ingest.publish("second-user", second, 150)
        await ingest.publish("kept-user", kept, 150)
        worker = asyncio.create_task(make_worker(settings, redis).run(stop))
        feeding = asyncio.create_task(ingest.run("kept-user", kept))

        # a replay under ingest; the worker is stopped while it runs and the first user is forgotten
        rebuilding = asyncio.create_task(replay(settings, redis, HashingEmbedder(settings.embed_dim)))
        stop.set()
        await worker
        await client.forget_user("first-user")
        await rebuilding
        stop = asyncio.Event()
        worker = asyncio.create_task(make_worker(settings, redis, name="w2").run(stop))

        # a reindex to another dimension under ingest, the second user forgotten while it builds
        reindexed = settings.with_(embed_dim=32)
        rebuilding = asyncio.create_task(replay(reindexed, redis, HashingEmbedder(32)))
        await client.forget_user("second-user")
        await rebuilding
        ingest.stop.set()
        await feeding
        stop.set()
        await worker  # it pauses on the new embedder: one of the reindexed dimension takes over
        await drain(make_worker(reindexed, redis, name="w3"))

        await erasure.run(redis, Keys(settings.prefix))
        await redis.save()
        assert await leaked_text(redis, settings.prefix, [first, second]) == []
        assert await leaked_text(redis, settings.prefix, [kept])  # the scan does see what is kept
        files = _files_under(data_dir)
        assert "dump.rdb" in files and any(name.startswith("appendonlydir/") for name in files)
        for name, content in files.items():
            for gone in (first, second):
                assert gone.encode() not in content, (name, gone)
        assert kept.encode() in files["dump.rdb"]
    finally:
        stop.set()
        await redis.aclose()
        server.stop()
