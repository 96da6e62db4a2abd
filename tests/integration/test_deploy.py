"""The exact commands docker-compose.yml runs, started as local processes against the embedded Redis.

No Docker engine runs here, so this is the closest check of `docker compose up --scale consolidator=3`:
the compose command and environment of each service, with only REDIS_URL and the key prefix pointed at
the test Redis (plus the hashing embedder instead of MiniLM, so three workers start in seconds, and a
free port for the query service). deploy/redis.conf is loaded into the same redis-server 8.2 build.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
import pytest
import redis as sync_redis
from redis.exceptions import ResponseError

from deploy.embedded_redis import free_port, locate
from engram_episodic.events import Episode, EpisodeCompleted, Task
from shared import streams
from shared.index import Scope, count, index_exists
from shared.keys import Keys
from shared.sdk import EngramClient
from shared.tags import BLAKE2B
from tests.helpers import wait_until
from tests.unit.test_compose import REDIS_CONF, load_compose, service_argv, service_env

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it

ROOT = Path(__file__).resolve().parents[2]
N_EPISODES = 1500
N_WORKERS = 3


def compose_process(service: str, settings, **overrides: str) -> subprocess.Popen:
    """Start `service` with its compose command and environment, pointed at the test Redis."""
    argv = service_argv(service)
    assert argv[0] == "python"
    env = {
        **os.environ,
        **service_env(service),
        "REDIS_URL": settings.redis_url,
        "ENGRAM_PREFIX": settings.prefix,
        "ENGRAM_EMBEDDER": "hashing",
        "ENGRAM_LOG_LEVEL": "WARNING",
        **overrides,
    }
    return subprocess.Popen(
        [sys.executable, *argv[1:]], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def stop(proc: subprocess.Popen, grace: float = 30.0) -> int:
    """SIGTERM, as `docker compose stop` sends, and the exit code within the compose grace period."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=grace)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


async def publish(redis, settings, n: int, namespace: str = "ns") -> None:
    client = EngramClient(redis, namespace=namespace, prefix=settings.prefix)
    events = [
        EpisodeCompleted(
            namespace=namespace,
            episode_id=f"e{i}",
            occurred_at=float(i + 1),
            episode=Episode(
                episode_id=f"e{i}",
                outcome="success",
                completed_at=float(i + 1),
                task=Task(description=f"deploy check episode {i} about topic {i % 17}"),
            ),
        )
        for i in range(n)
    ]
    for start in range(0, n, 100):
        await client.publish(events[start : start + 100])


async def test_compose_consolidators_x3_process_a_workload_once(settings, redis):
    keys = Keys(settings.prefix)
    # each replica has a network namespace of its own under compose; here they share the host: a port each
    ports = [free_port() for _ in range(N_WORKERS)]
    workers = [compose_process("consolidator", settings, ENGRAM_METRICS_PORT=str(p)) for p in ports]
    try:

        async def joined() -> bool:  # every replica is up and consuming before the workload starts
            try:
                return len(await redis.xinfo_consumers(keys.stream, "consolidator")) == N_WORKERS
            except ResponseError:
                return False

        await wait_until(joined, timeout=60, message=f"{N_WORKERS} consumers in the group")
        await publish(redis, settings, N_EPISODES)

        async def indexed() -> int:
            if not await index_exists(redis, keys.episode_index_alias):
                return 0
            return await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns"))

        async def all_done() -> bool:
            for w in workers:
                assert w.poll() is None, w.stderr.read().decode()[-2000:]
            if await indexed() != N_EPISODES:
                return False
            info = await streams.StreamGroup(redis, keys.stream, "consolidator").info()
            return info["pending"] == 0 and info["lag"] == 0

        await wait_until(all_done, timeout=90, message=f"{N_EPISODES} episodes indexed, nothing pending")
        consumers = await redis.xinfo_consumers(keys.stream, "consolidator")
        assert len(consumers) == N_WORKERS, "each replica joins the one group under its own name"
        probe = load_compose()["services"]["consolidator"]["healthcheck"]["test"]
        assert probe[:3] == ["CMD", "python", "-c"] and ":9191/healthz" in probe[3]
        for p in ports:  # compose's own healthcheck command, run against each replica
            check = subprocess.run([sys.executable, "-c", probe[3].replace(":9191/", f":{p}/")], timeout=30)
            assert check.returncode == 0, f"the healthcheck of the replica on port {p} failed"
    finally:
        codes = [stop(w) for w in workers]
    assert codes == [0] * N_WORKERS, "graceful stop within the compose stop_grace_period"
    # once, no loss: one document per episode id, every id present, nothing dead-lettered
    assert await count(redis, keys.episode_index_alias, Scope(tags=BLAKE2B, namespace="ns")) == N_EPISODES
    gen = int((await redis.hget(keys.meta, "generation")) or 1)
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(N_EPISODES):
            pipe.exists(keys.episode_doc(gen, "ns", f"e{i}"))
        assert sum(await pipe.execute()) == N_EPISODES
    assert await redis.xlen(keys.dead_letters) == 0
    # the stream keeps every published entry (workers may add their own, e.g. FactsConsolidated)
    assert await redis.xlen(keys.stream) >= N_EPISODES


async def test_compose_query_is_ready_and_the_demo_agent_recalls(settings, redis):
    port = free_port()
    worker = compose_process("consolidator", settings, ENGRAM_METRICS_PORT=str(free_port()))
    query = compose_process("query", settings, ENGRAM_PORT=str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                assert query.poll() is None, query.stderr.read().decode()[-2000:]
                try:
                    async with http.get(f"{url}/readyz") as resp:
                        return resp.status == 200 and (await resp.json())["status"] == "ready"
                except aiohttp.ClientConnectionError:
                    return False

            await wait_until(ready, timeout=60, message="query /readyz 200")
            async with http.post(f"{url}/v1/recall", json={"query": "x"}) as resp:
                assert resp.status == 401, "ENGRAM_API_KEYS from compose is enforced"
        demo_env = {"ENGRAM_QUERY_URL": url, "ENGRAM_DEMO_TIMEOUT": "60s"}
        demo = compose_process("demo-agent", settings, **demo_env)
        out, err = demo.communicate(timeout=90)
        assert demo.returncode == 0, (out + err).decode()[-3000:]
        assert b"all 5 episodes consolidated" in out and b"demo-1" in out
    finally:
        assert stop(query, 15) == 0
        assert stop(worker) == 0


@pytest.fixture
def conf_server():
    """deploy/redis.conf loaded by redis-server 8.2 (only `dir` is swapped for a temporary one)."""
    server, modules = locate()
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "redis.conf"
        conf.write_text(REDIS_CONF.read_text().replace("dir /data", f"dir {tmp}"))
        port = free_port()
        args = [str(server), str(conf), "--port", str(port), "--bind", "127.0.0.1"]
        for module in modules:
            args += ["--loadmodule", str(module.resolve())]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            yield proc, port
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=10)
            proc.stdout.close()


async def test_redis_conf_is_accepted_by_redis_8(conf_server):
    proc, port = conf_server
    client = sync_redis.Redis(port=port, socket_connect_timeout=1, decode_responses=True)

    def up() -> bool:
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        try:
            return bool(client.ping())
        except sync_redis.exceptions.ConnectionError:
            return False

    try:
        await wait_until(up, timeout=20, message="redis-server with deploy/redis.conf")
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("save") == {"save": ""}  # no dump.rdb to outlive a forget
        client.execute_command("FT._LIST")  # the Query Engine loads alongside this config
    finally:
        client.close()
