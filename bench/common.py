"""What both benchmarks share: a private Redis, worker and query-service processes, timing statistics,
tables and result files.

Every benchmark starts its own embedded Redis on a free port in a temporary directory (never a server
someone else uses) and stops it, and every process it spawns is stopped by its pid in a `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import numpy as np

from deploy.embedded_redis import EmbeddedRedis, free_port
from engram_episodic import ApiError, AsyncEngram, ConnectionFailed
from engram_episodic.client import Call

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (the working directory of spawned services)."""

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@contextlib.contextmanager
def private_redis(*, appendonly: bool = False) -> Iterator[EmbeddedRedis]:
    """An embedded Redis on a free port in a temporary directory; stopped and deleted on exit.

    AOF is off by default: both sides of every comparison run against this same server, and the
    benchmark measures Engram, not the disk.
    """
    with tempfile.TemporaryDirectory(prefix="engram-bench-") as tmp:
        server = EmbeddedRedis(port=free_port(), data_dir=Path(tmp), appendonly=appendonly)
        server.start()
        try:
            yield server
        finally:
            server.stop()


def service_env(redis_url: str, prefix: str, embedder: str, **extra: str) -> dict[str, str]:
    """The environment of a spawned worker or query service (ENGRAM_* variables, see shared/settings.py)."""
    return {
        **os.environ,
        **OFFLINE_ENV,
        "REDIS_URL": redis_url,
        "ENGRAM_PREFIX": prefix,
        "ENGRAM_EMBEDDER": embedder,
        "ENGRAM_LOG_LEVEL": "WARNING",
        "ENGRAM_METRICS_PORT": "0",  # several workers per host: a health port each would need numbering
        **extra,
    }


def spawn_workers(n: int, env: dict[str, str], *, name: str = "bench") -> list[subprocess.Popen]:
    """`n` consolidator processes (`python -m services.consolidator run`), each a unique consumer."""
    procs = []
    for i in range(n):
        procs.append(
            _Proc(
                [sys.executable, "-m", "services.consolidator", "run"],
                cwd=ROOT,
                env={**env, "ENGRAM_CONSUMER_NAME": f"{name}-{i}-{os.getpid()}"},
                stdout=subprocess.DEVNULL,
                stderr=_log_file(),
            )
        )
    return procs


def _log_file():
    """Where a spawned service's stderr goes: a temp file, never a pipe nobody reads (a full pipe
    blocks the service's next log line, e.g. warnings during a Redis outage)."""
    return tempfile.TemporaryFile()


def _tail(p: subprocess.Popen, n: int = 2000) -> str:
    log = p.stderr_file if hasattr(p, "stderr_file") else None
    if log is None:
        return ""
    with contextlib.suppress(OSError, ValueError):
        log.seek(0)
        return log.read().decode(errors="replace")[-n:]
    return ""


class _Proc(subprocess.Popen):
    """Popen that keeps the file its stderr goes to, for `_tail`."""

    def __init__(self, args, **kwargs):
        self.stderr_file = kwargs.get("stderr")
        super().__init__(args, **kwargs)


