"""`make chaos`: a known workload published and recalled while processes are killed, paused and restarted.

One run per `appendfsync` mode (`always`, then `everysec`), each against its own embedded Redis with AOF
in a temporary directory, on loopback only, bounded in time:

1. **Throughput probe** (no faults): `--probe` episodes published as fast as `--publishers` SDK clients
   can, to measure what `appendfsync always` costs.
2. **Faulted run**: `--episodes` episodes with known ids, published at a steady rate over `--seconds`
   by `--publishers` SDK clients (a failed publish is surfaced as `PublishError` and retried by the
   "agent" with the same `episode_id`), consumed by `--workers` consolidator processes, recalled over
   HTTP by `--recallers` clients, while the fault schedule runs: kill -9 a worker (restarted), SIGSTOP
   Redis for `--pause` seconds, kill -9 and restart the query service, kill -9 Redis and restart it from
   its AOF, kill -9 every worker (restarted). A monitor polls `/readyz` throughout.
3. **Count**: after the stream drains — episodes the SDK reported as published, distinct episodes
   indexed, missing ones, duplicates (index documents beyond one per episode id), dead letters, publish
   errors surfaced, recall errors and p50/p99 during faults and outside them, readiness during each
   Redis outage and the time to ready after it, Redis memory at start and end, stream length.

Prints a table and writes `bench/chaos-results.json`. Exit status 1 when `always` lost an episode the
SDK reported as published, or when a duplicate was indexed.

    python -m bench.chaos                        # defaults: 10,000 episodes over 40 s per mode
    python -m bench.chaos --episodes 2000 --seconds 15 --modes always
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    machine,
    percentile_ms,
    service_env,
    status_of,
    stop_processes,
    table,
    wait_http_ready,
    write_json,
)
from deploy.embedded_redis import EmbeddedRedis, free_port
from engram_episodic import AsyncEngram
from engram_episodic.client import Calls
from engram_episodic.errors import PublishError
from shared import streams
from shared.index import Scope, count, current_generation
from shared.keys import Keys
from shared.redis_conn import connect
from shared.sdk import EngramClient
from shared.tags import BLAKE2B  # namespace-only scopes: no id is digested

NAMESPACE = "chaos"
PREFIX = "chaos:"
SPAN_GRACE = 2.0
"""Seconds after a fault ends that still count as 'during the fault' (reconnects, reclaims)."""
TOPICS = [
    "renew the tls certificate",
    "fix the flaky login test",
    "migrate the orders table",
    "tune the cache eviction policy",
    "rotate the api keys",
    "upgrade the postgres cluster",
]


@dataclass
class Run:
    """What one mode's faulted run observed (times are time.monotonic())."""

    published: set[str] = field(default_factory=set)
    failed_attempts: int = 0
    ids_with_failures: set[str] = field(default_factory=set)
    recalls: list[tuple[float, float, bool]] = field(default_factory=list)  # (start, seconds, ok)
    ready: list[tuple[float, bool]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    outages: list[tuple[float, float, float]] = field(default_factory=list)
    """Redis away: (stopped or killed, SIGCONT sent or restart begun, answering again)."""


def episode(i: int, publisher: int) -> dict[str, Any]:
    return {
        "episode_id": f"ep-{i:06d}",
        "agent_id": f"agent-{publisher}",
        "user_id": f"user-{i % 17}",
        "task": {"description": f"{TOPICS[i % len(TOPICS)]} (case {i})", "category": "ops"},
        "outcome": "success" if i % 3 else "failure",
        "feedback": {"reward": (i % 10) / 10},
        "importance": 1 + i % 10,
        "solution": f"solution text {i}",
    }


# --- workload -----------------------------------------------------------------------------------------
async def publisher(
    url: str,
    p: int,
    ids: list[int],
    rate: float,
    run: Run,
    give_up_at: float,
    prefix: str = PREFIX,
    master_key: bytes | None = None,
) -> None:
    """Publish `ids` at `rate` per second; a PublishError is counted and retried (same episode_id).
    With `master_key` the events are sealed (crypto-shredding, docs/reliability.md "Erasure")."""
    async with EngramClient.connect(
        url, namespace=NAMESPACE, prefix=prefix, publish_timeout=5.0, master_key=master_key
    ) as client:
        start = time.monotonic()
        for k, i in enumerate(ids):
            if rate > 0:
                delay = start + k / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            ep_id = f"ep-{i:06d}"
            while True:
                try:
                    await client.record(episode(i, p))
                    run.published.add(ep_id)
                    break
                except PublishError:
                    run.failed_attempts += 1
                    run.ids_with_failures.add(ep_id)
                    if time.monotonic() > give_up_at:
                        break
                    await asyncio.sleep(0.2)


async def recaller(base: str, stop: asyncio.Event, run: Run, rate: float) -> None:
    """POST /v1/recall at `rate` per second; ok = 200 within 5 s, each request sent once (no retry)."""
    rng = random.Random(os.getpid())
    async with AsyncEngram(base, max_retries=0, timeout=5.0) as memory:
        while not stop.is_set():
            t0 = time.monotonic()
            call = Calls.recall(rng.choice(TOPICS), top_k=5).as_json()
            ok = await status_of(memory, call, 200, timeout=5.0) == 200
            run.recalls.append((t0, time.monotonic() - t0, ok))
            await asyncio.sleep(max(0.0, 1 / rate - (time.monotonic() - t0)))


async def ready_monitor(base: str, stop: asyncio.Event, run: Run) -> None:
    """GET /readyz every 0.2 s; ok = 200 within 1 s (a 503 'not ready' or no answer is not ready)."""
    async with AsyncEngram(base, max_retries=0, timeout=1.0) as memory:
        while not stop.is_set():
            ok = await status_of(memory, Calls.ready(), 200, timeout=1.0) == 200
            run.ready.append((time.monotonic(), ok))
            await asyncio.sleep(0.2)


# --- the stack and its faults -------------------------------------------------------------------------
class Stack:
    def __init__(self, mode: str, data_dir: Path, workers: int, master_key: bytes | None = None):
        self.redis = EmbeddedRedis(port=free_port(), data_dir=data_dir / "redis", appendfsync=mode)
        self.master_key = master_key
        self.log_dir = data_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.env: dict[str, str] = {}
        self.n_workers = workers
        self.workers: list[subprocess.Popen] = []
        self.query: subprocess.Popen | None = None
        self.port = free_port()
        self.generation = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.redis.start()
        self.env = service_env(
            self.redis.url,
            PREFIX,
            "hashing",
            ENGRAM_EMBED_DIM="256",
            ENGRAM_DEFAULT_NAMESPACE=NAMESPACE,
            ENGRAM_LEASE_MS="2000",
            ENGRAM_STREAM_RETENTION="20s",
        )
        if self.master_key is not None:
            self.env["ENGRAM_MASTER_KEY"] = base64.b64encode(self.master_key).decode()
        self.workers = self.spawn_workers(self.n_workers)
        await self.start_query()

    def _logged(self, cmd: list[str], env: dict[str, str], name: str) -> subprocess.Popen:
        # stderr goes to a file, never an unread pipe: a full pipe would freeze the process mid-fault
        with open(self.log_dir / f"{name}.log", "ab") as log:
            return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)

    def spawn_workers(self, n: int) -> list[subprocess.Popen]:
        out = []
        for _ in range(n):
            self.generation += 1
            name = f"chaos-w{self.generation}"
            out.append(
                self._logged(
                    [sys.executable, "-m", "services.consolidator", "run"],
                    {**self.env, "ENGRAM_CONSUMER_NAME": name},
                    name,
                )
            )
        return out

    async def start_query(self) -> None:
        self.generation += 1
        self.query = self._logged(
            [sys.executable, "-m", "services.query"],
            {**self.env, "ENGRAM_HOST": "127.0.0.1", "ENGRAM_PORT": str(self.port)},
            f"query-{self.generation}",
        )
        await wait_http_ready(self.base, self.query, timeout=60)

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
            for p in sorted(self.log_dir.glob("*.log"))
            if p.stat().st_size
        )

    def kill_worker(self, i: int) -> None:
        self.workers[i].kill()
        stop_processes([self.workers[i]], timeout=5)
        self.workers[i] = self.spawn_workers(1)[0]

    def stop(self) -> None:
        stop_processes([*self.workers, *([self.query] if self.query else [])], timeout=15)
        with contextlib.suppress(ProcessLookupError, TypeError, AttributeError):
            os.kill(self.redis.process.pid, signal.SIGCONT)
        self.redis.stop()


