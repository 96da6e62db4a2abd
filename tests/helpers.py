"""Test helpers shared by every suite (no fixtures here; see conftest.py): `wait_until`, `run_module` and
`run_bench` (a `python -m` command from the repository root), and `Stack`, a `make run` stack in a
subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from shared.embedding import HashingEmbedder


async def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 15.0, interval: float = 0.02, message: str = "condition"
) -> Any:
    """Poll `predicate` (sync or async) until it returns a truthy value; return that value.

    Raises AssertionError naming `message` (and the last value) after `timeout` seconds. This is the
    only place tests wait: they never sleep for a fixed time.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}; last value: {last!r}")
        await asyncio.sleep(interval)


def hit_id(hit: Any) -> str:
    """The episode id of a search hit returned with its `doc` field: the `episode_id` TAG field holds a
    digest (shared.tags), so ids are read from the stored document, as the service does."""
    import orjson

    return orjson.loads(hit.fields[b"doc"])["episode_id"]


ROOT = Path(__file__).resolve().parents[1]

EMPTY_RECALL = {
    "results": [],
    "replay_context": {},
    "as_of": "2026-12-01T00:00:00Z",
    "weights": {},
    "preset": "early",
    "mode": "hybrid",
    "candidates": 0,
}
"""A `POST /v1/recall` answer with no results, as a stand-in service sends it (the shape the clients parse)."""


