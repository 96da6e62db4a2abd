"""Engram side by side with Redis's agent-memory-server on LoCoMo, one run, same questions.

    make peer-install                          # once: .venv-peer with agent-memory-server 0.15.2
    make bench PEER=agent-memory-server        # = python -m bench.perf --peer agent-memory-server
    python -m bench.peer [--conversations 3] [--questions 0] [--clients 8] [--rounds 2] [--sequential 60]
        [--systems engram-default,engram-minilm,ams-minilm] [--out bench/results-peer.json]

Systems (each on a private embedded Redis of its own, same build and configuration, AOF off):
- `engram-default`: Engram as shipped, `ENGRAM_EMBEDDER=auto` (→ mpnet in process, ONNX Runtime);
- `engram-minilm`: Engram with `ENGRAM_EMBEDDER=openai` on the bench's embedding server (MiniLM);
- `engram-minilm-vector`: the same with `ENGRAM_RECALL_MODE=vector` (one KNN list, as the peer searches,
  instead of the default hybrid pool of KNN + BM25 candidates): the service's own cost on equal work;
- `ams-minilm`: agent-memory-server 0.15.2 on the same embedding server, LLM features off.
"Via the server" means both embed through one OpenAI-compatible `bench.embed_server` process, so the
model cost per text is identical and the rest is the memory service's own.

Method. LoCoMo's first `--conversations` conversations (`bench.locomo.load`: one memory per dialogue
turn, its text "speaker: utterance"). Ingest: per conversation, every system in turn (the order rotates)
gets the turns over HTTP, 100 per request, and the clock stops when all of them are searchable (a count
in its own RediSearch index); turns/s = all turns / the summed times. Recall: `--rounds` rounds, each
running every system in turn (order rotating): `--sequential` questions one at a time (p50), then every
question through `--clients` closed-loop clients (p50, p95, recalls/s = questions / wall time), top 10.
Every system gets the same HTTP client (aiohttp, one keep-alive connection per client). R@5 / R@10
(share of a question's evidence turns in the top 5 / 10, LoCoMo's R@k) come from the first round's
concurrent pass. CPU per recall (ms, from /proc, every process of the system and the embedding server)
says where the time goes. Engram's query cache is off (`ENGRAM_QUERY_CACHE=0`): the peer has none, and
rounds repeat the questions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import orjson

from bench.common import (
    ROOT,
    _log_file,
    _Proc,
    check_alive,
    machine,
    percentile_ms,
    poll_until,
    private_redis,
    ratio,
    stop_processes,
    table,
    write_json,
)
from bench.locomo import DEFAULT_DATA, Conversation, Question, load, question_metrics
from bench.peer_systems import (
    PEER_VENV,
    AgentMemoryServer,
    EngramSystem,
    PeerMissing,
    System,
    cpu_seconds,
    main_install,
    peer_python,
)
from deploy.embedded_redis import free_port

SYSTEMS = ("engram-default", "engram-minilm", "engram-minilm-vector", "ams-minilm")
LABELS = {
    "engram-default": "Engram, default (auto → mpnet in process)",
    "engram-minilm": "Engram, MiniLM via server",
    "engram-minilm-vector": "Engram, MiniLM via server, mode vector",
    "ams-minilm": "agent-memory-server 0.15.2, MiniLM via server",
}
TOP_K = 10


@dataclass
class Measured:
    """What one system measured over the run (seconds; CPU seconds by process role)."""

    ingest_s: float = 0.0
    turns: int = 0
    sequential: list[float] = field(default_factory=list)
    concurrent: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    cpu_recalls: int = 0
    quality: list[dict[str, float]] = field(default_factory=list)
    errors: int = 0


class EmbedServer:
    """`python -m bench.embed_server` on a free port (MiniLM), started and stopped by its pid."""

    def __init__(self, models: str = "minilm"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc = _Proc(
            [sys.executable, "-m", "bench.embed_server", "--port", str(self.port), "--models", models],
            cwd=ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            stdout=_log_file(),
            stderr=_log_file(),
        )

    async def wait(self, timeout: float = 300.0) -> None:
        async with httpx.AsyncClient(timeout=5.0) as http:

            async def up() -> bool:
                check_alive([self.proc], "embedding server")
                try:
                    return (await http.get(f"http://127.0.0.1:{self.port}/health")).status_code == 200
                except httpx.HTTPError:
                    return False

            await poll_until(up, timeout=timeout, what="the embedding server")

    async def health(self) -> dict[str, Any]:
        """Its `/health`: the models, their dimensions and backends."""
        async with httpx.AsyncClient(timeout=10.0) as http:
            return (await http.get(f"http://127.0.0.1:{self.port}/health")).json()

    async def stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10.0) as http:
            return (await http.get(f"http://127.0.0.1:{self.port}/stats")).json()

    def stop(self) -> None:
        stop_processes([self.proc])


def _cpu(system: System, embed: EmbedServer | None) -> dict[str, float]:
    pids = dict(system.pids())
    if embed is not None:
        pids["embedding server"] = embed.proc.pid
    if system.redis_pid:
        pids["redis"] = system.redis_pid
    pids["bench client"] = os.getpid()  # the 8 HTTP clients: reading a larger answer costs the machine too
    return {role: cpu_seconds(pid) for role, pid in pids.items()}


async def ingest(system: System, conv: Conversation, timeout: float) -> float:
    """Submit `conv`'s turns to `system`; seconds from the first request until all are searchable."""
    started = time.perf_counter()
    async with _session(1, timeout=300.0) as http:
        for path, body, headers in system.ingest_requests(conv):
            async with http.post(system.base + path, data=orjson.dumps(body), headers=headers) as response:
                if response.status >= 300:
                    text = (await response.text())[:300]
                    raise RuntimeError(f"{system.label}: POST {path} → {response.status}: {text}")

    async def done() -> bool:
        return await system.searchable(conv) >= len(conv.turns)

    await poll_until(
        done, timeout=timeout, interval=0.05, what=f"{system.label}: {conv.sample_id} searchable"
    )
    return time.perf_counter() - started