async def faults(stack: Stack, run: Run, seconds: float, pause: float) -> None:
    """The fault schedule, spread over the publishing window."""
    t0 = time.monotonic()

    async def at(fraction: float) -> None:
        await asyncio.sleep(max(0.0, t0 + fraction * seconds - time.monotonic()))

    def log(kind: str, start: float, **extra: Any) -> None:
        run.faults.append(
            {
                "fault": kind,
                "at_s": round(start - t0, 2),
                "lasted_s": round(time.monotonic() - start, 2),
                **extra,
            }
        )

    await at(0.10)
    s = time.monotonic()
    stack.kill_worker(0)
    log("kill -9 worker 0, restart", s)

    await at(0.22)
    s = time.monotonic()
    os.kill(stack.redis.process.pid, signal.SIGSTOP)
    await asyncio.sleep(pause)
    os.kill(stack.redis.process.pid, signal.SIGCONT)
    run.outages.append((s, time.monotonic(), time.monotonic()))
    log(f"SIGSTOP redis {pause:g}s, SIGCONT", s)

    await at(0.38)
    s = time.monotonic()
    assert stack.query is not None
    stack.query.kill()
    stop_processes([stack.query], timeout=5)
    await stack.start_query()
    log("kill -9 query service, restart", s)

    await at(0.52)
    s = time.monotonic()
    stack.redis.kill()
    await asyncio.sleep(1.0)
    restart = time.monotonic()
    await asyncio.to_thread(stack.redis.start)  # replays the AOF; returns once PING and FT._LIST answer
    run.outages.append((s, restart, time.monotonic()))
    log("kill -9 redis, restart from AOF", s)

    await at(0.70)
    s = time.monotonic()
    for i in range(len(stack.workers)):
        stack.workers[i].kill()
    stop_processes(stack.workers, timeout=5)
    stack.workers = stack.spawn_workers(stack.n_workers)
    log("kill -9 every worker, restart", s)

    await at(0.85)
    s = time.monotonic()
    stack.kill_worker(len(stack.workers) - 1)
    log(f"kill -9 worker {len(stack.workers) - 1}, restart", s)


