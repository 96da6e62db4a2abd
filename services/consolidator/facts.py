"""Semantic memory: consolidate clusters of a scope's episodes into facts (see shared.facts).

Clustering. `AgglomerativeClustering(metric="cosine", linkage="average", distance_threshold=d)` over
the unit episode vectors. `d` is `ENGRAM_FACTS_DISTANCE`, or when unset the default calibrated for the
embedder the live index was built with (`DEFAULT_DISTANCE`, measured by
`services.consolidator.calibration` on labelled task families). Chosen over k-means and HDBSCAN because
(1) it needs no k: the number of task families is unknown and changes; (2) average linkage with a
distance threshold states the guarantee we want directly — two groups are merged only when their
*average* pairwise cosine distance is below `d`, so unrelated families do not chain through a pair of
close episodes, where k-means with too small a k must merge them; (3) it is fully deterministic (no
random initialisation), so the same episodes always give the same clusters; (4) it is exact on the small
sets involved (a scope is capped at its newest `ENGRAM_FACTS_MAX_EPISODES` episodes; O(n²) memory).
HDBSCAN would need min_cluster_size tuning and labels small families as noise. Clusters smaller than
`ENGRAM_FACTS_MIN_CLUSTER` yield no fact.

Facts are a function of the episodes (`derive`, pure). Each cluster's time-ordered evidence is cut into
regimes where its outcomes, or one strategy's outcomes, flip (`shared.regimes`: success rates on either
side of 50%, 0.5 apart, each side >= min_cluster episodes, Fisher p <= 0.05). The newest regime is the
cluster's current fact, each older one a fact it superseded (`status=superseded`, `superseded_by`; the
newer one `supersedes` it and counts evidence from `evidence_since`). Nothing in this depends on the
previous facts or on when consolidation ran: any interleaving of publishes and runs ends in the facts
one run over the same episodes gives (property-tested), and every episode of a large enough cluster is
in exactly one fact.

Stable ids (`plan`). The previous facts only lend identities: each derived fact takes the id of the
previous fact (current or superseded) holding the largest share (>= half) of that fact's evidence,
greedily one to one, and with it `created_at` and `version`. An unchanged fact is kept byte for byte
(no new version or `updated_at`); a changed one is `version` + 1; the summariser's rewrite stays while
the deterministic text is the same. Previous superseded facts whose evidence has left the scope's window
stay as history (at most HISTORY_LIMIT); any other previous fact no derived fact took is removed.

Facts are events. A run publishes one `FactsConsolidated` holding the scope's whole state (current
facts and history) with a per-scope sequence number, then projects it (`apply_snapshot`, one MULTI per
scope under WATCH; a snapshot older than the applied one is ignored), and the worker that consumes the
event projects it again idempotently — so a replay rebuilds facts. Nothing is written before the event
is published: a crash mid-run leaves the previous facts as they were. A lease (`SET NX PX`) per scope
lets one process consolidate it at a time.

Triggers (`Consolidator.on_batch`): after every `ENGRAM_FACTS_EVERY` newly completed episodes of a
scope, or when their summed importance reaches `ENGRAM_FACTS_IMPORTANCE_THRESHOLD` (Generative Agents
reflect at 150; Park et al. 2023, section 4.2), or on demand (`POST /v1/consolidate`).

The optional summariser (`services.consolidator.summarizer`) rewrites the text of current facts it has
not rewritten yet; a failure keeps the deterministic text marked `summary="fallback"`, is counted
(`RunResult.summarizer_failures`, `engram_summarizer_failures_total`) and is retried on the next run.

Forgetting (`forget_evidence`, called by the projector after it erased episodes): every fact whose
evidence named a forgotten episode is rebuilt from its remaining evidence (or removed below
`min_cluster`), with the deterministic text; the scope's previous snapshot events are XDEL'd from the
stream once the new one is published, so neither the projection nor the stream keeps their ids or text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import WatchError
from sklearn.cluster import AgglomerativeClustering

from engram_episodic.errors import EngramError, InvalidEpisode
from engram_episodic.events import Episode, FactsConsolidated
from engram_episodic.shapes import episode_from_stored
from engram_episodic.timeutil import format_instant
from shared import streams
from shared.codec import encode
from shared.facts import (
    CENTROID_FIELD,
    DOC_FIELD,
    LEVEL_NAMESPACE,
    MAX_TEXT_CHARS,
    STATUS_CURRENT,
    STATUS_SUPERSEDED,
    SUMMARY_FALLBACK,
    SUMMARY_LLM,
    Fact,
    FactScope,
    ensure_facts_index,
    fact_fields,
    fact_from_doc,
    facts_with_evidence,
    superseded,
)
from shared.index import STATUS_COMPLETED, Scope, current_generation, generation_tags
from shared.keyring import deployment_tag_key
from shared.keys import Keys, digest
from shared.regimes import segments
from shared.settings import Settings
from shared.tags import TagCodec

log = logging.getLogger("engram.facts")

HISTORY_LIMIT = 50  # superseded facts kept per scope (newest first)
DEFAULT_DISTANCE = {"mpnet-base-v2": 0.70, "minilm-l6-v2": 0.69, "hashing-v1": 0.59}
"""The clustering threshold per embedder when ENGRAM_FACTS_DISTANCE is unset, calibrated on labelled task
families (`services.consolidator.calibration`; figures in docs/architecture.md "Facts"): the largest
threshold at which at most 1% of random scopes of 5 unrelated families hold a fact mixing two of them."""
FALLBACK_DISTANCE = 0.5
"""Embedders not calibrated (`openai/...`): measure with `python -m services.consolidator.calibration
--embedder openai` and set ENGRAM_FACTS_DISTANCE."""


def default_distance(embedder: str | None) -> float:
    """The calibrated threshold of the embedder the index was built with (FALLBACK_DISTANCE if unknown)."""
    return DEFAULT_DISTANCE.get(embedder or "", FALLBACK_DISTANCE)
PAGE = 500
RELEASE_LUA = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


# --- inputs ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Row:
    """One completed episode of a scope with its unit vector."""

    episode: Episode
    vector: np.ndarray

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id

    @property
    def completed_at(self) -> float:
        return self.episode.completed_at if self.episode.completed_at is not None else 0.0


def _order(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.completed_at, r.episode_id))


def _row(doc: bytes | None, vector: bytes | None) -> Row | None:
    if not doc or not vector:
        return None
    try:
        episode = episode_from_stored(json.loads(doc))
    except (TypeError, ValueError, KeyError, AttributeError, EngramError):
        return None
    v = np.frombuffer(vector, dtype=np.float32).astype(np.float64)
    norm = float(np.linalg.norm(v))
    if not np.isfinite(norm) or norm == 0:
        return None
    return Row(episode=episode, vector=v / norm)


async def load_rows(r: aioredis.Redis, index: str, scope: FactScope, limit: int, tags: TagCodec) -> list[Row]:
    """The scope's newest `limit` completed episodes with their vectors (FT.SEARCH, paged)."""
    filters = Scope(namespace=scope.namespace, tags=tags, agent_id=scope.agent_id,
                    category=(scope.category,) if scope.agent_id is not None and scope.category else (),
                    status=STATUS_COMPLETED)
    rows: list[Row] = []
    offset = 0
    while offset < limit:
        n = min(PAGE, limit - offset)
        reply = await r.execute_command("FT.SEARCH", index, filters.query(), "RETURN", 2, "doc", "vector",
                                        "SORTBY", "completed_at", "DESC", "LIMIT", offset, n, "DIALECT", 2)
        page = reply[2::2]
        for fields in page:
            f = {fields[i]: fields[i + 1] for i in range(0, len(fields) - 1, 2)}
            row = _row(f.get(b"doc"), f.get(b"vector"))
            if row is not None:
                rows.append(row)
        offset += n
        if len(page) < n:
            break
    return _order(rows)


