"""HNSW recall@k when many episodes share one vector (an agent that ran the same task again and again),
with and without the widened beam of `services.query.recall.arms.widened_ef`, and what the second walk costs.

    python -m bench.duplicate_vectors [--episodes 100000] [--copies 14] [--latent 32] [--dim 384]

Against a private embedded Redis: an HNSW index as Engram creates it (M 16, EF_CONSTRUCTION 200,
EF_RUNTIME 100), `--episodes` unit vectors on a `--latent`-dimensional subspace, each distinct one
written `--copies` times in a row (`--copies 1`: all distinct, the control, which must never widen);
then 40 unfiltered KNN `--k` queries, each asked as Engram's KNN arm would (again with the widened
EF_RUNTIME when the answer is crowded). Prints the median latency and recall@k against the exact
numpy answer (ties at the k-th similarity count as found) of the first walk and of the answer kept.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import redis

from bench.common import private_redis
from services.query.recall.arms import widened_ef
from shared.index import VectorParams, episode_schema


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=100_000)
    ap.add_argument("--copies", type=int, default=14)
    ap.add_argument("--latent", type=int, default=32)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--ef", type=int, default=100, help="the index's EF_RUNTIME")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    basis = rng.standard_normal((args.latent, args.dim))
    distinct = _unit(rng.standard_normal((-(-args.episodes // args.copies), args.latent)) @ basis)
    vectors = np.repeat(distinct, args.copies, axis=0)[: args.episodes]
    queries = _unit(rng.standard_normal((40, args.latent)) @ basis)
    params = VectorParams(dim=args.dim, m=16, ef_construction=200, ef_runtime=args.ef)
    with private_redis() as server:
        r = redis.Redis(port=server.port, protocol=2)
        r.execute_command(
            "FT.CREATE", "dup", "ON", "HASH", "PREFIX", 1, "dup:", "SCHEMA", *episode_schema(params)
        )
        started = time.perf_counter()
        pipe = r.pipeline(transaction=False)
        for i, v in enumerate(vectors):
            pipe.hset(f"dup:{i}", mapping={"vector": v.tobytes(), "namespace": "a", "status": "completed"})
            if i % 1_000 == 999:
                pipe.execute()
        pipe.execute()
        print(
            f"{args.episodes:,} episodes ({len(distinct):,} distinct) in {time.perf_counter() - started:.1f} s"
        )

        def knn(q: np.ndarray, ef: int | None) -> tuple[float, list[int], list[float]]:
            clause = f" EF_RUNTIME {ef}" if ef else ""
            t = time.perf_counter()
            reply = r.execute_command(
                "FT.SEARCH", "dup", f"*=>[KNN {args.k} @vector $v{clause} AS dist]", "PARAMS", 2, "v",
                q.tobytes(), "RETURN", 1, "dist", "SORTBY", "dist", "LIMIT", 0, args.k, "DIALECT", 2,
            )  # fmt: skip
            took = time.perf_counter() - t
            return took, [int(key[4:]) for key in reply[1::2]], [float(f[1]) for f in reply[2::2]]

        rows = []
        for q in queries:
            sims = vectors @ q
            kth = np.sort(sims)[::-1][args.k - 1]
            took, got, dist = knn(q, None)
            wider = widened_ef(dist, args.k, args.ef)
            again, kept, _ = knn(q, wider) if wider else (0.0, got, dist)
            rows.append(
                (
                    took,
                    np.mean(sims[got] >= kth - 1e-4),
                    wider or 0,
                    took + again,
                    np.mean(sims[kept] >= kth - 1e-4),
                )
            )
        a = np.array(rows, dtype=float)
        widened = a[:, 2] > 0
        print(
            f"first walk: {np.median(a[:, 0]) * 1e3:.2f} ms, recall@{args.k} {a[:, 1].mean():.3f} (worst {a[:, 1].min():.2f})"
        )
        print(
            f"kept: widened {int(widened.sum())}/{len(a)} (EF_RUNTIME median {np.median(a[widened, 2]) if widened.any() else 0:.0f}), "
            f"{np.median(a[:, 3]) * 1e3:.2f} ms both walks, recall@{args.k} {a[:, 4].mean():.3f} (worst {a[:, 4].min():.2f})"
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