async def ask(
    system: System, jobs: Sequence[tuple[Conversation, Question]], clients: int
) -> tuple[list[float], float, list[list[str] | None], int]:
    """Every job through `clients` closed-loop clients (one aiohttp connection each): (latencies s, wall
    s, ranked ids per job or None when it failed, failures)."""
    todo = list(range(len(jobs)))[::-1]
    latencies: list[float] = []
    ranked: list[list[str] | None] = [None] * len(jobs)
    errors = 0
    sizes: list[int] = []

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal errors
        while todo:
            i = todo.pop()
            conv, q = jobs[i]
            path, body, headers = system.search_request(conv, q, TOP_K)
            t0 = time.perf_counter()
            try:
                async with http.post(
                    system.base + path, data=orjson.dumps(body), headers=headers
                ) as response:
                    raw = await response.read()
                payload = orjson.loads(raw) if response.status == 200 else None
                sizes.append(len(raw))
            except (aiohttp.ClientError, TimeoutError, ValueError):
                payload = None
            latencies.append(time.perf_counter() - t0)
            if payload is None:
                errors += 1
            else:
                ranked[i] = system.ranked(conv, payload)

    https = [_session(1) for _ in range(clients)]
    try:
        started = time.perf_counter()
        await asyncio.gather(*(client(h) for h in https))
        wall = time.perf_counter() - started
    finally:
        for h in https:
            await h.close()
    system.response_bytes += sizes
    return latencies, wall, ranked, errors