async def load_rows_by_id(r: aioredis.Redis, keys: Keys, gen: int, namespace: str, ids: Sequence[str]) -> list[Row]:
    """Completed episodes by id (missing, forgotten or draft ones are skipped)."""
    async with r.pipeline(transaction=False) as pipe:
        for eid in ids:
            pipe.hmget(keys.episode_doc(gen, namespace, eid), ["doc", "vector", "status"])
        raw = await pipe.execute()
    rows = []
    for doc, vec, status in raw:
        if status == STATUS_COMPLETED.encode():
            row = _row(doc, vec)
            if row is not None:
                rows.append(row)
    return _order(rows)


# --- clustering and statistics (pure) -------------------------------------------------------------
def cluster(vectors: np.ndarray, distance: float) -> list[list[int]]:
    """Row indices grouped by average-linkage agglomerative clustering on cosine distance.

    Groups are ordered by their smallest index; deterministic for a given input order.
    """
    n = len(vectors)
    if n == 0:
        return []
    if n == 1:
        return [[0]]
    labels = AgglomerativeClustering(n_clusters=None, metric="cosine", linkage="average",
                                     distance_threshold=distance).fit_predict(vectors)
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(int(label), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def _rate(rows: Sequence[Row]) -> float:
    return sum(r.episode.outcome == "success" for r in rows) / len(rows) if rows else 0.0


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _failure_messages(ep: Episode) -> list[str]:
    msgs = [a.error for a in ep.actions if a.error]
    if not msgs and ep.outcome_details:
        msgs = [ep.outcome_details]
    if not msgs and ep.feedback is not None and ep.feedback.message:
        msgs = [ep.feedback.message]
    return sorted({_clip(m, 200) for m in msgs if m.strip()})


def build_fact(scope: FactScope, rows: Sequence[Row], *, fact_id: str, now: float, created_at: float | None = None,
               version: int = 1, evidence_since: float | None = None, supersedes: str | None = None) -> Fact:
    """A fact from its evidence rows: statistics, centroid, confidence, kind and deterministic text."""
    rows = _order(rows)
    n = len(rows)
    eps = [r.episode for r in rows]
    successes = sum(e.outcome == "success" for e in eps)
    rate = round(successes / n, 4)
    rewards = [e.feedback.reward for e in eps if e.feedback is not None and e.feedback.reward is not None]
    avg_reward = round(float(np.mean(rewards)), 4) if rewards else None
    by_strategy: dict[str, list[Episode]] = {}
    for e in eps:
        if e.strategy_used:
            by_strategy.setdefault(e.strategy_used, []).append(e)
    strategies = sorted(
        ({"strategy": s, "episodes": len(v), "successes": sum(x.outcome == "success" for x in v),
          "success_rate": round(sum(x.outcome == "success" for x in v) / len(v), 4)} for s, v in by_strategy.items()),
        key=lambda d: (-d["episodes"], -d["successes"], d["strategy"]))[:5]
    failures = Counter(m for e in eps if e.outcome != "success" for m in _failure_messages(e))
    common_failures = [{"message": m, "count": c} for m, c in sorted(failures.items(), key=lambda x: (-x[1], x[0]))[:3]]
    acts: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for e in eps:
        for a in e.actions:
            acts[a.action_type] += 1
            failed[a.action_type] += bool(a.error) or a.success is False
    action_types = [{"action_type": t, "count": c, "failed": failed[t]}
                    for t, c in sorted(acts.items(), key=lambda x: (-x[1], x[0]))[:5]]
    matrix = np.stack([r.vector for r in rows])
    centroid = matrix.mean(axis=0)
    centroid = (centroid / max(float(np.linalg.norm(centroid)), 1e-12)).astype(np.float32)
    cos = matrix @ centroid.astype(np.float64)
    order = sorted(range(n), key=lambda i: (-round(float(cos[i]), 9), rows[i].episode_id))
    central = tuple(rows[i].episode_id for i in order[:3])
    cohesion = float(np.clip(np.mean(cos), 0.0, 1.0))
    confidence = round(cohesion * n / (n + 2), 4)
    best = next((s for s in sorted(strategies, key=lambda d: (-d["success_rate"], -d["episodes"], d["strategy"]))
                 if s["episodes"] >= 2), None)
    if rate >= 0.7:
        kind = "strategy" if best is not None and best["success_rate"] >= 0.7 else "best_practice"
    elif rate <= 0.3:
        kind = "failure_pattern"
    else:
        kind = "best_practice"
    first_at, last_at = rows[0].completed_at, rows[-1].completed_at
    tasks = [rows[i].episode.task.description for i in order[:3] if rows[i].episode.task]
    categories = sorted({e.task.category for e in eps if e.task and e.task.category})
    text = _text(kind, n, successes, avg_reward, strategies, common_failures, action_types, first_at, last_at,
                 tasks, categories)
    return Fact(
        fact_id=fact_id, namespace=scope.namespace, scope_id=scope.scope_id, level=scope.level,
        agent_id=scope.agent_id, category=scope.category, kind=kind, text=text, base_text=text,
        support=n, successes=successes, success_rate=rate, avg_reward=avg_reward,
        top_strategies=tuple(strategies), common_failures=tuple(common_failures), action_types=tuple(action_types),
        evidence=tuple(sorted(r.episode_id for r in rows)), central=central,
        agents=tuple(sorted({e.agent_id for e in eps if e.agent_id})),
        users=tuple(sorted({e.user_id for e in eps if e.user_id})), categories=tuple(categories),
        first_at=first_at, last_at=last_at, evidence_since=evidence_since,
        centroid=tuple(float(x) for x in centroid), confidence=confidence, version=version,
        created_at=now if created_at is None else created_at, updated_at=now, supersedes=supersedes)


_HEAD = {"strategy": "What works", "failure_pattern": "What fails", "best_practice": "Mixed results"}


def _text(kind: str, n: int, successes: int, avg_reward: float | None, strategies: list[dict[str, Any]],
          failures: list[dict[str, Any]], actions: list[dict[str, Any]], first_at: float, last_at: float,
          tasks: list[str], categories: list[str]) -> str:
    """The deterministic sentence(s) of a fact, at most MAX_TEXT_CHARS."""
    subject = f'tasks like "{_clip(tasks[0], 100)}"' if tasks else "these tasks"
    if categories:
        subject += f" ({', '.join(_clip(c, 40) for c in categories[:3])})"
    span = (format_instant(first_at) or "")[:10], (format_instant(last_at) or "")[:10]
    when = f"on {span[0]}" if span[0] == span[1] else f"between {span[0]} and {span[1]}"
    # a best practice with a high success rate but no repeated strategy is not "mixed"
    head = "What works" if kind == "best_practice" and successes >= 0.7 * n else _HEAD[kind]
    parts = [f"{head}: for {subject}, {successes} of {n} attempts succeeded ({round(100 * successes / n)}%) "
             f"{when}" + (f", average reward {avg_reward:.2f}." if avg_reward is not None else ".")]
    if strategies:  # the one that works best first: the text is what an agent follows
        ranked = sorted(strategies, key=lambda d: (-d["success_rate"], -d["episodes"], d["strategy"]))
        parts.append("Strategies: " + "; ".join(
            f"{_clip(s['strategy'], 40)} succeeded {s['successes']} of {s['episodes']}" for s in ranked) + ".")
    if failures:
        parts.append("Failures were: " + "; ".join(f'"{_clip(f["message"], 80)}" ({f["count"]}x)' for f in failures) + ".")
    if actions:
        parts.append("Common actions: " + ", ".join(f"{_clip(a['action_type'], 30)} ({a['count']})" for a in actions) + ".")
    return _clip(" ".join(parts), MAX_TEXT_CHARS)


def regimes(rows: Sequence[Row], min_size: int) -> list[list[Row]]:
    """A cluster's time-ordered evidence cut where outcomes or a strategy's outcomes flip
    (`shared.regimes.segments`), oldest first; every regime has at least `min_size` rows."""
    rows = _order(rows)
    success = [r.episode.outcome == "success" for r in rows]
    strategies = [r.episode.strategy_used for r in rows]
    return [rows[a:b] for a, b in segments(success, strategies, min_size)]


def derive(rows: Sequence[Row], *, min_cluster: int, distance: float) -> list[list[list[Row]]]:
    """The scope's fact state as a function of its episodes alone: per cluster of at least `min_cluster`
    episodes (in the order of their oldest episode), its regimes oldest first. The newest regime is the
    current fact; each older one is a fact it superseded. No previous state, no clock: the same episodes
    give the same regimes however (and however often) they were consolidated before."""
    rows = _order(rows)
    if not rows:
        return []
    groups = [[rows[i] for i in g] for g in cluster(np.stack([r.vector for r in rows]), distance)]
    return [regimes(g, min_cluster) for g in groups if len(g) >= min_cluster]


def plan(scope: FactScope, rows: Sequence[Row], previous: Sequence[Fact], *, min_cluster: int, distance: float,
         now: float) -> tuple[list[Fact], list[str]] | None:
    """The scope's next facts (current and history) and removed ids; None when nothing changes.

    What the facts say (evidence, statistics, kind, text, which one is current) is `derive(rows)`; the
    previous facts only lend their ids, versions, creation times and summarised texts: each derived fact
    takes the id of the previous fact (current or superseded) holding the largest share (>= half) of
    that fact's evidence, greedily one to one; unchanged facts are kept byte for byte. Previous
    superseded facts whose evidence left the scope's window entirely stay as history; every other
    previous fact that no derived fact took is removed.
    """
    derived = derive(rows, min_cluster=min_cluster, distance=distance)
    items = [(gi, k, part) for gi, parts in enumerate(derived) for k, part in enumerate(parts)]
    last = {gi: len(parts) - 1 for gi, parts in enumerate(derived)}
    prev = {f.fact_id: f for f in previous}
    # greedy one-to-one matching by the share of the previous fact's evidence found in the derived fact
    evidence = {fid: set(f.evidence) for fid, f in prev.items() if f.evidence}
    pairs = []
    for n, (gi, k, part) in enumerate(items):
        ids = {r.episode_id for r in part}
        is_current = k == last[gi]
        for fid, ev in evidence.items():
            inter = len(ids & ev)
            if inter / len(ev) >= 0.5:  # ties: the same status (current with current), then order
                pairs.append((-inter / len(ev), -inter, (prev[fid].status == STATUS_CURRENT) != is_current, n, fid))
    match: dict[int, Fact] = {}
    taken: set[str] = set()
    for *_, n, fid in sorted(pairs):
        if n not in match and fid not in taken:
            match[n] = prev[fid]
            taken.add(fid)
    used = set(prev)
    ids_of: dict[tuple[int, int], str] = {}
    for n, (gi, k, part) in enumerate(items):
        ids_of[gi, k] = match[n].fact_id if n in match else _new_id(scope, part[0].episode_id, used)
    out: list[Fact] = []
    for n, (gi, k, part) in enumerate(items):
        fid = ids_of[gi, k]
        is_current = k == last[gi]
        since = part[0].completed_at if k > 0 else None
        supersedes = ids_of[gi, k - 1] if k > 0 else None
        old = match.get(n)
        if old is None:
            fresh = build_fact(scope, part, fact_id=fid, now=now, evidence_since=since, supersedes=supersedes)
            if not is_current:
                fresh = superseded(fresh, ids_of[gi, k + 1], now)
            out.append(fresh)
            continue
        fresh = build_fact(scope, part, fact_id=fid, now=old.updated_at, created_at=old.created_at,
                           version=old.version, evidence_since=since, supersedes=supersedes)
        if fresh.base_text == old.base_text:  # the summariser's rewrite of the same text stays
            fresh = replace(fresh, text=old.text, summary=old.summary)
        if not is_current:
            at = old.superseded_at if old.status == STATUS_SUPERSEDED and old.superseded_at is not None else now
            fresh = superseded(fresh, ids_of[gi, k + 1], at)
        out.append(old if fresh == old else replace(fresh, version=old.version + 1, updated_at=now))
    window = {r.episode_id for r in rows}
    aged = [f for f in previous if f.status == STATUS_SUPERSEDED and f.fact_id not in taken
            and not window & set(f.evidence)]
    current = [f for f in out if f.status == STATUS_CURRENT]
    history = sorted([f for f in out if f.status != STATUS_CURRENT] + aged,
                     key=lambda f: (-(f.superseded_at or 0.0), f.fact_id))[:HISTORY_LIMIT]
    facts = sorted(current, key=lambda f: f.fact_id) + history
    kept = {f.fact_id for f in facts}
    removed = sorted(fid for fid in prev if fid not in kept)
    if not removed and sorted(facts, key=lambda f: f.fact_id) == sorted(previous, key=lambda f: f.fact_id):
        return None
    return facts, removed


def _new_id(scope: FactScope, seed: str, used: set[str]) -> str:
    fid = digest(scope.scope_id, "fact", seed)
    k = 0
    while fid in used:
        k += 1
        fid = digest(scope.scope_id, "fact", seed, str(k))
    used.add(fid)
    return fid


# --- the projection ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ScopeState:
    seq: int
    facts: list[Fact]
    sids: list[str]
    min_cluster: int | None


async def load_state(r: aioredis.Redis, keys: Keys, gen: int, scope_id: str) -> ScopeState:
    seq, ids, sids, min_cluster = await r.hmget(keys.fact_scope(gen, scope_id), ["seq", "ids", "sids", "min_cluster"])
    fact_ids = json.loads(ids) if ids else []
    facts = []
    if fact_ids:
        async with r.pipeline(transaction=False) as pipe:
            for fid in fact_ids:
                pipe.hmget(keys.fact_doc(gen, fid), [DOC_FIELD, CENTROID_FIELD])
            for doc, centroid in await pipe.execute():
                if doc is not None:
                    facts.append(fact_from_doc(doc, centroid))
    return ScopeState(seq=int(seq or 0), facts=facts, sids=json.loads(sids) if sids else [],
                      min_cluster=int(min_cluster) if min_cluster else None)


def snapshot_facts(event: FactsConsolidated) -> tuple[FactScope, int, list[Fact]]:
    """Validate a FactsConsolidated event: its scope, sequence number and facts (InvalidEpisode if bad)."""
    scope = FactScope.from_data(event.scope)
    try:
        seq = int(event.scope.get("seq", "0"))
    except ValueError:
        raise InvalidEpisode([("scope.seq", "must be an integer")]) from None
    facts = [Fact.from_data(f) for f in event.facts]
    if scope.namespace != event.namespace or scope.scope_id != event.scope.get("scope_id", scope.scope_id) \
            or any(f.namespace != event.namespace or f.scope_id != scope.scope_id for f in facts):
        raise InvalidEpisode([("facts", "facts must belong to the event's namespace and scope")])
    return scope, seq, facts


async def apply_snapshot(r: aioredis.Redis, keys: Keys, gen: int, event: FactsConsolidated,
                         stream_id: bytes | str | None, dim: int, tags: TagCodec) -> bool:
    """Project a scope snapshot into generation `gen` (whose TAG digests are `tags`) atomically; False
    when an equal or newer one is in."""
    scope, seq, facts = snapshot_facts(event)
    await ensure_facts_index(r, keys, gen, dim, point_alias=await current_generation(r, keys) == gen)
    state_key = keys.fact_scope(gen, scope.scope_id)
    sid = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    async with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(state_key)
                cur_seq, cur_ids, cur_sids = await pipe.hmget(state_key, ["seq", "ids", "sids"])
                if int(cur_seq or 0) >= seq:
                    await pipe.unwatch()
                    return False
                old_ids = set(json.loads(cur_ids) if cur_ids else [])
                sids = (json.loads(cur_sids) if cur_sids else []) + ([sid] if sid else [])
                new_ids = [f.fact_id for f in facts]
                pipe.multi()
                for fid in sorted(old_ids - set(new_ids)):
                    pipe.delete(keys.fact_doc(gen, fid))
                for f in facts:
                    pipe.delete(keys.fact_doc(gen, f.fact_id))
                    pipe.hset(keys.fact_doc(gen, f.fact_id), mapping=fact_fields(f, tags))
                pipe.hset(state_key, mapping={"seq": seq, "ids": json.dumps(new_ids), "sids": json.dumps(sids),
                                              "namespace": scope.namespace, "event": encode(event),
                                              "min_cluster": event.scope.get("min_cluster", "")})
                await pipe.execute()
                return True
            except WatchError:
                continue


# --- the consolidator -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunResult:
    scope: FactScope
    status: str  # "published", "unchanged", "busy"
    facts: int = 0
    removed: int = 0
    seq: int = 0
    summarizer_failures: int = 0
    """Facts whose summary failed in this run (they keep the deterministic text, retried next run)."""

    def to_json(self) -> dict[str, Any]:
        return {"scope": {k: v for k, v in self.scope.to_data().items() if k != "scope_id"},
                "status": self.status, "facts": self.facts, "removed": self.removed,
                "summarizer_failures": self.summarizer_failures}


Publisher = Callable[[FactsConsolidated], Awaitable[str]]


class Consolidator:
    """Builds and publishes facts. One per worker process (and one in the query service for on-demand runs).

    `dim` is the embedder's dimension (the facts index's vector size). `publish(event)` XADDs an event
    and returns its stream id (defaults to `shared.streams.publish`).
    """

    def __init__(self, settings: Settings, redis: aioredis.Redis, dim: int, *, summarizer=None,
                 publish: Publisher | None = None, background: bool = False,
                 backlogged: Callable[[], bool] | None = None):
        """With `background=True` (the consolidator process), triggered runs are scheduled as tasks
        (one at a time per scope, coalescing triggers that arrive meanwhile) so that projecting the
        stream never waits for clustering; `aclose()` waits for them at shutdown.

        `backlogged()` (the worker's "my last read came back full") defers a background run while it
        is true, for at most `facts_min_interval` seconds: during an ingest burst the scope's episodes
        are still arriving, so clustering now would be redone soon anyway, and its CPU is taken from
        the projection (on 2 cores, ~10% of the ingest rate in `make bench`)."""
        self.background = background
        self._backlogged = backlogged or (lambda: False)
        self._tasks: dict[str, asyncio.Task] = {}
        self._again: set[str] = set()
        self._last_run: dict[str, float] = {}
        self._closing = asyncio.Event()
        self.settings = settings
        self.redis = redis
        self.keys = Keys(settings.prefix)
        self.dim = dim
        self.summarizer = summarizer
        self._publish = publish
        self._release = redis.register_script(RELEASE_LUA)
        self.runs = 0
        self.summarizer_failures = 0
        self._tags: dict[int, TagCodec] = {}

    async def tags(self, gen: int) -> TagCodec:
        """The TAG digest function of generation `gen` (`shared.tags`), read once per generation."""
        got = self._tags.get(gen)
        if got is None:
            tag_key = await deployment_tag_key(self.redis, self.keys, self.settings.master_key)
            got = self._tags[gen] = await generation_tags(self.redis, self.keys, gen, tag_key)
        return got

    async def publish(self, event: FactsConsolidated) -> str:
        if self._publish is not None:
            return await self._publish(event)
        (sid,) = await streams.publish(self.redis, self.keys.stream, [encode(event)])
        return sid.decode() if isinstance(sid, bytes) else str(sid)

    # --- lease ---------------------------------------------------------------------------------
    async def _acquire(self, scope_id: str, *, wait: float = 0.0) -> str | None:
        token = uuid.uuid4().hex
        deadline = time.monotonic() + wait
        while True:
            if await self.redis.set(self.keys.consolidation_lock(scope_id), token, nx=True,
                                    px=self.settings.lease_ms):
                return token
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.05)

    async def _release_lock(self, scope_id: str, token: str) -> None:
        await self._release(keys=[self.keys.consolidation_lock(scope_id)], args=[token])

    # --- triggers ------------------------------------------------------------------------------
    async def on_batch(self, result) -> list[RunResult]:
        """Worker hook: count newly completed episodes per scope; consolidate scopes past a threshold."""
        touched: dict[str, tuple[FactScope, int, float]] = {}
        for namespace, folded in result.completed:
            ep = folded.episode
            if ep is None:
                continue
            scopes = [FactScope(namespace)]
            if ep.agent_id and ep.task is not None:
                scopes.append(FactScope(namespace, ep.agent_id, ep.task.category))
            for s in scopes:
                _, n, imp = touched.get(s.scope_id, (s, 0, 0.0))
                touched[s.scope_id] = (s, n + 1, imp + float(ep.importance or 0.0))
        return await self.count(list(touched.values()))

    async def count(self, increments: list[tuple[FactScope, int, float]]) -> list[RunResult]:
        if not increments:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for s, n, imp in increments:
                pipe.hincrby(self.keys.scope_counter(s.scope_id), "completed", n)
                pipe.hincrbyfloat(self.keys.scope_counter(s.scope_id), "importance", imp)
            totals = await pipe.execute()
        out = []
        for i, (s, _, _) in enumerate(increments):
            completed, importance = int(totals[2 * i]), float(totals[2 * i + 1])
            if self._reached(completed, importance):
                # INFO once per scheduled run; the triggers a pending run absorbs are DEBUG (a new-user
                # trial saw two INFO lines per episode in a trickle past the threshold)
                pending = self.background and s.scope_id in self._tasks and not self._tasks[s.scope_id].done()
                log.log(logging.DEBUG if pending else logging.INFO, "facts ◆ trigger %s ◆ %d completed ◆ "
                        "importance %.1f", s.scope_id[:12], completed, importance)
                if self.background:
                    self._schedule(s)
                else:
                    out.append(await self.consolidate(s))
        return out

    def _schedule(self, scope: FactScope) -> None:
        running = self._tasks.get(scope.scope_id)
        if running is not None and not running.done():
            self._again.add(scope.scope_id)  # run once more when the current run ends
            return
        self._tasks[scope.scope_id] = asyncio.create_task(self._run_in_background(scope))

    async def _run_in_background(self, scope: FactScope) -> None:
        """Run the scope's consolidation, at most once per `facts_min_interval` seconds: under a burst
        of ingest, triggers coalesce into one run per interval instead of re-clustering the scope
        after every `facts_every` episodes."""
        sid = scope.scope_id
        recent = self.keys.facts_recent(sid)
        while not self._closing.is_set():
            wait = self._last_run.get(sid, -math.inf) + self.settings.facts_min_interval - time.monotonic()
            # the interval holds across workers: with two processes each ran the scope once per
            # interval, seconds apart (found by a new-user trial)
            wait = max(wait, await self.redis.pttl(recent) / 1000.0)
            if wait > 0:
                try:
                    await asyncio.wait_for(self._closing.wait(), wait)
                    return  # closing: the counter was not reset, so the scope is picked up again later
                except TimeoutError:
                    pass
                if not await self._still_triggered(scope):  # the run that made us wait consumed it
                    return
            deadline = time.monotonic() + self.settings.facts_min_interval
            while self._backlogged() and time.monotonic() < deadline and not self._closing.is_set():
                try:
                    await asyncio.wait_for(self._closing.wait(), min(0.25, self.settings.facts_min_interval))
                except TimeoutError:
                    pass
            if self._closing.is_set():
                return
            self._again.discard(sid)
            self._last_run[sid] = time.monotonic()
            await self.redis.set(recent, b"1", px=max(1, int(self.settings.facts_min_interval * 1000)))
            try:
                await self.consolidate(scope)
            except Exception:  # the counter was not reset: the next trigger retries this scope
                log.exception("facts ◆ consolidation of %s failed", sid[:12])
            if sid not in self._again:
                return

    async def _still_triggered(self, scope: FactScope) -> bool:
        """The scope's trigger counter is still at a threshold (another run may have consumed it)."""
        counter = await self.redis.hgetall(self.keys.scope_counter(scope.scope_id))
        return self._reached(int(counter.get(b"completed", b"0")), float(counter.get(b"importance", b"0")))

    def _reached(self, completed: int, importance: float) -> bool:
        """The trigger: `facts_every` completed episodes, or their summed importance at the threshold."""
        return completed >= self.settings.facts_every or importance >= self.settings.facts_importance_threshold

    async def wait_idle(self) -> None:
        """Wait until no background consolidation is running (tests, shutdown)."""
        while pending := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def aclose(self, grace: float = 20.0) -> None:
        """Let running consolidations finish within `grace` seconds, then cancel the rest (the lease
        and the unchanged counter make the next run pick the scope up again)."""
        self._closing.set()
        try:
            await asyncio.wait_for(self.wait_idle(), grace)
        except TimeoutError:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def scopes_of(self, namespace: str) -> list[FactScope]:
        """The namespace scope and every (agent_id, category) scope with at least min_cluster episodes."""
        index = self.keys.episode_index_alias
        tags = await self.tags(await current_generation(self.redis, self.keys))
        reply = await self.redis.execute_command(
            "FT.AGGREGATE", index, Scope(namespace=namespace, tags=tags).query(), "LOAD", 2, "@agent_id", "@category",
            "FILTER", "exists(@agent_id) && exists(@category)",
            "GROUPBY", 2, "@agent_id", "@category", "REDUCE", "COUNT", 0, "AS", "n", "DIALECT", 2)
        scopes = [FactScope(namespace)]
        for row in reply[1:]:
            f = {row[i].decode(): row[i + 1] for i in range(0, len(row) - 1, 2)}
            if f.get("agent_id") and f.get("category") and int(f.get("n") or 0) >= self.settings.facts_min_cluster:
                scopes.append(FactScope(namespace, f["agent_id"].decode(), f["category"].decode()))
        return sorted(scopes, key=lambda s: (s.level != LEVEL_NAMESPACE, s.agent_id or "", s.category or ""))

    # --- one run ---------------------------------------------------------------------------------
    async def consolidate(self, scope: FactScope, *, now: float | None = None) -> RunResult:
        """Consolidate one scope under its lease; publishes a snapshot when anything changed."""
        token = await self._acquire(scope.scope_id)
        if token is None:
            return RunResult(scope, "busy")
        try:
            counter = await self.redis.hgetall(self.keys.scope_counter(scope.scope_id))
            gen = await current_generation(self.redis, self.keys)
            state = await load_state(self.redis, self.keys, gen, scope.scope_id)
            tags = await self.tags(gen)
            rows = await load_rows(self.redis, self.keys.episode_index_alias, scope, self.settings.facts_max_episodes,
                                   tags)
            now = time.time() if now is None else now
            distance = await self.distance(gen)
            # clustering is CPU-bound: a thread keeps the event loop (and the projection) responsive
            planned = await asyncio.to_thread(plan, scope, rows, state.facts,
                                              min_cluster=self.settings.facts_min_cluster,
                                              distance=distance, now=now)
            facts, removed = planned if planned is not None else (list(state.facts), [])
            # new and changed facts, and those whose summary fell back on an earlier run
            facts, failures = await self._summarise(facts, state.facts, rows, now)
            if planned is None and facts == list(state.facts):
                await self._reset(scope, counter)
                return RunResult(scope, "unchanged", facts=len(state.facts), seq=state.seq,
                                 summarizer_failures=failures)
            event = self._event(scope, state.seq + 1, facts, removed, now)
            sid = await self.publish(event)  # nothing is written before this succeeds
            await apply_snapshot(self.redis, self.keys, gen, event, sid, self.dim, tags)
            await self._reset(scope, counter)
            self.runs += 1
            log.info("facts ◆ scope %s ◆ seq %d ◆ %d facts ◆ %d removed", scope.scope_id[:12], state.seq + 1,
                     len(facts), len(removed))
            return RunResult(scope, "published", facts=len(facts), removed=len(removed), seq=state.seq + 1,
                             summarizer_failures=failures)
        finally:
            await self._release_lock(scope.scope_id, token)

    def _event(self, scope: FactScope, seq: int, facts: list[Fact], removed: Sequence[str],
               now: float) -> FactsConsolidated:
        return FactsConsolidated(namespace=scope.namespace, occurred_at=now,
                                 scope={**scope.to_data(), "seq": str(seq),
                                        "min_cluster": str(self.settings.facts_min_cluster)},
                                 facts=tuple(f.to_data() for f in facts), removed=tuple(removed))

    async def _reset(self, scope: FactScope, counter: dict[bytes, bytes]) -> None:
        """Subtract what this run consumed (increments made meanwhile still count)."""
        key = self.keys.scope_counter(scope.scope_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(key, "completed", -int(counter.get(b"completed", b"0")))
            pipe.hincrbyfloat(key, "importance", -float(counter.get(b"importance", b"0")))
            await pipe.execute()

    async def distance(self, gen: int) -> float:
        """The clustering threshold: ENGRAM_FACTS_DISTANCE, else the default calibrated for the embedder
        the live index was built with (`default_distance`)."""
        if self.settings.facts_distance is not None:
            return self.settings.facts_distance
        name = await self.redis.hget(self.keys.meta, f"g{gen}:embedder")
        return default_distance(name.decode() if name else None)

    async def _summarise(self, facts: list[Fact], previous: list[Fact], rows: Sequence[Row],
                         now: float) -> tuple[list[Fact], int]:
        """Rewrite the text of every current fact the summariser has not rewritten yet (new or changed
        facts, and those that fell back on an earlier run); returns the facts and the failures. A
        failure keeps the deterministic text, marked `summary="fallback"`, so a later run retries it;
        a successful retry of an otherwise unchanged fact is a new version."""
        if self.summarizer is None:
            return facts, 0
        before = {f.fact_id: f for f in previous}
        tasks = {r.episode_id: r.episode.task.description for r in rows if r.episode.task}
        out, failures = [], 0
        for f in facts:
            if f.status == STATUS_CURRENT and f.summary != SUMMARY_LLM:
                text = await self.summarizer.summarize(f.base_text, [tasks[e] for e in f.central if e in tasks])
                unchanged = before.get(f.fact_id) == f
                if text:
                    f = replace(f, text=text, summary=SUMMARY_LLM)
                    if unchanged:
                        f = replace(f, version=f.version + 1, updated_at=now)
                else:
                    failures += 1
                    if f.summary != SUMMARY_FALLBACK:
                        f = replace(f, text=f.base_text, summary=SUMMARY_FALLBACK)
                        if unchanged:
                            f = replace(f, version=f.version + 1, updated_at=now)
            out.append(f)
        if failures:
            self.summarizer_failures += failures
            log.warning("facts ◆ summariser failed for %d fact(s); they keep the deterministic text "
                        "(summary=fallback) and are retried on the next run", failures)
        return out, failures

    # --- forgetting ----------------------------------------------------------------------------
    async def forget_evidence(self, gen: int, namespace: str, episode_ids: Sequence[str]) -> int:
        """Rebuild or remove every fact whose evidence named a forgotten episode; returns facts touched."""
        affected = await facts_with_evidence(self.redis, self.keys.facts_index(gen), namespace, list(episode_ids),
                                             await self.tags(gen))
        by_scope: dict[str, list[Fact]] = {}
        for f in affected:
            by_scope.setdefault(f.scope_id, []).append(f)
        forgotten = set(episode_ids)
        for scope_id in sorted(by_scope):
            token = await self._acquire(scope_id, wait=self.settings.lease_ms / 1000)
            if token is None:
                raise RuntimeError(f"facts scope {scope_id[:12]} stayed locked; the forget will be retried")
            try:
                await self._forget_in_scope(gen, scope_id, forgotten)
            finally:
                await self._release_lock(scope_id, token)
        return len(affected)

    async def _forget_in_scope(self, gen: int, scope_id: str, forgotten: set[str]) -> None:
        state = await load_state(self.redis, self.keys, gen, scope_id)
        if not state.facts:
            return
        first = state.facts[0]
        scope = FactScope(first.namespace, first.agent_id, first.category)
        min_cluster = state.min_cluster or self.settings.facts_min_cluster
        now = time.time()
        facts: list[Fact] = []
        removed: list[str] = []
        for f in state.facts:
            if not forgotten & set(f.evidence):
                facts.append(f)
                continue
            keep = [e for e in f.evidence if e not in forgotten]
            rows = await load_rows_by_id(self.redis, self.keys, gen, f.namespace, keep)
            rows = [r for r in rows if r.episode_id not in forgotten]
            if len(rows) < min_cluster:
                removed.append(f.fact_id)
                continue
            rebuilt = build_fact(scope, rows, fact_id=f.fact_id, now=now, created_at=f.created_at,
                                 version=f.version + 1, evidence_since=f.evidence_since, supersedes=f.supersedes)
            if f.status == STATUS_SUPERSEDED:
                rebuilt = replace(rebuilt, status=STATUS_SUPERSEDED, superseded_by=f.superseded_by,
                                  superseded_at=f.superseded_at)
            facts.append(rebuilt)
        event = self._event(scope, state.seq + 1, facts, removed, now)
        sid = await self.publish(event)
        await apply_snapshot(self.redis, self.keys, gen, event, sid, self.dim, await self.tags(gen))
        # the older snapshots of this scope still hold the forgotten ids and text: drop them
        await streams.delete(self.redis, self.keys.stream, [s for s in state.sids if s != sid])
        await self.redis.hset(self.keys.fact_scope(gen, scope_id), "sids", json.dumps([sid]))
        log.info("facts ◆ forgot evidence in scope %s ◆ %d facts kept ◆ %d removed", scope_id[:12], len(facts),
                 len(removed))


async def forget_evidence(redis: aioredis.Redis, keys: Keys, gen: int, namespace: str, episode_ids: Sequence[str],
                          dim: int, tags: TagCodec) -> int:
    """The projector's forgetting hook: see `Consolidator.forget_evidence`; `tags` are generation
    `gen`'s TAG digests."""
    if not episode_ids:
        return 0
    consolidator = Consolidator(Settings(prefix=keys.prefix), redis, dim)
    consolidator._tags[gen] = tags
    return await consolidator.forget_evidence(gen, namespace, episode_ids)


async def import_snapshots(redis: aioredis.Redis, keys: Keys, old: int, new: int, dim: int, tags: TagCodec) -> int:
    """Replay hook: project every scope's last applied snapshot of generation `old` into `new`.

    The stream may have been trimmed (services.consolidator.retention), so the snapshot event a scope
    was built from is kept with its projection state; replaying the stream afterwards applies only newer
    snapshots (sequence numbers). Returns the number of scopes imported.
    """
    from shared.codec import decode

    imported = 0
    async for key in redis.scan_iter(match=keys.fact_scope(old, "*"), count=500):
        payload, sids = await redis.hmget(key, ["event", "sids"])
        if payload is None:
            continue
        try:
            event = decode(payload)
        except EngramError:
            log.warning("facts ◆ skipped an unreadable stored snapshot of generation %d", old)
            continue
        if isinstance(event, FactsConsolidated) and await apply_snapshot(redis, keys, new, event, None, dim, tags):
            await redis.hset(keys.fact_scope(new, event.scope.get("scope_id", "")), "sids", sids or b"[]")
            imported += 1
    return imported
