"""Held-out recall quality beyond LoCoMo: BFCL's memory dialogues and multi-turn agent tasks
(`python -m bench.bfcl`).

Data: the Berkeley Function Calling Leaderboard's JSON files (PyPI package `bfcl-eval`, Apache-2.0),
read straight out of its wheel with `zipfile`: never copied into the repository, never installed. The
wheel is looked for in `~/.cache/engram-bench/` and otherwise fetched there with
`pip download --no-deps bfcl-eval==<WHEEL_VERSION>`; if it cannot be had the benchmark says so and
exits 0 (as bench.locomo does without its data). Nothing of it was used to tune Engram.

1. Memory dialogues (`BFCL_v4_memory.json`, answers with a `source` snippet in
   `possible_answer/BFCL_v4_memory.json`, conversations in `memory_prereq_conversation/`): one namespace
   per scenario (customer, finance, healthcare, notetaker, student), one session per prerequisite
   conversation, one episode per user turn (task = the turn's text; completed_at 60 s apart, sessions in
   file order). A question's evidence is the turn(s) whose text contains every fragment of its source
   snippet (`snippet_fragments`: case, quotes, dashes and whitespace normalised, split at ellipses, a
   leading `Label:` matched on its own); questions without locatable evidence are counted and dropped.
2. Agent tasks (`BFCL_v4_multi_turn_base.json` + its possible answers): every entry is a session of
   1-7 user requests; each request with its ground-truth calls is one agent episode (task = the request,
   actions = the calls, outcome success, session = the entry id). The entries are cut into `FOLDS`
   folds by a digest of their id (`fold_of`); for fold f, namespace `agent-f<f>` stores the sessions of
   the other folds and the requests of fold f are the queries (a new task arriving: "find past episodes
   that solved a task like this"), so every request is a query once. Relevant = stored episodes whose
   set of called function names equals the query's (`exact`), or has Jaccard >= 0.5 with it
   (`jaccard>=0.5`); queries with no relevant episode (or no call) are counted and dropped.

A private Redis, the consolidator workers and a query service with the configuration of the
environment (the default otherwise); one `top_k` 50 recall per question (with `as_of` one day after the
namespace's last episode). Metrics: R@1/5/10 (share of the relevant episodes in the top k), hit@1/5/10,
NDCG@10 (binary relevance); `python -m bench.paired` compares two runs question by question.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    ROOT,
    machine,
    private_redis,
    publish_episodes,
    recall_ranked,
    service_env,
    spawn_query_service,
    spawn_workers,
    stop_processes,
    table,
    wait_http_ready,
    wait_recallable,
    write_json,
)
from bench.locomo import question_metrics

WHEEL_VERSION = "2026.3.23"
CACHE = Path.home() / ".cache" / "engram-bench"
DATA = "bfcl_eval/data/"
SCENARIOS = ("customer", "finance", "healthcare", "notetaker", "student")
FOLDS = 4
TOP_K = 50
BASE_TS = 1_700_000_000.0
"""completed_at of the first episode of every namespace (UTC epoch seconds); episodes 60 s apart."""
STEP_S = 60.0
METRICS = ("R@1", "R@5", "R@10", "hit@1", "hit@5", "hit@10", "NDCG@10")
RELEVANCE = ("exact", "jaccard>=0.5")

_ELLIPSIS = re.compile(r"\.{2,}|…")
_LABEL = re.compile(r"^([^\s:]{1,20}):\s+")
_FOLD = str.maketrans({"’": "'", "‘": "'", "“": "", "”": "", '"': "", "—": "-", "–": "-"})
_DASH = re.compile(r"\s*-\s*")


# --- getting the data ---------------------------------------------------------------------------------
def find_wheel(cache: Path = CACHE, *, download: bool = True) -> Path | None:
    """The bfcl-eval wheel of WHEEL_VERSION in `cache`, fetched there from the package index with
    `pip download --no-deps` when absent and `download`; None when it cannot be had (no index, no pip)."""
    pattern = f"bfcl_eval-{WHEEL_VERSION}-*.whl"
    found = sorted(cache.glob(pattern))
    if found or not download:
        return found[0] if found else None
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        f"bfcl-eval=={WHEEL_VERSION}",
        "-d",
        str(cache),
    ]
    print(f"fetching bfcl-eval=={WHEEL_VERSION} with pip download into {cache} ...", file=sys.stderr)
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        # pip's own last line says why (no index, no such version, ...); the exit status alone does not
        said = (getattr(exc, "stderr", None) or "").strip().splitlines()
        why = f" (pip: {said[-1]})" if said else ""
        print(f"pip download of bfcl-eval=={WHEEL_VERSION} failed: {exc}{why}", file=sys.stderr)
        return None
    found = sorted(cache.glob(pattern))
    return found[0] if found else None


class Wheel:
    """The JSON-lines files of the wheel's `bfcl_eval/data/`, read without extracting anything."""

    def __init__(self, path: Path):
        self.path = path

    def lines(self, name: str) -> list[dict[str, Any]]:
        """The records of `bfcl_eval/data/<name>` (one JSON object a line). KeyError if absent."""
        with zipfile.ZipFile(self.path) as z:
            text = z.read(DATA + name).decode("utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]


# --- shaping: one evaluation = namespaces of episodes + questions -----------------------------------------
@dataclass(slots=True)
class Query:
    namespace: str
    text: str
    relevant: dict[str, list[str]]
    """relevance name ("evidence", or RELEVANCE) → ids of the relevant stored episodes."""
    qid: str = ""


@dataclass(slots=True)
class Evaluation:
    name: str
    episodes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    queries: list[Query] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    """reason → questions left out."""

    def as_of(self, namespace: str) -> float:
        """One day after the namespace's last episode."""
        return max(e["completed_at"] for e in self.episodes[namespace]) + 86400.0


def norm_text(text: str) -> str:
    """Lower case, curly quotes → ', double quotes dropped, dashes → '-' without spaces around, runs of
    whitespace → one space: what evidence location compares."""
    return " ".join(_DASH.sub("-", text.lower().translate(_FOLD)).split())


def snippet_fragments(source: str) -> list[str]:
    """The pieces of a BFCL `source` snippet that must all occur in the evidence turn (`norm_text`ed):
    split at ellipses ('..', '...', '…': the snippets elide), each stripped of surrounding ' .,', a
    leading `Label:` (notetaker's `Monday: ...`, whose turn lists several items under one label) kept
    as its own piece; pieces shorter than 3 characters are dropped."""
    s = norm_text(source)
    parts: list[str] = []
    m = _LABEL.match(s)
    if m:
        parts.append(m.group(1) + ":")
        s = s[m.end() :]
    for piece in _ELLIPSIS.split(s):
        piece = piece.strip(" .,'")
        if len(piece) >= 3:
            parts.append(piece)
    return parts


def locate_evidence(source: str, turns: Sequence[tuple[str, str]]) -> list[str]:
    """Ids of the turns ((episode id, text), ...) that contain every fragment of `source`; [] if none
    (or if the snippet has no fragment)."""
    fragments = snippet_fragments(source)
    if not fragments:
        return []
    return [eid for eid, text in turns if all(f in norm_text(text) for f in fragments)]


def turn_text(turn: Sequence[Mapping[str, Any]]) -> str:
    """One BFCL turn (a list of messages) as text: the contents of its user messages."""
    return "\n".join(str(m["content"]) for m in turn if m.get("role") == "user")


def memory_evaluation(
    questions: list[dict[str, Any]],
    answers: list[dict[str, Any]],
    prereq: Mapping[str, list[dict[str, Any]]],
    *,
    subset: bool = False,
) -> Evaluation:
    """Step 1 of the module docstring. `questions`/`answers`: the records of BFCL_v4_memory.json and its
    possible answers; `prereq`: scenario → the records of memory_prereq_conversation/memory_<scenario>.json.
    A question whose id names another scenario than its `scenario` field is dropped as "id/scenario mismatch".
    `subset`: `prereq` holds only some conversations (--sessions), so a snippet not found may be in one
    left out; the drop says so."""
    ev = Evaluation("memory dialogues")
    turns: dict[str, list[tuple[str, str]]] = {}
    for scenario, convs in prereq.items():
        ns = f"memory-{scenario}"
        items = ev.episodes.setdefault(ns, [])
        for conv in convs:
            for i, turn in enumerate(conv["question"]):
                text = turn_text(turn)
                if not text.strip():
                    continue
                items.append(
                    {
                        "episode_id": f"{conv['id']}:{i}",
                        "task": text,
                        "outcome": "success",
                        "session_id": str(conv["id"]),
                        "agent_id": "assistant",
                        "user_id": "user",
                        "completed_at": BASE_TS + STEP_S * len(items),
                        "metadata": {"topic": conv.get("topic", ""), "turn": i},
                    }
                )
        turns[ns] = [(e["episode_id"], e["task"]) for e in items]
    source = {a["id"]: a.get("source", "") for a in answers}
    for q in questions:
        scenario = str(q.get("scenario", ""))
        id_scenario = str(q["id"]).split("-")[1] if str(q["id"]).count("-") >= 2 else ""
        if scenario != id_scenario or f"memory-{scenario}" not in turns:
            ev.dropped["id/scenario mismatch or no conversation"] = (
                ev.dropped.get("id/scenario mismatch or no conversation", 0) + 1
            )
            continue
        ns = f"memory-{scenario}"
        evidence = locate_evidence(str(source.get(q["id"], "")), turns[ns])
        if not evidence:
            why = (
                "source snippet not in the loaded turns (--sessions)"
                if subset
                else "source snippet not found in any turn"
            )
            ev.dropped[why] = ev.dropped.get(why, 0) + 1
            continue
        ev.queries.append(Query(ns, turn_text(q["question"][-1]), {"evidence": evidence}, qid=str(q["id"])))
    return ev


def call_name(call: str) -> str:
    """`"mv(source='a', destination='b')"` → `"mv"`: the text before the first '(' (stripped)."""
    return call.split("(", 1)[0].strip()


def call_names(calls: Iterable[str]) -> frozenset[str]:
    """The set of function names called."""
    return frozenset(n for n in (call_name(c) for c in calls) if n)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b|; 0.0 when both are empty."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0


def fold_of(session_id: str, folds: int = FOLDS) -> int:
    """The fold of a session: blake2b(id) mod `folds`, so the split depends on the id alone (not on the
    file's order or on Python's hash seed)."""
    return int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(), "big") % folds