def _session(connections: int, timeout: float = 120.0) -> aiohttp.ClientSession:
    """The HTTP client every system gets: aiohttp, `connections` keep-alive connections, JSON by orjson.
    Not httpx: its CPU per request (~10 ms measured here, on the same 2 cores as the services) diluted
    every ratio toward 1."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=30.0),
        timeout=aiohttp.ClientTimeout(total=timeout),
        headers={"Content-Type": "application/json"},
    )


def rotate(items: Sequence[str], n: int) -> list[str]:
    """`items` started at position n (mod len): each round and conversation puts another system first."""
    k = n % len(items)
    return [*items[k:], *items[:k]]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    convs = load(Path(args.data), conversations=args.conversations, questions=args.questions or None)
    jobs = [(c, q) for c in convs for q in c.questions]
    turns = sum(len(c.turns) for c in convs)
    names = list(args.systems)
    print(
        f"LoCoMo: {len(convs)} conversations, {turns} turns, {len(jobs)} questions; systems: {', '.join(names)}"
    )
    res: dict[str, Any] = {"machine": machine(), "args": vars(args), "turns": turns, "questions": len(jobs)}
    res["load"] = {"start": os.getloadavg()}
    needs_server = any(n != "engram-default" for n in names)
    if "ams-minilm" in names:
        peer_python(args.peer_venv)  # PeerMissing before anything starts
    measured = {n: Measured() for n in names}
    systems: dict[str, System] = {}
    embed: EmbedServer | None = None
    with contextlib.ExitStack() as stack:  # every Redis is stopped, even when a later one fails to start
        servers = [stack.enter_context(private_redis()) for _ in names]
        embed = EmbedServer() if needs_server else None
        try:
            if embed is not None:
                await embed.wait()
                res["embed_server_health"] = await embed.health()
                print(f"embedding server: {res['embed_server_health']}", flush=True)
            for name, server in zip(names, servers, strict=True):
                systems[name] = _make(name, server.url, embed, args)
                systems[name].redis_pid = server.process.pid if server.process else None
            for name in names:
                print(f"starting {name}", flush=True)
                await systems[name].start(convs)
            for i, conv in enumerate(convs):
                for name in rotate(names, i):
                    seconds = await ingest(systems[name], conv, args.timeout)
                    measured[name].ingest_s += seconds
                    measured[name].turns += len(conv.turns)
                    print(
                        f"  ingest {name} {conv.sample_id}: {len(conv.turns)} turns in {seconds:.1f}s",
                        flush=True,
                    )
            res["load"]["after_ingest"] = os.getloadavg()
            for name in names:  # warm-up: first requests pay for connections and lazy initialisation
                await ask(systems[name], jobs[: args.clients], args.clients)
            for rnd in range(args.rounds):
                for name in rotate(names, rnd):
                    await _round(rnd, name, systems[name], embed, jobs, measured[name], args)
                res["load"][f"round_{rnd}"] = os.getloadavg()
        finally:
            for s in systems.values():
                s.stop()
            if embed is not None:
                res["embed_server"] = await _maybe_stats(embed)
                embed.stop()
    res["systems"] = {n: _summary(m, systems[n]) for n, m in measured.items() if n in systems}
    return res


async def _round(
    rnd: int,
    name: str,
    system: System,
    embed: EmbedServer | None,
    jobs: list[tuple[Conversation, Question]],
    m: Measured,
    args: argparse.Namespace,
) -> None:
    start = (rnd * args.sequential) % max(1, len(jobs))
    seq_jobs = (jobs[start:] + jobs[:start])[: args.sequential]
    seq_lat, _, _, errors = await ask(system, seq_jobs, 1)
    m.sequential += seq_lat
    with_embed = embed if name != "engram-default" else None
    before = _cpu(system, with_embed)
    lat, wall, ranked, more = await ask(system, jobs, args.clients)
    after = _cpu(system, with_embed)
    for role in after:
        m.cpu[role] = m.cpu.get(role, 0.0) + after[role] - before.get(role, 0.0)
    m.cpu_recalls += len(jobs)
    m.concurrent += lat
    m.rates.append(len(jobs) / wall)
    m.errors += errors + more
    if rnd == 0:
        m.quality = [
            question_metrics(r, q.evidence) if r is not None else {"R@5": 0.0, "R@10": 0.0}
            for r, (_, q) in zip(ranked, jobs, strict=True)
        ]
    print(
        f"  round {rnd + 1} {name}: sequential p50 {percentile_ms(seq_lat, 50):.0f} ms; "
        f"{args.clients} clients p50 {percentile_ms(lat, 50):.0f} / p95 {percentile_ms(lat, 95):.0f} ms, "
        f"{len(jobs) / wall:.1f} recalls/s; load {os.getloadavg()[0]:.2f}",
        flush=True,
    )


def _make(name: str, redis_url: str, embed: EmbedServer | None, args: argparse.Namespace) -> System:
    if name == "engram-default":
        return EngramSystem(label=name, redis_url=redis_url, env_extra={"ENGRAM_EMBEDDER": "auto"})
    assert embed is not None
    if name.startswith("engram-minilm"):
        env = {
            "ENGRAM_EMBEDDER": "openai",
            "ENGRAM_OPENAI_URL": embed.url,
            "ENGRAM_OPENAI_MODEL": "all-minilm-l6-v2",
        }
        if name.endswith("-vector"):  # KNN only, as the peer searches: what the service itself costs
            env["ENGRAM_RECALL_MODE"] = "vector"
        return EngramSystem(label=name, redis_url=redis_url, env_extra=env)
    return AgentMemoryServer(label=name, redis_url=redis_url, venv=args.peer_venv, embed_url=embed.url)


async def _maybe_stats(embed: EmbedServer) -> dict[str, Any]:
    try:
        return await embed.stats()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": str(exc)}


def _summary(m: Measured, system: System) -> dict[str, Any]:
    n = max(1, m.cpu_recalls)
    return {
        "ingest_turns_per_s": m.turns / m.ingest_s if m.ingest_s else float("nan"),
        "sequential_p50_ms": percentile_ms(m.sequential, 50),
        "concurrent_p50_ms": percentile_ms(m.concurrent, 50),
        "concurrent_p95_ms": percentile_ms(m.concurrent, 95),
        "recalls_per_s": statistics.median(m.rates) if m.rates else float("nan"),
        "recalls_per_s_rounds": m.rates,
        "R@5": float(np.mean([q["R@5"] for q in m.quality])) if m.quality else float("nan"),
        "R@10": float(np.mean([q["R@10"] for q in m.quality])) if m.quality else float("nan"),
        "cpu_ms_per_recall": {role: 1000.0 * s / n for role, s in m.cpu.items()},
        "response_bytes_median": statistics.median(system.response_bytes) if system.response_bytes else 0,
        "errors": m.errors,
    }


def render(res: dict[str, Any]) -> str:
    """The side-by-side table, ratio rows Engram / peer, and CPU per recall by process."""
    s = res["systems"]
    cols = [
        ("ingest_turns_per_s", "ingest turns/s"),
        ("sequential_p50_ms", "recall p50 seq ms"),
        ("concurrent_p50_ms", "p50 @8 ms"),
        ("concurrent_p95_ms", "p95 @8 ms"),
        ("recalls_per_s", "recalls/s @8"),
        ("R@5", "R@5"),
        ("R@10", "R@10"),
    ]
    rows = [[LABELS[n], *(v[c] for c, _ in cols)] for n, v in s.items()]
    if "ams-minilm" in s:
        peer = s["ams-minilm"]
        for n in ("engram-minilm", "engram-minilm-vector", "engram-default"):
            if n in s:
                rows.append([f"ratio {n} / peer", *(ratio(s[n][c], peer[c]) for c, _ in cols)])
    out = [table(["system", *(h for _, h in cols)], rows)]
    cpu_rows = [
        [
            n,
            f"all {sum(v['cpu_ms_per_recall'].values()):.1f}",
            *(f"{role} {ms:.1f}" for role, ms in sorted(v["cpu_ms_per_recall"].items())),
            f"answer {v['response_bytes_median'] / 1000:.1f} kB",
        ]
        for n, v in s.items()
    ]
    width = max((len(r) for r in cpu_rows), default=1)
    out.append("CPU ms per recall at the concurrent passes, by process:")
    out.append(table(["system", *([""] * (width - 1))], [r + [""] * (width - len(r)) for r in cpu_rows]))
    errors = {n: v["errors"] for n, v in s.items() if v["errors"]}
    if errors:
        out.append(f"failed requests: {errors}")
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.peer", description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DEFAULT_DATA), help="LoCoMo JSON (read by path)")
    p.add_argument("--conversations", type=int, default=3, help="the first N conversations (3: 1,451 turns)")
    p.add_argument("--questions", type=int, default=0, help="at most N questions per conversation (0: all)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sequential", type=int, default=60, help="questions asked one at a time per round")
    p.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        type=lambda v: [s for s in v.split(",") if s],
        help=f"comma-separated, of {', '.join(SYSTEMS)}",
    )
    p.add_argument(
        "--peer-venv", type=Path, default=PEER_VENV, help="agent-memory-server's virtual environment"
    )
    p.add_argument(
        "--timeout", type=float, default=900.0, help="seconds to wait for a conversation to be searchable"
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results-peer.json"))
    args = p.parse_args(argv)
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or not args.systems:
        p.error(f"--systems: {', '.join(unknown) or '(none)'} not among {', '.join(SYSTEMS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.peer [options]` or `python -m bench.peer install [...]`; 2 when the peer is
    not installed (with the command that installs it), 0 when the LoCoMo data is missing (said)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["install"]:
        return main_install(argv[1:])
    args = parse_args(argv)
    if not Path(args.data).exists():
        print(f"LoCoMo data not found at {args.data}: skipping the side-by-side")
        return 0
    started = time.perf_counter()
    try:
        res = asyncio.run(run(args))
    except PeerMissing as exc:
        print(f"bench.peer: {exc}", file=sys.stderr)
        return 2
    res["wall_s"] = time.perf_counter() - started
    write_json(Path(args.out), res)
    print()
    print(render(res))
    load = res["load"]["start"]
    print(
        f"\nwrote {args.out} ({res['wall_s']:.0f}s; load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