def run_module(
    module: str, *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m <module> <args>` from the repository root with this interpreter, its stdout and stderr
    captured as text; subprocess.TimeoutExpired after `timeout` seconds. `env` defaults to this process's."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_bench(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`run_module` for a benchmark: models offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE: a model that
    is not installed fails instead of downloading), and AssertionError with stderr's tail unless it
    exits 0."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = run_module(module, *args, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def drop_prefix(redis_url: str, prefix: str) -> None:
    """Drop every index and delete every key under `prefix` on `redis_url` (a module-scoped fixture's
    cleanup, outside any event loop; the `redis` fixture does the same per test)."""
    import redis as sync_redis

    client = sync_redis.Redis.from_url(redis_url)
    try:
        for name in client.execute_command("FT._LIST"):
            if name.decode().startswith(prefix):
                client.execute_command("FT.DROPINDEX", name)
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.unlink(key)
    finally:
        client.close()


async def publish_and_recall(
    session: Any, url: str, episode: dict[str, Any], query: str, *, message: str, timeout: float = 30
) -> Callable[[], Awaitable[bool]]:
    """POST `episode` to `url`/v1/episodes (202 asserted) with the aiohttp `session`, then wait (at most
    `timeout` s) until `POST /v1/recall` of `query` answers 200 with exactly one result: the projected
    episode of a namespace that holds only it. AssertionError naming `message` otherwise. Returns that
    check, to wait for again (after a restart)."""
    async with session.post(f"{url}/v1/episodes", json=episode) as r:
        assert r.status == 202

    async def recalled() -> bool:
        async with session.post(f"{url}/v1/recall", json={"query": query}) as r:
            return r.status == 200 and len((await r.json())["results"]) == 1

    await wait_until(recalled, timeout=timeout, message=message)
    return recalled


def spawn_consolidator(settings: Any, redis_url: str | None = None, **env: str) -> subprocess.Popen:
    """`python -m services.consolidator run` on `redis_url` (default `settings.redis_url`) with the test's
    prefix and embedding dimension, the hashing embedder, FLAT vectors, WARNING logs and no metrics port,
    `env` (ENGRAM_* variables) over those; stdout discarded, stderr a pipe to read after it exits."""
    full = {
        **os.environ,
        "REDIS_URL": settings.redis_url if redis_url is None else redis_url,
        "ENGRAM_PREFIX": settings.prefix,
        "ENGRAM_EMBEDDER": "hashing",
        "ENGRAM_EMBED_DIM": str(settings.embed_dim),
        "ENGRAM_VECTOR_ALGORITHM": "FLAT",
        "ENGRAM_LOG_LEVEL": "WARNING",
        "ENGRAM_METRICS_PORT": "0",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "services.consolidator", "run"],
        cwd=ROOT,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def spawn_query_service(redis_url: str, prefix: str, port: int, log: Path, **env: str) -> subprocess.Popen:
    """`python -m services.query` (serve(), not the test server) on `redis_url` with `prefix`, the
    hashing embedder and port `port`, `env` (ENGRAM_* variables) over those; stdout and stderr go to
    the file `log`."""
    full = {
        **os.environ,
        "REDIS_URL": redis_url,
        "ENGRAM_PREFIX": prefix,
        "ENGRAM_EMBEDDER": "hashing",
        "ENGRAM_PORT": str(port),
        **env,
    }
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.query"], cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT
        )


async def ready(url: str) -> bool:
    """Whether the query service at `url` answers `GET /readyz` 200 within 2 s (False when it does not
    answer at all)."""
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return r.status == 200
    except aiohttp.ClientError:
        return False


class Stack:
    """`python -m services.run` (`make run`) on private ports and `data_dir`, its output in a file (a
    pipe nobody reads would freeze it), with helpers to find its children and wait for its messages.

    `redis_port` (default a free port) is ENGRAM_REDIS_PORT; `drop` names variables of this process's
    environment the stack must not inherit, besides REDIS_URL and the API keys; `extra` are ENGRAM_*
    variables set over the defaults (the hashing embedder, WARNING logs, no metrics ports, a 2 s lease and
    200 ms reads so a killed worker's entries are reclaimed quickly)."""

    def __init__(
        self, data_dir: Path, *, redis_port: int | None = None, drop: Iterable[str] = (), **extra: str
    ):
        from deploy.embedded_redis import free_port

        self.port = free_port()
        self.redis_port = free_port() if redis_port is None else redis_port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data_dir.parent / f"{data_dir.name}-run.log"
        dropped = {"REDIS_URL", "ENGRAM_API_KEYS", "ENGRAM_API_KEYS_FILE", *drop}
        self.env = {k: v for k, v in os.environ.items() if k not in dropped}
        self.env.update(
            ENGRAM_PORT=str(self.port),
            ENGRAM_REDIS_PORT=str(self.redis_port),
            ENGRAM_DATA_DIR=str(data_dir),
            ENGRAM_EMBEDDER="hashing",
            ENGRAM_LOG_LEVEL="WARNING",
            ENGRAM_METRICS_PORT="0",
            ENGRAM_LEASE_MS="2000",
        )
        self.env.update(extra)
        self.cwd = ROOT
        self.proc: subprocess.Popen | None = None

    def start(self) -> Stack:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.run"],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self, module: str) -> list[int]:
        """Pids of the supervisor's children running `python -m <module>` (or the program named `<module>`)."""
        assert self.proc is not None
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:  # read once: a process may exit between two reads (a crash loop kills them on purpose)
                text = stat.read_text()
                ppid = int(text.rsplit(")", 1)[1].split()[1])
                cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == self.proc.pid and (module.encode() in cmdline or text.split()[1] == f"({module})"):
                found.append(int(stat.parent.name))
        return found

    async def ready(self) -> bool:
        """`ready(self.url)`; AssertionError with the output's tail once the stack has exited."""
        assert self.proc is not None
        if self.proc.poll() is not None:  # the stack exited: say why now, not after the timeout
            raise AssertionError(f"make run exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
        return await ready(self.url)

    async def said(self, text: str, timeout: float = 30) -> None:
        await wait_until(
            lambda: text in self.output(),
            timeout=timeout,
            interval=0.1,
            message=f"{text!r} in the output of make run",
        )

    def stop(self, timeout: float = 60) -> int:
        """Ctrl-C (SIGINT to the supervisor); its exit code, within `timeout` seconds."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """After a failed test: kill the supervisor's process group and its embedded Redis (which runs
        in a session of its own)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            import redis as sync_redis

            with contextlib.suppress(Exception):
                sync_redis.Redis(port=self.redis_port, socket_timeout=2).shutdown(nosave=True)


class HeldEmbedder(HashingEmbedder):
    """The hashing embedder whose passes wait until the test sets `release`: a model pass still
    running (a query being embedded, a lane embedding a batch)."""

    def __init__(self, dim: int):
        super().__init__(dim)
        self.release = asyncio.Event()

    async def _embed_batch(self, texts):
        await self.release.wait()
        return await super()._embed_batch(texts)


async def _key_values(redis: Any, key: bytes, kind: str) -> list[bytes] | None:
    """Every byte string a key of type `kind` holds (hash fields and values, stream ids, fields and
    values, ...); None for a type `leaked_text` cannot read."""
    if kind == "string":
        return [await redis.get(key) or b""]
    if kind == "hash":
        return [b for f, v in (await redis.hgetall(key)).items() for b in (f, v)]
    if kind == "set":
        return list(await redis.smembers(key))
    if kind == "zset":
        return list(await redis.zrange(key, 0, -1))
    if kind == "list":
        return list(await redis.lrange(key, 0, -1))
    if kind == "stream":
        return [
            b
            for sid, fields in await redis.xrange(key, "-", "+")
            for b in (sid, *fields.keys(), *fields.values())
        ]
    if kind == "ReJSON-RL":
        return [await redis.execute_command("JSON.GET", key) or b""]
    return None


async def leaked_text(redis: Any, prefix: str, texts: Iterable[str]) -> list[str]:
    """Every key under `prefix` whose name or value still holds one of `texts` as plaintext (compared
    case-blind: the indexed text fields hold it folded), as `"<key> (<type>): <text>"`; [] when none.

    The key-leak check of erasure tests: after a forget, nothing under the test's prefix may keep the
    forgotten text, in any generation (live, old, building) or type (hashes with their field names,
    sets, sorted sets, lists, streams, strings, JSON documents), dead letters and tombstones included.
    Sealed bytes are opaque to it, as they are to anyone without the key."""
    needles = [t.casefold() for t in texts if t]
    found: list[str] = []
    async for key in redis.scan_iter(match=f"{prefix}*", count=1000):
        raw_kind = await redis.type(key)
        kind = raw_kind.decode() if isinstance(raw_kind, bytes) else str(raw_kind)
        values = await _key_values(redis, key, kind)
        if values is None:  # a type this check cannot read is a leak it cannot rule out
            found.append(f"{key!r} ({kind}): unreadable by the check")
            continue
        for blob in [key, *values]:
            text = (
                (blob if isinstance(blob, bytes) else str(blob).encode())
                .decode("utf-8", "replace")
                .casefold()
            )
            found += [f"{key!r} ({kind}): {needle!r}" for needle in needles if needle in text]
    return found