def relevant_ids(names: frozenset[str], stored: Sequence[tuple[str, frozenset[str]]]) -> dict[str, list[str]]:
    """For a query calling `names`: the stored episodes ((id, names), ...) with the same set (`exact`)
    and with Jaccard >= 0.5 (`jaccard>=0.5`). A query without calls has none."""
    if not names:
        return {r: [] for r in RELEVANCE}
    return {
        "exact": [eid for eid, n in stored if n == names],
        "jaccard>=0.5": [eid for eid, n in stored if jaccard(n, names) >= 0.5],
    }


def agent_episodes(entries: list[dict[str, Any]], answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every request of every multi-turn entry as one agent episode (JSON-shaped; `metadata.names` the
    sorted function names of its ground-truth calls), sessions in file order, 60 s apart."""
    truth = {a["id"]: a["ground_truth"] for a in answers}
    out: list[dict[str, Any]] = []
    for entry in entries:
        calls_per_turn = truth.get(entry["id"])
        if calls_per_turn is None:
            continue
        for i, (turn, calls) in enumerate(zip(entry["question"], calls_per_turn, strict=False)):
            text = turn_text(turn)
            if not text.strip():
                continue
            out.append(
                {
                    "episode_id": f"{entry['id']}:{i}",
                    "task": text,
                    "outcome": "success",
                    "session_id": str(entry["id"]),
                    "agent_id": "agent",
                    "user_id": "user",
                    "actions": [{"action_type": call_name(c) or "call", "input": c} for c in calls],
                    "completed_at": 0.0,
                    "metadata": {"names": sorted(call_names(calls)), "turn": i},
                }
            )
    return out


def agent_evaluation(
    entries: list[dict[str, Any]],
    answers: list[dict[str, Any]],
    *,
    folds: int = FOLDS,
    sessions: int | None = None,
) -> Evaluation:
    """Step 2 of the module docstring: namespace `agent-f<f>` holds the sessions outside fold f (their
    completed_at re-numbered from BASE_TS in file order), the requests of fold f are its queries.
    `sessions` keeps only the first N entries (smoke runs)."""
    ev = Evaluation("agent tasks")
    episodes = agent_episodes(entries[:sessions], answers)
    for f in range(folds):
        ns = f"agent-f{f}"
        stored = [dict(e) for e in episodes if fold_of(e["session_id"], folds) != f]
        for i, e in enumerate(stored):
            e["completed_at"] = BASE_TS + STEP_S * i
        ev.episodes[ns] = stored
        index = [(e["episode_id"], frozenset(e["metadata"]["names"])) for e in stored]
        for e in episodes:
            if fold_of(e["session_id"], folds) != f:
                continue
            rel = relevant_ids(frozenset(e["metadata"]["names"]), index)
            if not e["metadata"]["names"]:
                ev.dropped["request without calls"] = ev.dropped.get("request without calls", 0) + 1
            elif not rel["exact"]:
                ev.dropped["no stored episode with the same names"] = (
                    ev.dropped.get("no stored episode with the same names", 0) + 1
                )
            else:
                ev.queries.append(Query(ns, e["task"], rel, qid=e["episode_id"]))
    return ev


# --- metrics ------------------------------------------------------------------------------------------
def metrics(ranked: list[str], relevant: list[str]) -> dict[str, float]:
    """R@1/5/10, hit@1/5/10 and NDCG@10 of one ranked list (bench.locomo.question_metrics plus R@1)."""
    m = question_metrics(ranked, relevant)
    m["R@1"] = 100.0 * (1.0 if ranked[:1] and ranked[0] in set(relevant) else 0.0) / len(set(relevant))
    return {k: m[k] for k in METRICS}


# --- the run ------------------------------------------------------------------------------------------
async def ingest_and_ask(
    evals: list[Evaluation], args: argparse.Namespace
) -> tuple[dict[str, list[list[str]]], dict[str, Any]]:
    """Ingest every evaluation's namespaces and ask every query once (top_k 50); returns ({evaluation
    name: ranked ids per query}, ingest/latency figures)."""
    prefix = f"bfcl{uuid.uuid4().hex[:6]}:"
    episodes = {ns: items for ev in evals for ns, items in ev.episodes.items()}
    info: dict[str, Any] = {"loadavg_start": _load()}
    with private_redis() as server:
        env = service_env(server.url, prefix, args.embedder)
        workers = spawn_workers(args.workers, env, name="bfcl")
        query = None
        try:
            t0 = time.perf_counter()
            n = await publish_episodes(server.url, prefix, episodes)
            counts = {ns: len(items) for ns, items in episodes.items()}
            project_s = await wait_recallable(server.url, prefix, counts, workers, timeout=args.timeout)
            info |= {"episodes": n, "publish_to_queryable_s": time.perf_counter() - t0, "wait_s": project_s}
            print(f"{n} episodes queryable after {info['publish_to_queryable_s']:.1f}s (load {_load():.1f})")
            tokens = {ns: f"bench{i}{uuid.uuid4().hex[:8]}" for i, ns in enumerate(episodes)}
            port = _free_port()
            keys = ",".join(f"{tok}={ns}" for ns, tok in tokens.items())
            query = spawn_query_service({**env, "ENGRAM_API_KEYS": keys}, port)
            base = f"http://127.0.0.1:{port}"
            await wait_http_ready(base, query)
            ranked: dict[str, list[list[str]]] = {}
            for ev in evals:
                as_of = {ns: ev.as_of(ns) for ns in ev.episodes}
                jobs = [
                    (q.namespace, q.text, {"top_k": TOP_K, "as_of": as_of[q.namespace]}) for q in ev.queries
                ]
                ranked[ev.name], p50 = await recall_ranked(
                    base, tokens, jobs, concurrency=args.concurrency, desc=ev.name
                )
                info[f"recall_p50_ms {ev.name}"] = p50 * 1000
        finally:
            if query is not None:
                qtail = stop_processes([query])[0]
                if "Traceback" in qtail or "ERROR" in qtail:
                    print("query service stderr:\n" + qtail, file=sys.stderr)
            tails = stop_processes(workers)
            if any("Traceback" in t for t in tails):
                print("worker stderr:\n" + "\n".join(tails), file=sys.stderr)
    info["loadavg_end"] = _load()
    return ranked, info


def load_evaluations(wheel: Wheel, args: argparse.Namespace) -> list[Evaluation]:
    """The evaluations `args.evals` names, shaped from the wheel's files."""
    evals = []
    if "memory" in args.evals:
        prereq = {s: wheel.lines(f"memory_prereq_conversation/memory_{s}.json") for s in SCENARIOS}
        if args.sessions is not None:
            prereq = {s: convs[: max(1, args.sessions // len(SCENARIOS))] for s, convs in prereq.items()}
        evals.append(
            memory_evaluation(
                wheel.lines("BFCL_v4_memory.json"),
                wheel.lines("possible_answer/BFCL_v4_memory.json"),
                prereq,
                subset=args.sessions is not None,
            )
        )
    if "agent" in args.evals:
        evals.append(
            agent_evaluation(
                wheel.lines("BFCL_v4_multi_turn_base.json"),
                wheel.lines("possible_answer/BFCL_v4_multi_turn_base.json"),
                folds=args.folds,
                sessions=args.sessions,
            )
        )
    return evals


async def run(wheel: Wheel, args: argparse.Namespace) -> dict[str, Any]:
    evals = load_evaluations(wheel, args)
    from shared.embedding import make_embedder
    from shared.settings import Settings

    resolved = make_embedder(Settings(embedder=args.embedder)).name  # lazy: loads no model
    out: dict[str, Any] = {
        "machine": machine(),
        "wheel": f"bfcl-eval=={WHEEL_VERSION} ({wheel.path.name})",
        "embedder": f"{args.embedder} ({resolved})" if args.embedder == "auto" else args.embedder,
        "workers": args.workers,
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "evaluations": {},
    }
    for ev in evals:
        print(
            f"{ev.name}: {sum(len(v) for v in ev.episodes.values())} stored episodes in {len(ev.episodes)} "
            f"namespaces, {len(ev.queries)} questions; dropped {ev.dropped or 'none'}"
        )
    ranked, out["ingest"] = await ingest_and_ask(evals, args)
    for ev in evals:
        rels = sorted({r for q in ev.queries for r in q.relevant})
        block: dict[str, Any] = {
            "namespaces": {ns: len(v) for ns, v in ev.episodes.items()},
            "questions": len(ev.queries),
            "dropped": ev.dropped,
            "relevance": {},
        }
        for rel in rels:
            rows = [metrics(r, q.relevant[rel]) for r, q in zip(ranked[ev.name], ev.queries, strict=True)]
            block["relevance"][rel] = {
                "mean_relevant": float(np.mean([len(q.relevant[rel]) for q in ev.queries]))
                if ev.queries
                else 0.0,
                "means": {m: float(np.mean([r[m] for r in rows])) for m in METRICS},
                "per_question": rows,  # for `python -m bench.paired`
            }
        out["evaluations"][ev.name] = block
    return out


def _load() -> float:
    import os

    return os.getloadavg()[0]


def _free_port() -> int:
    from deploy.embedded_redis import free_port

    return free_port()


def render(out: dict[str, Any]) -> str:
    """The result table (Markdown): a row per evaluation and relevance, a column per metric."""
    lines = [f"bfcl-eval held-out recall, embedder {out['embedder']}, {out['started_utc']} UTC\n"]
    rows: list[list[Any]] = []
    for name, block in out["evaluations"].items():
        lines.append(f"{name}: {block['questions']} questions; dropped {block['dropped'] or 'none'}")
        for rel, entry in block["relevance"].items():
            rows.append([name, rel, f"{entry['mean_relevant']:.1f}"] + [entry["means"][m] for m in METRICS])
    lines.append("")
    lines.append(table(["evaluation", "relevance", "relevant per question", *METRICS], rows))
    info = out["ingest"]
    lines.append(
        f"\n{info['episodes']} episodes queryable after {info['publish_to_queryable_s']:.1f} s "
        f"(load {info['loadavg_start']:.1f} → {info['loadavg_end']:.1f})"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.bfcl", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--wheel", type=Path, default=None, help="a bfcl-eval wheel to read (default: find or fetch)"
    )
    p.add_argument("--cache", type=Path, default=CACHE, help="where the wheel is looked for and fetched to")
    p.add_argument("--no-download", dest="download", action="store_false", help="never run pip download")
    p.add_argument(
        "--embedder", default="auto", help="ENGRAM_EMBEDDER (default: the service's default, auto)"
    )
    p.add_argument("--workers", type=int, default=1, help="consolidator processes")
    p.add_argument("--evals", type=lambda s: s.split(","), default=["memory", "agent"], help="memory,agent")
    p.add_argument("--folds", type=int, default=FOLDS, help="agent-task folds (each is the query set once)")
    p.add_argument("--sessions", type=int, default=None, help="smoke runs: only the first N sessions")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent recall requests")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the projection")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results-bfcl.json", help="result file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.wheel is not None and not args.wheel.is_file():  # a path the user named: an error, not "no data"
        print(f"--wheel {args.wheel}: no such file", file=sys.stderr)
        return 2
    path = args.wheel if args.wheel is not None else find_wheel(args.cache, download=args.download)
    if path is not None and not zipfile.is_zipfile(path):
        print(
            f"{path} is not a wheel (not a zip file; a broken download?): delete it and run again",
            file=sys.stderr,
        )
        return 2
    if path is None or not path.exists():
        print(
            f"bfcl-eval=={WHEEL_VERSION} not obtainable (not in {args.cache}, pip download failed): skipping"
        )
        return 0
    started = time.perf_counter()
    out = asyncio.run(run(Wheel(path), args))
    out["wall_s"] = time.perf_counter() - started
    write_json(args.out, out)
    print(render(out))
    print(f"\nwrote {args.out} ({out['wall_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
