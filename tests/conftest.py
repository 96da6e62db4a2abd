"""Fixtures: one private embedded Redis per test session; one key prefix per test.

No test depends on a server started by hand. With ENGRAM_TEST_REDIS_URL set, tests use that server instead
(still isolated by prefix, never FLUSHALL).
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest

from deploy.embedded_redis import EmbeddedRedis, free_port
from shared.redis_conn import connect
from shared.settings import Settings

LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo7.json"


@pytest.fixture(scope="session", autouse=True)
def _private_data_dir(tmp_path_factory):
    """ENGRAM_DATA_DIR is a directory of the session's own: no test, and no process a test starts, reads
    the checkout's `.run/` (where `make run` keeps its Redis data and master key: found there, the
    admin commands under test would open the stream with the user's key)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ENGRAM_DATA_DIR", str(tmp_path_factory.mktemp("data-dir")))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """Undo what a process entry point run in-process does to logging (`shared.logs.configure`: a root
    handler on the stderr of that moment, at INFO): left behind, later tests' records reach whatever
    that stream became, e.g. a command's output captured by click's CliRunner."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if getattr(h, "engram", False)]:
        root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    if os.environ.get("ENGRAM_TEST_REDIS_URL"):
        yield os.environ["ENGRAM_TEST_REDIS_URL"]
        return
    server = EmbeddedRedis(port=free_port(), data_dir=tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


def _test_settings(redis_url: str, prefix: str) -> Settings:
    """Settings for one test on `redis_url`: its own prefix, the hashing embedder, FLAT vectors (fast
    inserts), 50 ms reads and a 2 s lease (a stopped worker's entries are reclaimed quickly)."""
    return Settings(
        redis_url=redis_url,
        prefix=prefix,
        embedder="hashing",
        embed_dim=256,
        vector_algorithm="FLAT",
        block_ms=50,
        lease_ms=2000,
    )


@pytest.fixture
def settings(redis_url, prefix) -> Settings:
    """Settings for one test: its own prefix, the hashing embedder, FLAT vectors (fast inserts)."""
    return _test_settings(redis_url, prefix)


@pytest.fixture
async def redis(redis_url, prefix):
    """A client for the test; deletes every key and index under the test's prefix afterwards."""
    client = connect(redis_url)
    yield client
    for name in await client.execute_command("FT._LIST"):
        if name.decode().startswith(prefix):
            await client.execute_command("FT.DROPINDEX", name)
    async for key in client.scan_iter(match=f"{prefix}*", count=1000):
        await client.unlink(key)
    await client.aclose()


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory) -> str:
    """A local Redis Cluster of 3 primaries for the session (`redis+cluster://`), from the same wheels."""
    from deploy.embedded_redis import EmbeddedCluster

    cluster = EmbeddedCluster(data_dir=tmp_path_factory.mktemp("session-cluster"), primaries=3)
    cluster.start()
    yield cluster.url
    cluster.stop()


@pytest.fixture
def cluster_settings(cluster_url, prefix) -> Settings:
    """`settings` on the session's cluster."""
    return _test_settings(cluster_url, prefix)


@pytest.fixture
async def cluster_redis(cluster_url, prefix):
    """A cluster client for the test (search routed per shard); deletes the test's keys and indexes."""
    client = connect(cluster_url, prefix=prefix)
    yield client
    for name in await client.execute_command("FT._LIST"):
        if name.decode().startswith(prefix):
            try:
                await client.execute_command("FT.DROPINDEX", name)
            except Exception:  # noqa: BLE001 - an alias, or already dropped
                pass
    async for key in client.scan_iter(match=f"{prefix}*", count=1000):
        await client.unlink(key)
    await client.aclose()