# --- counting -----------------------------------------------------------------------------------------
async def drained(r, keys: Keys, group: str) -> bool:
    consumers = streams.StreamGroup(r, keys.stream, group)
    info = await consumers.info()
    if info["pending"] or await consumers.lag():
        return False
    reply = await r.execute_command("FT.INFO", keys.episode_index_alias)
    fields = dict(zip(reply[::2], reply[1::2], strict=False))
    return fields.get(b"indexing") in (b"0", 0)


async def wait_drained(url: str, keys: Keys, timeout: float) -> float:
    r = connect(url)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            with contextlib.suppress(Exception):
                if await drained(r, keys, "consolidator"):
                    return time.monotonic() - t0
            await asyncio.sleep(0.25)
        return float("nan")
    finally:
        await r.aclose()


async def redis_memory(url: str) -> int:
    r = connect(url)
    try:
        return int((await r.info("memory"))["used_memory"])
    finally:
        await r.aclose()


async def tally(url: str, run: Run, n: int) -> dict[str, Any]:
    keys = Keys(PREFIX)
    r = connect(url)
    try:
        gen = await current_generation(r, keys)
        all_ids = [f"ep-{i:06d}" for i in range(n)]
        async with r.pipeline(transaction=False) as pipe:
            for ep_id in all_ids:
                pipe.exists(keys.episode_doc(gen, NAMESPACE, ep_id))
            present = {ep_id for ep_id, e in zip(all_ids, await pipe.execute(), strict=True) if e}
        indexed = await count(r, keys.episode_index_alias, Scope(namespace=NAMESPACE, tags=BLAKE2B))
        missing = sorted(run.published - present)
        return {
            "reported_published": len(run.published),
            "indexed_distinct": len(present),
            "index_documents": indexed,
            "missing": len(missing),
            "missing_ids": missing[:50],
            "duplicates": indexed - len(present),
            "indexed_not_reported": len(present - run.published),
            "dead_letters": await streams.length(r, keys.dead_letters),
            "stream_length_end": await streams.length(r, keys.stream),
            "publish_errors_surfaced": run.failed_attempts,
            "episodes_with_a_failed_attempt": len(run.ids_with_failures),
        }
    finally:
        await r.aclose()


