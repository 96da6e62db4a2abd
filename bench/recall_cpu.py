"""Python and Redis CPU per recall, in process, A/B against another checkout.

`python -m bench.recall_cpu [--sizes 10000,100000] [--queries 100] [--rounds 2] [--base DIR]
[--profile 30]`: seeds the recall phase's corpus (bench.perf_recall.CorpusSeeder: LoCoMo turns, derived
to each size in one namespace, continuous rewards; generated texts when LoCoMo's file is absent) into
a private Redis with the hashing embedder (so the model does not hide the rest), then, per size and
round, runs a worker process per checkout (this one and `--base`, in ABBA order so drifting load falls
on both alike) that calls `services.query.recall.recall` as `POST /v1/recall` does by default
(`views.recall.recall_params` of `{"query": q, "top_k": 10}` and the default Settings, one ScopeSizes):

- `cold`: the `--queries` LoCoMo questions once each in a fresh process (nothing remembered yet);
- `warm`: the same questions again (every pool member's terms and every word's idf count remembered,
  as in a long-running service whose namespace fits its caches).

Per pass: Python CPU per recall (`time.process_time` of the worker: the service's share, the query
vectors computed before), wall ms per recall and Redis CPU per recall (`INFO cpu` user + sys deltas;
the worker is Redis's only client). Each worker also digests every answer (episode ids, priorities,
relevance and every component as `float.hex`) so the two checkouts are shown to rank bit-identically;
`--profile N` adds a cProfile of N warm recalls (top functions by own time) for this checkout.
A worker is this file run by path with the checkout's own `services` / `shared` first on sys.path.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


async def work(args: argparse.Namespace) -> dict[str, object]:
    """One worker: recalls against the seeded index at `args.url` (prefix `args.prefix`)."""
    from bench.common import redis_cpu
    from bench.perf_corpus import real_texts
    from bench.perf_recall import NAMESPACE
    from services.query import models
    from services.query import recall as rc
    from services.query.recall.sizes import ScopeSizes
    from services.query.store import EpisodeStore
    from services.query.views.recall import recall_params
    from shared.embedding import make_embedder
    from shared.index import VectorParams, ensure_episode_index
    from shared.keys import Keys
    from shared.partitions import check_partitions
    from shared.redis_conn import connect
    from shared.settings import Settings

    settings = Settings(embedder="hashing", embed_dim=384)
    embedder = make_embedder(settings)
    _, questions, source = real_texts()
    qs = questions[args.offset : args.offset + args.queries]
    vectors = await embedder.embed(qs)
    r = connect(args.url)
    keys = Keys(args.prefix)
    params = VectorParams.of(Settings(), embedder.dim)
    await check_partitions(r, keys, sealed=False)  # records this layout, as a service's start does
    tags = await ensure_episode_index(r, keys, 1, params, embedder.name, tag_key=None)
    index = keys.episode_index_alias
    sizes = ScopeSizes(df_ttl=settings.idf_cache_ttl or 0.0)
    digest = hashlib.sha256()

    async def one(q: str, v) -> None:
        req = models.RecallRequest(query=q, top_k=10)
        p = recall_params(req, settings, args.as_of)
        body = await rc.recall(
            rc.Query(r, index, rc.scope_of(NAMESPACE, req, tags), q, v, EpisodeStore(r, keys), sizes), p
        )
        rows = []
        for x in body["results"]:
            parts = [x["priority"], x["relevance"], x["recency"], *x["components"].values()]
            rows.append([x["episode"]["episode_id"], *(f.hex() for f in parts)])
            digest.update(x["episode"]["episode_id"].encode() + b"".join(f.hex().encode() for f in parts))
        digest.update(b"|%d|" % body["candidates"])
        if dump is not None:  # where two checkouts' digests differ: which question, which field
            dump.write(json.dumps({"query": q, "candidates": body["candidates"], "results": rows}) + "\n")

    dump = open(args.dump, "a") if args.dump else None  # noqa: SIM115 (closed below)
    out: dict[str, object] = {}
    for name in ("cold", "warm"):
        cpu0, redis0, wall0 = time.process_time(), await redis_cpu(r), time.perf_counter()
        each = []
        for q, v in zip(qs, vectors, strict=True):
            at = time.process_time()
            await one(q, v)
            each.append(time.process_time() - at)
        n = len(qs)
        out[name] = {
            "python_cpu_ms": round(1000 * (time.process_time() - cpu0) / n, 3),
            "python_cpu_p50_ms": round(1000 * statistics.median(each), 3),
            "wall_ms": round(1000 * (time.perf_counter() - wall0) / n, 3),
            "redis_cpu_ms": round(1000 * (await redis_cpu(r) - redis0) / n, 3),
        }
    out["digest"] = digest.hexdigest()[:16]
    out["texts"] = source
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile(time.process_time)  # CPU, not the wait on Redis
        prof.enable()
        for q, v in zip(qs[: args.profile], vectors[: args.profile], strict=False):
            await one(q, v)
        prof.disable()
        stats = pstats.Stats(prof)
        n = min(args.profile, len(qs))
        for key, col in (("own", 2), ("cum", 3)):
            rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][col])[:20]  # type: ignore[attr-defined]
            out[f"profile_by_{key}_ms_per_recall"] = [
                f"{Path(f).name}:{line} {fn}: own {1000 * tt / n:.2f} ms, cum {1000 * ct / n:.2f} ms, "
                f"{nc / n:.0f} calls"
                for (f, line, fn), (_, nc, tt, ct, _) in rows
            ]
        out["profile_total_ms_per_recall"] = round(1000 * stats.total_tt / n, 2)  # type: ignore[attr-defined]
    if args.sample:
        with Sampler() as sampler:
            for q, v in zip(qs[: args.sample], vectors[: args.sample], strict=False):
                await one(q, v)
        out["sampled"] = sampler.report()
    await r.aclose()
    if dump is not None:
        dump.close()
    return out


class Sampler:
    """A statistical profile of this process's main thread: another thread reads its stack every
    `every` seconds (`sys._current_frames`; the switch interval is shortened so the main thread yields
    the GIL that often) and counts each function once per sample it is on the stack (inclusive) and
    the innermost one (own). Samples waiting in the event loop's `select` are counted apart, so the
    shares are of the Python CPU, without cProfile's cost per call (which inflates small functions)."""

    def __init__(self, every: float = 0.0005):
        import threading

        self.every = every
        self.main = threading.main_thread().ident
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.own: collections.Counter[str] = collections.Counter()
        self.samples = self.waiting = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self.interval = sys.getswitchinterval()
        sys.setswitchinterval(self.every / 2)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        sys.setswitchinterval(self.interval)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            frame = sys._current_frames().get(self.main)
            names = []
            while frame is not None:
                code = frame.f_code
                names.append(f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_name}")
                frame = frame.f_back
            if not names:
                continue
            if names[0].startswith("selectors.py"):
                self.waiting += 1
                continue
            self.samples += 1
            self.own[names[0]] += 1
            self.inclusive.update(set(names))

    def report(self, top: int = 25) -> dict[str, object]:
        share = lambda n: round(100.0 * n / max(1, self.samples), 1)  # noqa: E731
        return {
            "samples": self.samples,
            "waiting_samples": self.waiting,
            "own_pct": {k: share(v) for k, v in self.own.most_common(top)},
            "inclusive_pct": {k: share(v) for k, v in self.inclusive.most_common(top)},
        }


