"""`make load`: the query service under a rising open-loop mix of ingest and recall, on loopback.

Starts its own embedded Redis (AOF everysec), `--workers` consolidator processes and the query service,
seeds `--seed` episodes over HTTP, then offers requests at each rate of `--rates` (requests per second)
for `--step-seconds`: a share `--ingest-share` are `POST /v1/episodes` (one episode each, new ids),
the rest `POST /v1/recall`. Requests are scheduled open-loop (sent on time whether or not earlier ones
returned) and their latency counts from the scheduled instant, so a saturated server shows up as
latency instead of silently lowering the offered rate (no coordinated omission).

A step *holds* when every request succeeded (2xx; a 429 from backpressure or a timeout is an error)
and the p99 of both kinds stays under `--p99-ms`. The report names the highest rate held; the run
stops at the first step that does not hold. Prints a table and writes `bench/load-results.json`.

    python -m bench.load                          # rates 25..800 req/s, 20 s each, p99 bound 250 ms
    python -m bench.load --rates 50 100 --step-seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    ClientPool,
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
from engram_episodic.client import Call, Calls
from engram_episodic.options import RecallOptions
from shared import streams
from shared.keys import Keys
from shared.redis_conn import connect

PREFIX = "load:"
TOPICS = [
    "renew the tls certificate",
    "fix the flaky login test",
    "migrate the orders table",
    "tune the cache eviction policy",
    "rotate the api keys",
    "upgrade the postgres cluster",
    "profile the slow checkout endpoint",
    "bump the api version",
]


def episode(i: int) -> dict[str, Any]:
    return {
        "episode_id": f"load-{i}",
        "agent_id": f"agent-{i % 8}",
        "user_id": f"user-{i % 31}",
        "task": {"description": f"{TOPICS[i % len(TOPICS)]} (case {i})", "category": "ops"},
        "outcome": "success" if i % 4 else "failure",
        "feedback": {"reward": (i % 10) / 10},
        "importance": 1 + i % 10,
        "solution": f"what worked in case {i}",
    }


def request(kind: str, i: int, rng: random.Random) -> Call[Any]:
    """The request of one scheduled slot, built (the episode validated client-side) before its instant."""
    if kind == "ingest":
        return Calls.record_parts(episode(i), {})[1][0]
    options: RecallOptions = {"top_k": 5, "agent_id": f"agent-{rng.randrange(8)}"}
    return Calls.recall(
        rng.choice(TOPICS), **options
    ).as_json()  # the answer is read, never parsed into types


async def one(
    memory: ClientPool,
    kind: str,
    call: Call[Any],
    scheduled: float,
    timeout: float,
    out: list[tuple[str, float, int]],
) -> None:
    status = await status_of(memory, call, 202 if kind == "ingest" else 200, timeout)
    out.append((kind, time.monotonic() - scheduled, status))


async def step(
    base: str, rate: float, seconds: float, ingest_share: float, next_id: list[int], timeout: float
) -> list[tuple[str, float, int]]:
    """Offer `rate` requests per second for `seconds`; returns (kind, latency from schedule, status).

    Each request is sent once (max_retries=0: a 429 or a timeout is an error of the step, never hidden by
    a retry), over at most 512 connections, within `timeout` seconds in all."""
    out: list[tuple[str, float, int]] = []
    rng = random.Random(int(rate))
    async with ClientPool(base, 512, timeout, max_retries=0) as memory:
        tasks = []
        t0 = time.monotonic()
        n = int(rate * seconds)
        for k in range(n):
            scheduled = t0 + k / rate
            kind = "ingest" if rng.random() < ingest_share else "recall"
            next_id[0] += 1
            call = request(kind, next_id[0], rng)
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(memory, kind, call, scheduled, timeout, out)))
        await asyncio.gather(*tasks)
    return out


def summarize(rate: float, rows: list[tuple[str, float, int]], bound_ms: float, lag: int) -> dict[str, Any]:
    res: dict[str, Any] = {"offered_rps": rate, "requests": len(rows), "consumer_lag_after": lag}
    held = True
    for kind in ("ingest", "recall"):
        mine = [(d, s) for k, d, s in rows if k == kind]
        ok = [d for d, s in mine if 200 <= s < 300]
        errors = len(mine) - len(ok)
        p99 = percentile_ms(ok, 99)
        statuses: dict[str, int] = {}
        for _, s in mine:
            if not 200 <= s < 300:
                key = str(s) if s else "no response"
                statuses[key] = statuses.get(key, 0) + 1
        res[kind] = {
            "requests": len(mine),
            "errors": errors,
            "error_statuses": statuses,
            "p50_ms": round(percentile_ms(ok, 50), 1),
            "p99_ms": round(p99, 1),
        }
        held = held and errors == 0 and (not mine or p99 <= bound_ms)
    res["held"] = held
    return res


async def main_async(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="engram-load-") as tmp:
        server = EmbeddedRedis(port=free_port(), data_dir=Path(tmp) / "redis", appendfsync="everysec")
        server.start()
        logs = Path(tmp)
        try:
            env = service_env(
                server.url,
                PREFIX,
                args.embedder,
                ENGRAM_EMBED_DIM="384",
            )
            for i in range(args.workers):
                with open(logs / f"worker-{i}.log", "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "services.consolidator", "run"],
                            cwd=ROOT,
                            env={**env, "ENGRAM_CONSUMER_NAME": f"load-{i}"},
                            stdout=subprocess.DEVNULL,
                            stderr=log,
                        )
                    )
            port = free_port()
            with open(logs / "query.log", "wb") as log:
                query = subprocess.Popen(
                    [sys.executable, "-m", "services.query"],
                    cwd=ROOT,
                    env={**env, "ENGRAM_HOST": "127.0.0.1", "ENGRAM_PORT": str(port)},
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            procs.append(query)
            base = f"http://127.0.0.1:{port}"
            await wait_http_ready(base, query, timeout=120)
            r = connect(server.url)
            keys = Keys(PREFIX)
            group = streams.StreamGroup(r, keys.stream, "consolidator")
            # seeding is no measurement: 429s (backpressure) are waited out, anything else raises ApiError
            async with AsyncEngram(base, timeout=300.0) as memory:
                for start in range(0, args.seed, 500):
                    await memory.publish([episode(i) for i in range(start, min(args.seed, start + 500))])
            while await group.lag() or (await group.info())["pending"]:
                await asyncio.sleep(0.2)
            mem_start = int((await r.info("memory"))["used_memory"])
            print(
                f"load ◆ seeded {args.seed} episodes ◆ p99 bound {args.p99_ms:g} ms ◆ "
                f"{args.ingest_share:.0%} ingest ◆ embedder {args.embedder}",
                flush=True,
            )
            next_id = [args.seed]
            for rate in args.rates:
                rows = await step(base, rate, args.step_seconds, args.ingest_share, next_id, args.timeout)
                lag = await group.lag()
                res = summarize(rate, rows, args.p99_ms, lag)
                results.append(res)
                print(
                    f"load ◆ {rate:g} req/s ◆ recall p99 {res['recall']['p99_ms']} ms ◆ ingest p99 "
                    f"{res['ingest']['p99_ms']} ms ◆ errors {res['recall']['errors'] + res['ingest']['errors']} ◆ "
                    f"lag {lag} ◆ {'held' if res['held'] else 'NOT held'}",
                    flush=True,
                )
                if not res["held"]:
                    break
            mem_end = int((await r.info("memory"))["used_memory"])
            await r.aclose()
        finally:
            stop_processes(procs, timeout=20)
            server.stop()
    held = [x["offered_rps"] for x in results if x["held"]]
    best = max(held) if held else None
    print()
    print(
        table(
            [
                "offered req/s",
                "recall p50 ms",
                "recall p99 ms",
                "ingest p50 ms",
                "ingest p99 ms",
                "errors",
                "lag after",
                "held",
            ],
            [
                [
                    x["offered_rps"],
                    x["recall"]["p50_ms"],
                    x["recall"]["p99_ms"],
                    x["ingest"]["p50_ms"],
                    x["ingest"]["p99_ms"],
                    x["recall"]["errors"] + x["ingest"]["errors"],
                    x["consumer_lag_after"],
                    "yes" if x["held"] else "no",
                ]
                for x in results
            ],
        )
    )
    print(
        f"\nhighest rate held with p99 <= {args.p99_ms:g} ms and zero errors: "
        f"{best if best is not None else 'none'} req/s ({args.ingest_share:.0%} ingest)"
    )
    write_json(
        Path(args.out),
        {
            "machine": machine(),
            "args": vars(args),
            "highest_rate_held_rps": best,
            "redis_used_memory_mb": [round(mem_start / 2**20, 1), round(mem_end / 2**20, 1)],
            "steps": results,
            "generated_at": time.time(),
        },
    )
    print(f"results written to {args.out}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=float, nargs="+", default=[25, 50, 100, 200, 300, 400, 600, 800])
    p.add_argument("--step-seconds", type=float, default=15.0)
    p.add_argument("--ingest-share", type=float, default=0.3)
    p.add_argument("--p99-ms", type=float, default=250.0)
    p.add_argument("--timeout", type=float, default=10.0, help="per request, seconds (a timeout is an error)")
    p.add_argument("--seed", type=int, default=2000, help="episodes ingested before the first step")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--embedder", choices=("hashing", "minilm"), default="hashing")
    p.add_argument("--out", default=str(ROOT / "bench" / "load-results.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