async def ready_again(run: Run, timeout: float) -> None:
    """Wait until the monitor has seen /readyz answer 200 after the last Redis outage."""
    last = run.outages[-1][2] if run.outages else 0.0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(ok and t > last for t, ok in run.ready):
        await asyncio.sleep(0.2)


def _latency(rows: list[tuple[float, bool]]) -> dict[str, Any]:
    good = [d for d, ok in rows if ok]
    return {
        "requests": len(rows),
        "errors": sum(1 for _, ok in rows if not ok),
        "p50_ms": round(percentile_ms(good, 50), 1),
        "p99_ms": round(percentile_ms(good, 99), 1),
        "max_ms": round(max(good) * 1000, 1) if good else float("nan"),
    }


def recall_figures(run: Run, spans: list[tuple[float, float]]) -> dict[str, Any]:
    """Recall latency (successful requests) and errors, started during a fault span or outside every one."""

    def in_fault(t: float) -> bool:
        return any(a <= t <= b for a, b in spans)

    return {
        "during_faults": _latency([(d, ok) for t, d, ok in run.recalls if in_fault(t)]),
        "steady": _latency([(d, ok) for t, d, ok in run.recalls if not in_fault(t)]),
    }


def readiness_figures(run: Run) -> list[dict[str, Any]]:
    """Per Redis outage: was /readyz false during it, and how long after it until it was true again."""
    out = []
    for down, up, back in run.outages:
        during = [ok for t, ok in run.ready if down + 0.3 <= t <= up]  # 0.3 s: a request in flight
        after = [t for t, ok in run.ready if t > back and ok]
        out.append(
            {
                "outage_s": round(up - down, 2),
                "restart_s": round(back - up, 2),
                "samples_during": len(during),
                "ready_false_during": bool(during) and not any(during),
                "ready_again_after_s": round(after[0] - back, 2) if after else None,
            }
        )
    return out


