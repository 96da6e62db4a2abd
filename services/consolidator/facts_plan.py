"""Semantic memory, the pure part: cluster a scope's episodes and plan its facts (no Redis, no event
loop; docs/architecture.md "Facts" says why each choice).

Clustering: `AgglomerativeClustering(metric="cosine", linkage="average", distance_threshold=d)` over
the unit vectors (or `Row.cluster_vector`: the embedding without the text the scope's episodes share,
`shared_sentences`); `d` is `ENGRAM_FACTS_DISTANCE`, else `DEFAULT_DISTANCE` of the live index's
embedder. A pair where either episode is written in a language the embedder does not model (`unmodelled`)
is compared on its words as well (`cluster`). Clusters smaller than `ENGRAM_FACTS_MIN_CLUSTER` yield no
fact; centroids are those of the stored vectors.

Facts are a function of the episodes (`derive`): each cluster's time-ordered evidence is cut into
regimes (`shared.regimes`), the newest one the current fact, each older one a fact it superseded.
Any interleaving of publishes and runs ends in the facts one run over the same episodes gives.

Stable ids (`plan`): each derived fact takes the id, `created_at` and `version` of the previous fact
holding the largest share (>= half) of its evidence, greedily one to one. An unchanged fact is kept
byte for byte, a changed one is `version` + 1; superseded facts whose evidence left the window stay as
history (at most HISTORY_LIMIT); other previous facts no derived fact took are removed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from engram_episodic.events import Episode
from engram_episodic.timeutil import format_instant
from shared.facts import (
    MAX_TEXT_CHARS,
    STATUS_CURRENT,
    STATUS_SUPERSEDED,
    Fact,
    FactScope,
    Row,
    by_completion,
    centroid_of,
    superseded,
)
from shared.keys import digest
from shared.regimes import approach, segments

HISTORY_LIMIT = 50  # superseded facts kept per scope (newest first)
DEFAULT_DISTANCE = {"mpnet-base-v2": 0.70, "minilm-l6-v2": 0.69, "hashing-v1": 0.59}
"""The clustering threshold per embedder when ENGRAM_FACTS_DISTANCE is unset, calibrated on labelled task
families (`bench.facts_calibration`; figures in docs/architecture.md "Facts"): the largest
threshold at which at most 1% of random scopes of 5 unrelated families hold a fact mixing two of them."""
FALLBACK_DISTANCE = 0.5
"""Embedders not calibrated (`openai/...`): measure with `python -m bench.facts_calibration
--embedder openai` and set ENGRAM_FACTS_DISTANCE."""


def default_distance(embedder: str | None) -> float:
    """The calibrated threshold of the embedder the index was built with (FALLBACK_DISTANCE if unknown)."""
    return DEFAULT_DISTANCE.get(embedder or "", FALLBACK_DISTANCE)


# --- text every episode of a scope shares ---------------------------------------------------------
SHARED_SHARE = 0.8
"""A sentence of the notes found in at least this share of a scope's episodes is shared text."""
_SENTENCE_END = re.compile(r"(?<=[.!?;:。！？])\s+|\n+")


def _notes(episode: Episode) -> list[str]:
    """The fields of `shared.index.embedding_text` after the task, in its order."""
    return [
        episode.observation or "",
        episode.solution or "",
        episode.result or "",
        episode.outcome_details or "",
    ]


def _sentences(text: str) -> list[str]:
    return [s for s in (" ".join(p.split()) for p in _SENTENCE_END.split(text)) if s]


def shared_sentences(episodes: Sequence[Episode]) -> frozenset[str]:
    """The sentences of the notes (`_notes`; whitespace folded) found in at least SHARED_SHARE of
    `episodes` (an agent's closing boilerplate); empty for fewer than two. Never the task description."""
    if len(episodes) < 2:
        return frozenset()
    seen: Counter[str] = Counter()
    for e in episodes:
        seen.update({s for note in _notes(e) for s in _sentences(note)})
    return frozenset(s for s, n in seen.items() if n >= SHARED_SHARE * len(episodes))