def spawn(tree: Path, url: str, prefix: str, args: argparse.Namespace, *, profile: int) -> dict:
    """Run one worker with `tree`'s code first on sys.path; its JSON line."""
    env = {**os.environ, "PYTHONPATH": f"{tree}/client:{tree}"}
    cmd = [sys.executable, __file__, "--worker", "--url", url, "--prefix", prefix]
    cmd += ["--queries", str(args.queries), "--offset", str(args.offset), "--as-of", str(args.as_of)]
    cmd += ["--profile", str(profile), "--sample", str(args.sample)]
    if args.dump:
        cmd += [
            "--dump",
            f"{args.dump}.{tree.name}.r{len(list(Path(args.dump).parent.glob(Path(args.dump).name + '.*')))}",
        ]
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"worker in {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


async def drive(url: str, args: argparse.Namespace) -> dict[str, object]:
    from bench.perf_corpus import CACHE_DIR, cached_vectors, derive, real_texts
    from bench.perf_recall import CorpusSeeder
    from shared.embedding import make_embedder
    from shared.redis_conn import connect
    from shared.settings import Settings

    sizes = [int(s) for s in args.sizes.split(",")]
    embedder = make_embedder(Settings(embedder="hashing", embed_dim=384))
    turns, _, source = real_texts()
    base, _ = await cached_vectors(embedder, turns[:5000], cache_dir=CACHE_DIR)
    vectors, _ = derive(base, max(sizes), noise=0.3)
    r = connect(url)
    seeder = CorpusSeeder(r, embedder.name, embedder.dim, turns[:5000], vectors)
    await seeder.create()
    args.as_of = seeder.now
    trees = {"head": HERE} | ({"base": Path(args.base).resolve()} if args.base else {})
    report: dict[str, object] = {"texts": source, "queries": args.queries, "runs": []}
    for size in sizes:
        await seeder.grow(size)
        for rnd in range(args.rounds):
            order = list(trees) if rnd % 2 == 0 else list(reversed(trees))
            for name in order:
                load = os.getloadavg()[0]
                profile = args.profile if rnd == args.rounds - 1 else 0
                res = spawn(trees[name], url, seeder.keys.prefix, args, profile=profile)
                if res.get("texts") not in (None, source):  # a checkout without ../shared/data
                    raise SystemExit(
                        f"the {name} checkout ({trees[name]}) read its questions from {res['texts']}, "
                        f"this one from {source}: their answers cannot be compared (link ../shared beside it)"
                    )
                row = {"size": size, "round": rnd, "tree": name, "load": round(load, 2), **res}
                print(json.dumps(row), file=sys.stderr, flush=True)
                report["runs"].append(row)  # type: ignore[attr-defined]
    await r.aclose()
    report["summary"] = summary(report["runs"])  # type: ignore[arg-type]
    return report