# --- one mode -----------------------------------------------------------------------------------------
async def probe(mode: str, n: int, publishers: int, master_key: bytes | None = None) -> dict[str, float]:
    """Episodes per second the SDK gets accepted with this fsync mode, by 1 and by `publishers`
    concurrent publishers (no workers, no faults). One publisher waits for every fsync in turn; several
    share one (Redis fsyncs once per event-loop turn)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="engram-chaos-probe-") as tmp:
        server = EmbeddedRedis(port=free_port(), data_dir=Path(tmp), appendfsync=mode)
        server.start()
        try:
            for conc, count_ in ((1, n // 4), (publishers, n)):
                run = Run()
                warm = Run()
                await publisher(
                    server.url,
                    0,
                    list(range(n, n + 50)),
                    0,
                    warm,
                    time.monotonic() + 60,
                    prefix="warmup:",
                    master_key=master_key,
                )
                t0 = time.monotonic()
                await asyncio.gather(
                    *(
                        publisher(
                            server.url,
                            p,
                            list(range(p, count_, conc)),
                            0,
                            run,
                            time.monotonic() + 60,
                            prefix=f"probe{conc}:",
                            master_key=master_key,
                        )
                        for p in range(conc)
                    )
                )
                out[f"publishers_{conc}"] = round(len(run.published) / (time.monotonic() - t0), 1)
            return out
        finally:
            server.stop()


async def one_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    master_key = os.urandom(32) if args.encryption == "on" else None
    rates = await probe(mode, args.probe, args.publishers, master_key)
    print(
        f"chaos ◆ {mode}: probe "
        + " ◆ ".join(f"{v:,.0f} episodes/s with {k.replace('_', ' ')}" for k, v in rates.items()),
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix=f"engram-chaos-{mode}-") as tmp:
        stack = Stack(mode, Path(tmp), args.workers, master_key)
        run = Run()
        stop = asyncio.Event()
        try:
            await stack.start()
            mem_start = await redis_memory(stack.redis.url)
            t0 = time.monotonic()
            per = args.episodes / args.publishers / args.seconds
            give_up = t0 + args.seconds + 60
            pubs = [
                asyncio.create_task(
                    publisher(
                        stack.redis.url,
                        p,
                        list(range(p, args.episodes, args.publishers)),
                        per,
                        run,
                        give_up,
                        master_key=master_key,
                    )
                )
                for p in range(args.publishers)
            ]
            bg = [
                asyncio.create_task(recaller(stack.base, stop, run, args.recall_rate))
                for _ in range(args.recallers)
            ]
            bg.append(asyncio.create_task(ready_monitor(stack.base, stop, run)))
            await faults(stack, run, args.seconds, args.pause)
            await asyncio.gather(*pubs)
            await ready_again(run, timeout=60)
            await asyncio.sleep(args.settle)  # steady-state recalls after the last fault
            publish_s = time.monotonic() - t0
            drain_s = await wait_drained(stack.redis.url, Keys(PREFIX), args.drain_timeout)
            stop.set()
            await asyncio.gather(*bg)
            dead_workers = sum(1 for w in stack.workers if w.poll() is not None)
            counts = await tally(stack.redis.url, run, args.episodes)
            mem_end = await redis_memory(stack.redis.url)
            if args.verbose:
                print(stack.log_tail(), flush=True)
        finally:
            stop.set()
            stack.stop()
    spans = [(t0 + f["at_s"], t0 + f["at_s"] + f["lasted_s"] + SPAN_GRACE) for f in run.faults]
    for f, (a, b) in zip(run.faults, spans, strict=True):
        f["recall"] = _latency([(d, ok) for t, d, ok in run.recalls if a <= t <= b])
    return {
        "mode": mode,
        "encryption": args.encryption,
        "probe_episodes_per_s": rates,
        "publish_seconds": round(publish_s, 1),
        "drain_seconds_after_publish": round(drain_s, 1),
        **counts,
        "workers_dead_at_end": dead_workers,
        "recall": recall_figures(run, spans),
        "readiness": readiness_figures(run),
        "faults": run.faults,
        "redis_used_memory_start_mb": round(mem_start / 2**20, 1),
        "redis_used_memory_end_mb": round(mem_end / 2**20, 1),
    }


def report(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        rec = r["recall"]
        ready = r["readiness"]
        probe_ = r["probe_episodes_per_s"]
        rows.append(
            [
                r["mode"],
                " / ".join(f"{v:,.0f}" for v in probe_.values()),
                r["reported_published"],
                r["indexed_distinct"],
                r["missing"],
                r["duplicates"],
                r["dead_letters"],
                r["publish_errors_surfaced"],
                f"{rec['during_faults']['errors']}/{rec['during_faults']['requests']}",
                rec["during_faults"]["p99_ms"],
                rec["during_faults"]["max_ms"],
                rec["steady"]["p99_ms"],
                "yes" if ready and all(o["ready_false_during"] for o in ready) else "no",
                max((o["ready_again_after_s"] or float("nan") for o in ready), default=float("nan")),
                f"{r['redis_used_memory_start_mb']}→{r['redis_used_memory_end_mb']}",
            ]
        )
    return table(
        [
            "fsync",
            "probe ep/s (1 / N pub)",
            "published",
            "indexed",
            "missing",
            "dupes",
            "dead",
            "pub errors",
            "recall err (faults)",
            "p99 faults ms",
            "max faults ms",
            "p99 steady ms",
            "not ready while away",
            "ready again s",
            "redis MB",
        ],
        rows,
    )


async def main_async(args: argparse.Namespace) -> int:
    results = []
    for mode in args.modes:
        print(
            f"chaos ◆ {mode}: {args.episodes} episodes over {args.seconds:g}s, {args.publishers} publishers, "
            f"{args.workers} workers, {args.recallers} recallers",
            flush=True,
        )
        results.append(await one_mode(mode, args))
        r = results[-1]
        print(
            f"chaos ◆ {mode}: published {r['reported_published']} ◆ indexed {r['indexed_distinct']} ◆ "
            f"missing {r['missing']} ◆ duplicates {r['duplicates']} ◆ dead letters {r['dead_letters']}",
            flush=True,
        )
    by_mode = {r["mode"]: r for r in results}
    cost: dict[str, float] = {}
    if "always" in by_mode and "everysec" in by_mode:
        slow, fast = by_mode["always"]["probe_episodes_per_s"], by_mode["everysec"]["probe_episodes_per_s"]
        cost = {k: round(1 - slow[k] / fast[k], 3) for k in fast}
    print()
    print(report(results))
    for k, c in cost.items():
        print(
            f"appendfsync always vs everysec, {k.replace('_', ' ')}: "
            f"{by_mode['always']['probe_episodes_per_s'][k]:,.0f} vs {by_mode['everysec']['probe_episodes_per_s'][k]:,.0f} "
            f"episodes/s ({c:+.0%} throughput cost)"
        )
    failed = [
        r["mode"]
        for r in results
        if r["duplicates"]
        or (r["mode"] == "always" and r["missing"])
        or r["workers_dead_at_end"]
        or not all(o["ready_false_during"] for o in r["readiness"])
    ]
    write_json(
        Path(args.out),
        {
            "machine": machine(),
            "args": vars(args),
            "always_throughput_cost": cost,
            "results": results,
            "ok": not failed,
            "generated_at": time.time(),
        },
    )
    print(f"\nresults written to {args.out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=40.0, help="publishing window per mode")
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--recallers", type=int, default=2)
    p.add_argument("--recall-rate", type=float, default=10.0, help="requests per second per recaller")
    p.add_argument("--pause", type=float, default=4.0, help="seconds Redis stays SIGSTOPped")
    p.add_argument("--probe", type=int, default=12_000, help="episodes of the unfaulted throughput probe")
    p.add_argument("--settle", type=float, default=3.0, help="seconds of steady recall after the last fault")
    p.add_argument("--drain-timeout", type=float, default=120.0)
    p.add_argument("--modes", nargs="+", choices=("always", "everysec"), default=["always", "everysec"])
    p.add_argument("--verbose", action="store_true", help="print the tail of every service log")
    p.add_argument(
        "--encryption",
        choices=("off", "on"),
        default="off",
        help="on: every process gets a fresh master key, so the stream is sealed (crypto-shredding)",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "chaos-results.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