def without_shared(episode: Episode, shared: frozenset[str]) -> str | None:
    """`shared.index.embedding_text(episode)` with the `shared` sentences left out of its notes, or None
    when it holds none of them (its stored vector stands)."""
    if not shared:
        return None
    notes = [[s for s in _sentences(n) if s not in shared] for n in _notes(episode)]
    if sum(map(len, notes)) == sum(len(_sentences(n)) for n in _notes(episode)):
        return None
    task = episode.task.description if episode.task else ""
    return "\n".join(p for p in [task, *(" ".join(n) for n in notes)] if p).strip() or None


# --- text the embedder does not model (docs/architecture.md "Facts", "Languages") -----------------
_WORD = re.compile(r"[^\W\d_]+")
_ENGLISH = frozenset(  # function words no German, French, Spanish or Dutch word is spelt as
    "the to and or for with from by at into about after before under are were be been being has have do does "
    "did would should could can may might must it its this that these those there here their they them we us "
    "our you your my he she his him not yes if then than but only just very too all any each every some more "
    "most other such what when where which who why how up out off again".split()
)
# German, French, Spanish, Dutch (a few Italian, Portuguese) function words; terse English holds none,
# though "die", "de" or "la" can be an English word or name: `unmodelled` needs two
_OTHER = frozenset(
    "der die das und nicht ein eine einen einem einer dem des auf von zum zur bei nach wie oder ich sie wir sind "
    "wurde werden auch noch über dann wann warum zu für le la les du une dans avec pour sur qui que sont été être "
    "el los las del una por para cada cuando más está de het een voor niet naar bij zijn wordt ook wanneer "
    "waarom heeft hebben il della che gli sono nel alla não uma".split()
)
LEXICAL_WEIGHT = {"mpnet-base-v2": 0.75, "minilm-l6-v2": 0.6}
"""The lexical distance's share, per English embedder, when either text of a pair is `unmodelled`
(`cluster`); an embedder not listed (hashing, `openai/...`) compares vectors alone. Measured on the
scopes of `tests/unit/test_facts_families.py` (docs/architecture.md "Facts"), chosen for no fact
mixing two topics first, then fewest topics split below a fact. MiniLM: 0.55 left French, Spanish and Dutch
facts mixing topics, 0.65 split a German topic (5 of 8); on 48 other scopes per language, mixed / split:
0.5 25 / 12, 0.6 19 / 16, 0.7 4 / 23. mpnet: 0.6 and 0.65 left French and Dutch facts mixing topics
(2 and 2 of 12), 0.7 Dutch (2); on 48 other scopes per language, mixed of 192 / split of 96: 0.6 26 / 9,
0.7 21 / 13, 0.75 9 / 20, 0.8 3 / 29."""


def lexical_weight(embedder: str | None) -> float | None:
    """LEXICAL_WEIGHT of the embedder the index was built with; None (vectors alone) if not listed."""
    return LEXICAL_WEIGHT.get(embedder or "")


def unmodelled(text: str) -> bool:
    """Whether `text` is in a language the English embedders (MiniLM, mpnet) do not model, whose unrelated
    texts they place close together: 8 or more words (runs of letters), under 3% of them English function
    words (English task texts and notes measured 5% or more, German/French/Spanish/Dutch ones 0%) and 2 or
    more function words of another language (`_OTHER`: 2 to 11 in every German/French/Spanish/Dutch text
    measured, none in terse English task titles and notes, which hold no English function word either)."""
    words = [w.lower() for w in _WORD.findall(text)]
    return (
        len(words) >= 8
        and sum(w in _ENGLISH for w in words) < 0.03 * len(words)
        and sum(w in _OTHER for w in words) >= 2
    )