def spawn_query_service(env: dict[str, str], port: int) -> subprocess.Popen:
    """`python -m services.query` on 127.0.0.1:`port` (wait for it with `wait_http_ready`)."""
    return _Proc(
        [sys.executable, "-m", "services.query"],
        cwd=ROOT,
        env={**env, "ENGRAM_HOST": "127.0.0.1", "ENGRAM_PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=_log_file(),
    )


def stop_processes(procs: Sequence[subprocess.Popen], timeout: float = 30.0) -> list[str]:
    """SIGTERM each process we started (by pid), wait, SIGKILL stragglers; returns their stderr tails."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    tails = []
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        tails.append(_tail(p))
        if getattr(p, "stderr_file", None) is not None:
            p.stderr_file.close()
    return tails


def check_alive(procs: Sequence[subprocess.Popen], what: str) -> None:
    """Raise RuntimeError with the stderr tail when one of `procs` has exited."""
    for p in procs:
        if p.poll() is not None:
            tail = _tail(p, 3000)
            raise RuntimeError(f"{what} exited with {p.returncode}:\n{tail}")


async def wait_http_ready(base_url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Poll `GET /readyz` of the service at `base_url` until it answers 200; raise with the process's
    stderr if it dies or is not ready within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    # one probe per attempt (the loop is the retry), each bounded as the aiohttp session's was (300 s)
    async with AsyncEngram(base_url, max_retries=0, timeout=300.0) as memory:
        while time.monotonic() < deadline:
            check_alive([proc], "query service")
            with contextlib.suppress(ApiError, ConnectionFailed):
                await memory.ready()
                return
            await _sleep(0.2)
    raise RuntimeError(f"{base_url}/readyz not ready within {timeout:.0f}s")


async def status_of(memory: AsyncEngram | ClientPool, call: Call[Any], ok: int, timeout: float) -> int:
    """Send `call` once (the client has max_retries=0) and answer the HTTP status as the aiohttp harnesses
    recorded it: `ok` (the route's one success status: 200, or 202 for ingest) when it succeeded, the
    problem's `ApiError.status`, or 0 for no answer (refused, dropped, or not done within `timeout`
    seconds in all, waiting for a free connection included, as aiohttp's ClientTimeout(total=...))."""
    try:
        async with asyncio.timeout(timeout):
            await memory.call(call)
    except ApiError as exc:
        return exc.status
    except (ConnectionFailed, TimeoutError, OSError):
        return 0
    return ok


def http_pool(max_connections: int, timeout: float, **kwargs: Any) -> httpx.AsyncClient:
    """The httpx.AsyncClient a harness hands to `AsyncEngram(http_client=...)`: at most `max_connections`
    connections, every one of them kept alive between requests (like the aiohttp TCPConnector the harnesses
    used before, which kept them all for 15 s; httpx keeps only 20, for 5 s, unless told), and `timeout`
    seconds per connect, write, read and wait for a pooled connection. HTTP/1.1, as the service speaks.

    The client's own `timeout=` is not applied to a client passed in: this one's is. Fine for a few
    connections; for more, or many requests at once, use `ClientPool` (httpcore's pool gets slow).
    """
    return httpx.AsyncClient(
        timeout=timeout,
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=15.0
        ),
        **kwargs,
    )


class ClientPool:
    """At most `size` requests in flight on at most `size` keep-alive connections, as one aiohttp
    TCPConnector(limit=size) gave: `size` AsyncEngram clients, each on its own one-connection
    httpx.AsyncClient, lent to one request at a time (the most recently used first; a request waits while
    all are busy). `await pool.call(call)` is `AsyncEngram.call`.

    Why not one httpx.AsyncClient with max_connections=size: httpcore 1.0's pool re-checks every pooled
    connection (an is_idle scan per connection, socket polls included) whenever a request starts or ends,
    so the client's CPU per request grows with the pool, about twice that of one pool per connection at 16
    connections and worse beyond, with a long latency tail; a benchmark whose client shares the cores with
    the service must not spend them there. `kwargs` go to every AsyncEngram (api_key, max_retries, ...).
    """

    def __init__(self, base_url: str, size: int, timeout: float, **kwargs: Any):
        tls = ssl.create_default_context()  # built once: httpx would load the CA bundle per client (~70 ms)
        self._https = [http_pool(1, timeout, verify=tls) for _ in range(size)]
        self._idle = [AsyncEngram(base_url, http_client=h, timeout=timeout, **kwargs) for h in self._https]
        self._free = asyncio.Semaphore(size)

    async def call(self, call: Call[T]) -> T:
        async with self._free:
            memory = self._idle.pop()
            try:
                return await memory.call(call)
            finally:
                self._idle.append(memory)

    async def aclose(self) -> None:
        for h in self._https:
            await h.aclose()

    async def __aenter__(self) -> ClientPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


# --- statistics ---------------------------------------------------------------------------------------
def percentile_ms(samples_s: Sequence[float], q: float) -> float:
    """The q-th percentile of durations given in seconds, in milliseconds (NaN when empty)."""
    return float(np.percentile(np.asarray(samples_s) * 1000.0, q)) if len(samples_s) else math.nan


def bootstrap_ci(
    values: np.ndarray, *, iterations: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (float[n]); (nan, nan) when empty."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(iterations, values.size))
    means = values[idx].mean(axis=1)
    lo, hi = np.percentile(means, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


# --- inputs -------------------------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    """`"1,8,16"` → [1, 8, 16]: an argparse `type` for comma-separated counts (ValueError on a bad one,
    which argparse reports as an invalid value)."""
    return [int(x) for x in text.split(",")]


def migration_episode(ns: str, i: int) -> dict[str, Any]:
    """Episode `i` of namespace `ns` as the cluster benchmarks record it (JSON-shaped): a schema
    migration of one of six tables, one in three a failure, the user one of seven."""
    words = ["orders", "users", "invoices", "billing", "search", "login"]
    return {
        "episode_id": f"{ns}-{i}",
        "task": {"description": f"migrate the {words[i % 6]} table schema, step {i}", "category": "db"},
        "outcome": "success" if i % 3 else "failure",
        "solution": f"alembic revision {i} with a backfill",
        "user_id": f"user-{i % 7}",
        "feedback": {"reward": 1.0 if i % 3 else 0.0},
    }


async def record_migrations(redis: Any, prefix: str, namespaces: Sequence[str], per_namespace: int) -> None:
    """Publish `migration_episode(ns, 0 .. per_namespace - 1)` of every namespace through the SDK, one
    episode at a time (`EngramClient.record`) on the Redis client `redis` (keys under `prefix`)."""
    from shared.sdk import EngramClient

    for ns in namespaces:
        client = EngramClient(redis, namespace=ns, prefix=prefix)
        for i in range(per_namespace):
            await client.record(migration_episode(ns, i))


# --- output -------------------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (also readable in a terminal)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return "–"
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(headers)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in text]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """What the numbers were measured on (CPU count, memory, Python, load at the start)."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError):
        info["loadavg_1m"] = os.getloadavg()[0]
    with contextlib.suppress(OSError, ValueError, IndexError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        info["mem_gib"] = round(int(meminfo[0].split()[1]) / 1024 / 1024, 1)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    return info


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.floating | np.integer):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


class Timer:
    """`with Timer() as t: ...; t.seconds`."""

    seconds: float = 0.0

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


async def poll_until(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
    on_tick: Callable[[], Any] | None = None,
) -> None:
    """Await `predicate()` (an async callable returning truthy) until true; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        if await predicate():
            return
        if on_tick is not None:
            on_tick()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await _sleep(interval)


# --- measurement helpers of the perf phases ------------------------------------------------------------
async def concurrent(n_clients: int, n_requests: int, fn: Callable[[int], Any]) -> tuple[list[float], float]:
    """Run `await fn(i)` for i < n_requests from n_clients closed-loop clients; (latencies s, wall s)."""
    latencies: list[float] = []
    counter = iter(range(n_requests))

    async def client() -> None:
        for i in counter:
            t0 = time.perf_counter()
            await fn(i)
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(n_clients)))
    return latencies, time.perf_counter() - started


async def redis_cpu(r: Any) -> float:
    """Redis's user + system CPU seconds so far (INFO cpu), for deltas around a measurement."""
    info = await r.info("cpu")
    return float(info.get("used_cpu_user", 0)) + float(info.get("used_cpu_sys", 0))


def proc_cpu(procs: Sequence[subprocess.Popen]) -> float:
    """CPU seconds of `procs` so far (Linux /proc): the run time of each of their live threads in
    nanoseconds (`/proc/PID/task/TID/schedstat`), or, where that cannot be read, user + system time
    from `/proc/PID/stat` in clock ticks (10 ms: a tiny run's worker could show none at all, and a
    ratio to it was NaN). 0 for a process that is gone. A thread that ended between two readings is
    not in the second; the workers' threads (model pools, the event loop) live as long as they do."""
    total = 0.0
    for proc in procs:
        try:
            threads = 0.0
            for tid in os.listdir(f"/proc/{proc.pid}/task"):
                with open(f"/proc/{proc.pid}/task/{tid}/schedstat") as fh:
                    threads += int(fh.read().split()[0]) / 1e9
            total += threads
            continue
        except (OSError, IndexError, ValueError):
            pass
        try:
            with open(f"/proc/{proc.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


async def drop_prefix(r: Any, keys: Any) -> None:
    """Drop every index named under `keys.prefix` (with its documents) and every other key under it."""
    from redis.exceptions import ResponseError

    for name in await r.execute_command("FT._LIST"):
        if name.decode().startswith(keys.prefix):
            with contextlib.suppress(ResponseError):
                await r.execute_command("FT.DROPINDEX", name, "DD")
    async for key in r.scan_iter(match=f"{keys.prefix}*", count=5000):
        await r.unlink(key)


# --- recall-quality harnesses (bench.locomo, bench.bfcl): publish, wait, ask ------------------------------
async def publish_episodes(
    redis_url: str, prefix: str, episodes: Mapping[str, Sequence[dict[str, Any]]]
) -> int:
    """Publish one EpisodeCompleted per JSON-shaped episode through the SDK (`EngramClient.publish`, in
    batches of 200), `episodes` = {namespace: [episode, ...]}, each with `episode_id` and `completed_at`
    (UTC epoch seconds, also the event's occurred_at); returns the number published. InvalidEpisode if
    one is not valid (`engram_episodic.validation.parse_episode`)."""
    from engram_episodic.events import EpisodeCompleted
    from engram_episodic.validation import parse_episode
    from shared.redis_conn import connect
    from shared.sdk import EngramClient

    r = connect(redis_url)
    n = 0
    try:
        for namespace, items in episodes.items():
            client = EngramClient(r, namespace=namespace, prefix=prefix)
            events = [
                EpisodeCompleted(
                    namespace=namespace,
                    episode_id=str(e["episode_id"]),
                    occurred_at=float(e["completed_at"]),
                    episode=parse_episode(e),
                )
                for e in items
            ]
            for start in range(0, len(events), 200):
                await client.publish(events[start : start + 200])
            n += len(events)
    finally:
        await r.aclose()
    return n


async def wait_recallable(
    redis_url: str,
    prefix: str,
    counts: Mapping[str, int],
    workers: Sequence[subprocess.Popen],
    *,
    timeout: float,
) -> float:
    """Wait until every namespace of `counts` ({namespace: episodes}) holds that many recallable episodes
    in the index and the consumer group has nothing undelivered or unacked; returns the seconds it took.
    RuntimeError if a worker exits, TimeoutError after `timeout` seconds.

    Why the group too: a document is counted as soon as it is written, while later events of the same
    episode may still wait in the stream."""
    from tqdm import tqdm

    from shared import streams
    from shared.index import Scope, count, index_exists
    from shared.keys import Keys
    from shared.redis_conn import connect
    from shared.settings import Settings
    from shared.tags import BLAKE2B  # namespace-only scopes: no id is digested

    keys = Keys(prefix)
    total = sum(counts.values())
    r = connect(redis_url)
    started = time.perf_counter()
    bar = tqdm(total=total, desc="project (workers)", unit="ep", leave=False, disable=None)
    try:

        async def done() -> bool:
            check_alive(workers, "consolidator worker")
            if not await index_exists(r, keys.episode_index_alias):
                return False
            n = 0
            for namespace in counts:
                n += await count(r, keys.episode_index_alias, Scope(namespace=namespace, tags=BLAKE2B))
            bar.update(n - bar.n)
            if n < total:
                return False
            info = await streams.StreamGroup(r, keys.stream, Settings().consumer_group).info()
            return not (info["lag"] or info["pending"])

        await poll_until(done, timeout=timeout, interval=0.25, what=f"{total} episodes projected")
    finally:
        bar.close()
        await r.aclose()
    return time.perf_counter() - started


async def recall_ranked(
    base_url: str,
    tokens: Mapping[str, str],
    jobs: Sequence[tuple[str, str, Mapping[str, Any]]],
    *,
    concurrency: int,
    desc: str,
) -> tuple[list[list[str]], float]:
    """POST /v1/recall for every job (namespace, query text, request options such as top_k and as_of);
    returns the ranked episode ids per job and the p50 latency (seconds).

    One AsyncEngram per namespace (its API key from `tokens`), all over one pool of `concurrency`
    keep-alive connections; each request is sent once (a retry would count in the latency) and read as
    JSON. ApiError (status, problem) on any answer but 200."""
    from tqdm import tqdm

    from engram_episodic.client import Calls
    from engram_episodic.options import RecallOptions

    results: list[list[str]] = [[] for _ in jobs]
    latencies: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(jobs), desc=desc, unit="q", leave=False, disable=None)

    async def one(i: int, text: str, options: Mapping[str, Any], memory: AsyncEngram) -> None:
        call = Calls.recall(
            text, **cast(RecallOptions, dict(options))
        ).as_json()  # ids only: no per-hit parsing
        async with sem:
            t0 = time.perf_counter()
            payload = await memory.call(call)
            latencies.append(time.perf_counter() - t0)
        results[i] = [item["episode"]["episode_id"] for item in payload["results"]]
        bar.update(1)

    try:
        # the aiohttp session this replaced allowed 300 s per request and at most 100 connections
        async with http_pool(max(1, min(concurrency, 100)), 300.0) as http:
            clients = {
                ns: AsyncEngram(base_url, api_key=token, max_retries=0, http_client=http)
                for ns, token in tokens.items()
            }
            await asyncio.gather(
                *(one(i, text, opts, clients[ns]) for i, (ns, text, opts) in enumerate(jobs))
            )
    finally:
        bar.close()
    return results, float(np.median(latencies)) if latencies else math.nan