def summary(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per size and pass: each checkout's median over rounds and the median of head / base per round
    (a round runs both back to back, so its ratio shares the load of the moment)."""
    out: dict[str, dict[str, float]] = {}
    for size in sorted({r["size"] for r in runs}):
        for name in ("cold", "warm"):
            row: dict[str, float] = {}
            for metric in ("python_cpu_ms", "python_cpu_p50_ms", "redis_cpu_ms", "wall_ms"):
                by = {
                    t: {r["round"]: r[name][metric] for r in runs if r["size"] == size and r["tree"] == t}
                    for t in ("head", "base")
                }
                for t, vals in by.items():
                    if vals:
                        row[f"{t}_{metric}"] = round(statistics.median(vals.values()), 3)
                if by["base"]:
                    ratios = [by["head"][k] / by["base"][k] for k in by["head"] if by["base"].get(k)]
                    row[f"ratio_{metric}"] = round(statistics.median(ratios), 3)
            out[f"{size} {name}"] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--sizes", default="10000", help="episodes in the namespace, comma-separated (grown in order)"
    )
    p.add_argument("--queries", type=int, default=100, help="LoCoMo questions per pass")
    p.add_argument("--offset", type=int, default=0, help="first question used")
    p.add_argument("--rounds", type=int, default=2, help="rounds per size (ABBA order with --base)")
    p.add_argument("--base", default="", help="another checkout run beside this one (A/B)")
    p.add_argument("--profile", type=int, default=0, help="cProfile N warm recalls in the last round")
    p.add_argument("--sample", type=int, default=0, help="statistical profile of N warm recalls")
    p.add_argument(
        "--dump",
        default="",
        help="write each answer (ids, scores in hex) to DUMP.<checkout>.r<n>, JSON lines",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", default="", help=argparse.SUPPRESS)
    p.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    p.add_argument("--as-of", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.base and not (Path(args.base) / "bench" / "recall_cpu.py").is_file():
        p.error(f"--base: {args.base} is not an Engram checkout with bench/recall_cpu.py")
    if args.worker:
        print(json.dumps(asyncio.run(work(args))))
        return
    from bench.common import private_redis

    with private_redis() as server:
        print(json.dumps(asyncio.run(drive(server.url, args)), indent=1))


if __name__ == "__main__":
    main()