def lexical_distances(texts: Sequence[str]) -> np.ndarray:
    """1 − the cosine of the sets of character 4-grams of each text's words of 4 or more letters (padded
    with a space: compounds and inflections share them, most function words have none), float[n, n]."""
    from scipy.sparse import csr_matrix  # scikit-learn's dependency

    grams = [
        {f" {w} "[i : i + 4] for w in _WORD.findall(t.lower()) if len(w) >= 4 for i in range(len(w) - 1)}
        for t in texts
    ]
    vocab = {g: k for k, g in enumerate(sorted(set().union(*grams)))}
    rows = [i for i, gs in enumerate(grams) for _ in gs]
    m = csr_matrix(
        (np.ones(len(rows)), (rows, [vocab[g] for gs in grams for g in gs])), shape=(len(texts), len(vocab))
    )
    norms = np.sqrt(np.maximum([len(gs) for gs in grams], 1))
    return 1.0 - (m @ m.T).toarray() / np.outer(norms, norms)


def clustering_texts(episodes: Sequence[Episode]) -> list[str]:
    """Per episode, its task and notes without the sentences the scope shares (`shared_sentences`)."""
    shared = shared_sentences(episodes)
    notes = [[s for n in _notes(e) for s in _sentences(n) if s not in shared] for e in episodes]
    return [
        " ".join([e.task.description if e.task else "", *ns]) for e, ns in zip(episodes, notes, strict=True)
    ]


# --- clustering and statistics (pure) -------------------------------------------------------------
def cluster(
    vectors: np.ndarray, distance: float, texts: Sequence[str] | None = None, weight: float | None = None
) -> list[list[int]]:
    """Row indices grouped by average-linkage clustering on cosine distance, by smallest index. With
    `texts` (`clustering_texts`, one per row) and `weight` (LEXICAL_WEIGHT of the embedder), a pair where
    either text is `unmodelled` is at (1 − weight) x its cosine distance + weight x its
    `lexical_distances`; with neither, the vectors alone decide. Raises ValueError for one without the other."""
    if (texts is None) != (weight is None):
        raise ValueError("cluster: texts and weight go together")
    n = len(vectors)
    if n == 0:
        return []
    if n == 1:
        return [[0]]
    # imported here: scikit-learn was 2.7 s of every process's start, which may never cluster
    from sklearn.cluster import AgglomerativeClustering

    flagged = np.array([unmodelled(t) for t in texts or ()], dtype=bool)
    metric, data = "cosine", vectors
    if flagged.any():
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        d = 1.0 - unit @ unit.T
        w = weight or 0.0
        lexical = (1 - w) * d + w * lexical_distances(texts or ())
        d = np.where(flagged[:, None] | flagged, lexical, d)
        np.fill_diagonal(d, 0.0)
        metric, data = "precomputed", np.clip(d, 0.0, 2.0)
    labels = AgglomerativeClustering(
        n_clusters=None, metric=metric, linkage="average", distance_threshold=distance
    ).fit_predict(data)
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(int(label), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


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


def build_fact(
    scope: FactScope,
    rows: Sequence[Row],
    *,
    fact_id: str,
    now: float,
    created_at: float | None = None,
    version: int = 1,
    evidence_since: float | None = None,
    supersedes: str | None = None,
) -> Fact:
    """A fact from its evidence rows: statistics, centroid, confidence, kind and deterministic text."""
    rows = by_completion(rows)
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
    stats: list[dict[str, Any]] = [
        {
            "strategy": s,
            "episodes": len(v),
            "successes": sum(x.outcome == "success" for x in v),
            "success_rate": round(sum(x.outcome == "success" for x in v) / len(v), 4),
        }
        for s, v in by_strategy.items()
    ]
    strategies = sorted(stats, key=lambda d: (-d["episodes"], -d["successes"], d["strategy"]))[:5]
    failures = Counter(m for e in eps if e.outcome != "success" for m in _failure_messages(e))
    common_failures = [
        {"message": m, "count": c} for m, c in sorted(failures.items(), key=lambda x: (-x[1], x[0]))[:3]
    ]
    acts: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for e in eps:
        for a in e.actions:
            acts[a.action_type] += 1
            failed[a.action_type] += bool(a.error) or a.success is False
    action_types = [
        {"action_type": t, "count": c, "failed": failed[t]}
        for t, c in sorted(acts.items(), key=lambda x: (-x[1], x[0]))[:5]
    ]
    matrix = np.stack([r.vector for r in rows])
    centroid = centroid_of(matrix)
    cos = matrix @ centroid.astype(np.float64)
    order = sorted(range(n), key=lambda i: (-round(float(cos[i]), 9), rows[i].episode_id))
    central = tuple(rows[i].episode_id for i in order[:3])
    cohesion = float(np.clip(np.mean(cos), 0.0, 1.0))
    confidence = round(cohesion * n / (n + 2), 4)
    best = next(
        (
            s
            for s in sorted(strategies, key=lambda d: (-d["success_rate"], -d["episodes"], d["strategy"]))
            if s["episodes"] >= 2
        ),
        None,
    )
    if rate >= 0.7:
        kind = "strategy" if best is not None and best["success_rate"] >= 0.7 else "best_practice"
    elif rate <= 0.3:
        kind = "failure_pattern"
    else:
        kind = "best_practice"
    fact = Fact(
        fact_id=fact_id,
        namespace=scope.namespace,
        scope_id=scope.scope_id,
        level=scope.level,
        agent_id=scope.agent_id,
        category=scope.category,
        kind=kind,
        text="",
        base_text="",
        support=n,
        successes=successes,
        success_rate=rate,
        avg_reward=avg_reward,
        top_strategies=tuple(strategies),
        common_failures=tuple(common_failures),
        action_types=tuple(action_types),
        evidence=tuple(sorted(r.episode_id for r in rows)),
        central=central,
        agents=tuple(sorted({e.agent_id for e in eps if e.agent_id})),
        users=tuple(sorted({e.user_id for e in eps if e.user_id})),
        categories=tuple(sorted({e.task.category for e in eps if e.task and e.task.category})),
        first_at=rows[0].completed_at,
        last_at=rows[-1].completed_at,
        evidence_since=evidence_since,
        centroid=tuple(float(x) for x in centroid),
        confidence=confidence,
        version=version,
        created_at=now if created_at is None else created_at,
        updated_at=now,
        supersedes=supersedes,
    )
    text = _text(fact, [t.description for t in (rows[i].episode.task for i in order[:3]) if t])
    return replace(fact, text=text, base_text=text)


_HEAD = {"strategy": "What works", "failure_pattern": "What fails", "best_practice": "Mixed results"}


def _text(fact: Fact, tasks: list[str]) -> str:
    """The deterministic sentence(s) of `fact` (its statistics; `tasks`: the central episodes'), at most
    MAX_TEXT_CHARS."""
    n, successes, avg_reward, categories = fact.support, fact.successes, fact.avg_reward, fact.categories
    subject = f'tasks like "{_clip(tasks[0], 100)}"' if tasks else "these tasks"
    if categories:
        subject += f" ({', '.join(_clip(c, 40) for c in categories[:3])})"
    span = (format_instant(fact.first_at) or "")[:10], (format_instant(fact.last_at) or "")[:10]
    when = f"on {span[0]}" if span[0] == span[1] else f"between {span[0]} and {span[1]}"
    # a best practice with a high success rate but no repeated strategy is not "mixed"
    head = "What works" if fact.kind == "best_practice" and successes >= 0.7 * n else _HEAD[fact.kind]
    parts = [
        f"{head}: for {subject}, {successes} of {n} attempts succeeded ({round(100 * successes / n)}%) "
        f"{when}" + (f", average reward {avg_reward:.2f}." if avg_reward is not None else ".")
    ]
    if fact.top_strategies:  # the one that works best first: the text is what an agent follows
        ranked = sorted(
            fact.top_strategies, key=lambda d: (-d["success_rate"], -d["episodes"], d["strategy"])
        )
        parts.append(
            "Strategies: "
            + "; ".join(
                f"{_clip(s['strategy'], 40)} succeeded {s['successes']} of {s['episodes']}" for s in ranked
            )
            + "."
        )
    if fact.common_failures:
        parts.append(
            "Failures were: "
            + "; ".join(f'"{_clip(f["message"], 80)}" ({f["count"]}x)' for f in fact.common_failures)
            + "."
        )
    if fact.action_types:
        parts.append(
            "Common actions: "
            + ", ".join(f"{_clip(a['action_type'], 30)} ({a['count']})" for a in fact.action_types)
            + "."
        )
    return _clip(" ".join(parts), MAX_TEXT_CHARS)


def regimes(rows: Sequence[Row], min_size: int) -> list[list[Row]]:
    """A cluster's time-ordered evidence cut where outcomes or one approach's outcomes flip
    (`shared.regimes.segments`; an approach is the strategy, else the tools called:
    `shared.regimes.approach`), oldest first; every regime has at least `min_size` rows."""
    rows = by_completion(rows)
    success = [r.episode.outcome == "success" for r in rows]
    strategies = [approach(r.episode.strategy_used, (a.action_type for a in r.episode.actions)) for r in rows]
    return [rows[a:b] for a, b in segments(success, strategies, min_size)]


def derive(
    rows: Sequence[Row], *, min_cluster: int, distance: float, lexical: float | None = None
) -> list[list[list[Row]]]:
    """Per cluster of at least `min_cluster` episodes (by oldest episode), its regimes oldest first (the
    newest the current fact): a function of the episodes alone, no previous state, no clock. `lexical`:
    the share of the words' distance for `unmodelled` text (`lexical_weight` of the index's embedder;
    None: the vectors alone)."""
    rows = by_completion(rows)
    if not rows:
        return []
    vectors = np.stack([r.vector if r.cluster_vector is None else r.cluster_vector for r in rows])
    texts = clustering_texts([r.episode for r in rows]) if lexical is not None else None
    groups = [[rows[i] for i in g] for g in cluster(vectors, distance, texts, lexical)]
    return [regimes(g, min_cluster) for g in groups if len(g) >= min_cluster]


def plan(
    scope: FactScope,
    rows: Sequence[Row],
    previous: Sequence[Fact],
    *,
    min_cluster: int,
    distance: float,
    now: float,
    lexical: float | None = None,
) -> tuple[list[Fact], list[str]] | None:
    """The scope's next facts (current and history) and removed ids; None when nothing changes. What
    they say is `derive(rows)`; the previous facts only lend ids, versions, creation times and summarised
    texts (module docstring, "Stable ids")."""
    derived = derive(rows, min_cluster=min_cluster, distance=distance, lexical=lexical)
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
                pairs.append(
                    (-inter / len(ev), -inter, (prev[fid].status == STATUS_CURRENT) != is_current, n, fid)
                )
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
        fresh = build_fact(
            scope,
            part,
            fact_id=fid,
            now=old.updated_at,
            created_at=old.created_at,
            version=old.version,
            evidence_since=since,
            supersedes=supersedes,
        )
        if fresh.base_text == old.base_text:  # the summariser's rewrite of the same text stays
            fresh = replace(fresh, text=old.text, summary=old.summary)
        if not is_current:
            at = (
                old.superseded_at
                if old.status == STATUS_SUPERSEDED and old.superseded_at is not None
                else now
            )
            fresh = superseded(fresh, ids_of[gi, k + 1], at)
        out.append(old if fresh == old else replace(fresh, version=old.version + 1, updated_at=now))
    window = {r.episode_id for r in rows}
    aged = [
        f
        for f in previous
        if f.status == STATUS_SUPERSEDED and f.fact_id not in taken and not window & set(f.evidence)
    ]
    current = [f for f in out if f.status == STATUS_CURRENT]
    history = sorted(
        [f for f in out if f.status != STATUS_CURRENT] + aged,
        key=lambda f: (-(f.superseded_at or 0.0), f.fact_id),
    )[:HISTORY_LIMIT]
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
