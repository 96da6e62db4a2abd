"""Prioritized recall: score candidate episodes, summarise what worked. Pure numpy, no I/O.

The priority of a candidate episode is a weighted sum of five signals, each in [0, 1]:

    priority = w_sim * max(0, cos)                      similarity to the query
             + w_rec * exp(-ln 2 * age / half_life)     recency (halves every `half_life` seconds)
             + w_rew * clip(reward, 0, 1)               reward (missing -> 0)
             + w_out * outcome_score                    success 1, partial 0.5, otherwise 0
             + w_imp * importance / 10                  importance 1..10 (missing -> 0)
             + regime                                   0 unless an approach was superseded (below)

The regime term (roles from `shared.regimes.superseded`) lets the answer say what works now: among
the candidates, an approach whose successes were followed by its failures and by successes of the same
task without it (CURRENT) was superseded. CURRENT candidates rise together until the best reaches the
best old success's priority; the old successes (STALE) count as failures SUPERSEDED_GAP less relevant,
`-(w_out * outcome + w_rew * reward + w_sim * min(similarity, SUPERSEDED_GAP))`; the most relevant recent
failure (EVIDENCE) rises to the best CURRENT priority, by at most w_sim * SUPERSEDED_GAP more than they
did, and ranks right after it. Otherwise the term is 0.

Sources:
- Recency decay, importance and relevance as a weighted sum, and the optional per-signal min-max
  scaling: Park et al. 2023, "Generative Agents: Interactive Simulacra of Human Behavior", section 4.1
  (retrieval); their decay is per game hour, here a half-life in seconds.
- Replaying past experience by priority rather than uniformly or by recency alone: Schaul et al. 2016,
  "Prioritized Experience Replay"; reward and outcome stand in for their TD-error priority.

Conventions: every array is 1-D with one entry per candidate (`float64[n]`). Instants are UTC epoch seconds (float64: float32 is two minutes coarse); ages and
half-lives are seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from shared.regimes import CURRENT, EVIDENCE, STALE, newest_regimes

Normalize = Literal["none", "minmax"]
RecencyFrom = Literal["completed", "last_access"]


OUTCOME_SCORES: dict[str, float] = {"success": 1.0, "partial": 0.5, "failure": 0.0, "abandoned": 0.0}
"""Outcome -> score; any other value (None, an unknown string) scores 0."""

MINMAX_CONSTANT = 0.5
"""What `normalize="minmax"` gives a signal that is the same for every candidate (or when n = 1), as
Generative Agents' `normalize_dict_floats` does: rank-neutral, and never a division by zero."""

AUTO_EARLY_BELOW = 50
"""`auto` picks `early` while the scope holds fewer episodes than this."""
AUTO_NORMAL_BELOW = 500
"""`auto` picks `normal` below this many episodes and `late` from here on (our choice: with few
episodes ages say little; with hundreds, the recent ones reflect the agent's current habits)."""

SUPERSEDED_GAP = 0.25
"""The relevance a superseded success loses: more than separates episodes of one task worded a little
apart (0.18 in vector mode for 7 words added to a 9-word task), less than separates unrelated tasks."""


_LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class Weights:
    """Non-negative weights of the five signals, not all zero (`services.query.models.WeightsIn`
    checks a request's); the priority lies in [0, total] (normalize "none")."""

    similarity: float
    recency: float
    reward: float
    outcome: float
    importance: float = 0.0

    @property
    def total(self) -> float:
        """Sum of the weights, added in the order `score` adds the terms: the largest possible priority."""
        return self.similarity + self.recency + self.reward + self.outcome + self.importance

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


PRESETS: dict[str, Weights] = {
    "early": Weights(similarity=0.95, recency=0.01, reward=0.03, outcome=0.01),
    "normal": Weights(similarity=0.90, recency=0.05, reward=0.03, outcome=0.02),
    "late": Weights(similarity=0.85, recency=0.09, reward=0.04, outcome=0.02),
}
"""The presets' non-similarity terms hold 5%, 10% and 15% of the weight, so they can lift an episode
over one at most (total - w_sim) / w_sim = 0.05, 0.11 and 0.18 more relevant: they reorder episodes
about the same thing, never a weakly similar one over a clearly more relevant one."""


def resolve_weights(preset: str | None, weights: Weights | None, scope_size: int) -> tuple[str, Weights]:
    """The weights to score with and the name to report.

    Explicit `weights` win over any preset: ("custom", weights divided by their total, so that every
    priority lies in [0, 1] whatever scale the caller used). Otherwise `preset` names one of PRESETS;
    "auto" (or None) picks by `scope_size` (the AUTO_* thresholds) and reports e.g. "auto:normal".
    The request model checks the preset's name.
    """
    if weights is not None:
        total = weights.total
        return "custom", Weights(**{name: value / total for name, value in weights.as_dict().items()})
    if preset is not None and preset != "auto":
        return preset, PRESETS[preset]
    chosen = (
        "early" if scope_size < AUTO_EARLY_BELOW else "normal" if scope_size < AUTO_NORMAL_BELOW else "late"
    )
    return f"auto:{chosen}", PRESETS[chosen]


def outcome_scores(outcomes: Sequence[str | None]) -> np.ndarray:
    """float64[n]: 1 for "success", 0.5 for "partial", 0 for anything else (failure, abandoned, None)."""
    return np.fromiter(
        (OUTCOME_SCORES.get(o, 0.0) if isinstance(o, str) else 0.0 for o in outcomes),
        dtype=np.float64,
        count=len(outcomes),
    )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Candidates:
    """The candidates of one recall, as parallel float64[n] arrays (`score` reads them, never writes).

    - completed_at: UTC epoch seconds.
    - cos: similarity to the query, in [-1, 1] (the pool's relevance, in [0, 1]); NaN -> 0.
    - last_accessed: UTC epoch seconds of the last recall that returned the episode; NaN = never.
    - reward: any finite number, clipped to [0, 1] when scored; NaN = missing -> 0.
    - outcome_score: in [0, 1], from `outcome_scores`.
    - importance: 1..10 (Generative Agents' poignancy scale); NaN = missing -> 0.
    - regime: roles of `shared.regimes.superseded` (STALE, CURRENT, EVIDENCE; 0: none).
    - tie: the episode's tie-break (`shared.ties.tie_break`, the order of equal values in the recency /
      reward / importance lists), higher first among candidates of equal priority and age; NaN = none
      (after every one that has one).
    All of one length, finite (NaN where said): the pool's columns (`services.query.recall`).
    """

    completed_at: np.ndarray
    cos: np.ndarray
    last_accessed: np.ndarray
    reward: np.ndarray
    outcome_score: np.ndarray
    importance: np.ndarray
    regime: np.ndarray
    tie: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class Scored:
    """Per-candidate signals, weighted terms and priority, each float64[n], plus the ranking.

    `similarity` (clip(cos, 0, 1)) and `recency` are the raw signals, before any min-max scaling. The
    `*_term` arrays are weight * signal (reward clipped, importance / 10, missing 0; after scaling when
    normalize="minmax"); with `regime_term` (the regime term, 0 for most) they add up to `priority`.
    `age` is in seconds, clamped at 0. `order` (int64[n]) lists candidate indices best first.
    """

    age: np.ndarray
    similarity: np.ndarray
    recency: np.ndarray
    similarity_term: np.ndarray
    recency_term: np.ndarray
    reward_term: np.ndarray
    outcome_term: np.ndarray
    importance_term: np.ndarray
    regime_term: np.ndarray
    priority: np.ndarray
    order: np.ndarray

    def breakdown(self, i: int) -> dict[str, float]:
        """Candidate i's priority and the term each signal added (for an API's `score_breakdown`); the
        regime term only where it is not 0."""
        out = {
            "priority": float(self.priority[i]),
            "similarity": float(self.similarity_term[i]),
            "recency": float(self.recency_term[i]),
            "reward": float(self.reward_term[i]),
            "outcome": float(self.outcome_term[i]),
            "importance": float(self.importance_term[i]),
        }
        if self.regime_term[i]:
            out["regime"] = float(self.regime_term[i])
        return out


def minmax(x: np.ndarray) -> np.ndarray:
    """float64[n] scaled to [0, 1] over the candidate set: (x - min) / (max - min).

    A constant signal (max == min, including n = 1) becomes MINMAX_CONSTANT everywhere, as in
    Generative Agents' `normalize_dict_floats`. Expects finite input; never returns NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x.copy()
    lo, hi = x.min(), x.max()
    span = hi - lo
    if not span > 0.0:
        return np.full_like(x, MINMAX_CONSTANT)
    return np.clip((x - lo) / span, 0.0, 1.0)


def score(
    c: Candidates,
    weights: Weights,
    *,
    half_life: float,
    as_of: float,
    normalize: Normalize = "none",
    recency_from: RecencyFrom = "completed",
) -> Scored:
    """Score and rank candidates by the priority in the module docstring (vectorised, O(n log n)).

    - half_life: seconds, finite and > 0 (as the request model and settings check). as_of: UTC epoch seconds the ages are measured from (a recall's `as_of`).
    - recency_from "completed": age = as_of - completed_at; "last_access": as_of - last_accessed, falling
      back to completed_at for candidates never accessed (last_accessed NaN).
    - Ages are clamped at 0: an instant after `as_of` (clock skew, or recall "as of" a past date) counts
      as brand new, recency 1, never above 1.
    - normalize "none": signals are used as they are, priority in [0, weights.total]. "minmax": each signal
      is min-max scaled over this candidate set first (Park et al. 2023, section 4.1); see `minmax`.
    - order: priority descending; ties by age ascending (= recency descending, and still exact where the
      decay underflows to 0), then by `c.tie` descending (the lists' own order of equal values, so the
      order of exact ties does not depend on which other candidates a query brought), then by index
      ascending. Deterministic for equal inputs.

    With normalize "none", a candidate's priority never increases as it gets older.
    """
    if recency_from == "last_access":
        t = np.where(np.isnan(c.last_accessed), c.completed_at, c.last_accessed)
    else:
        t = c.completed_at
    age = np.maximum(float(as_of) - t, 0.0)

    similarity = np.clip(np.nan_to_num(c.cos, nan=0.0), 0.0, 1.0)
    recency = np.exp(-_LN2 * age / float(half_life))
    reward = np.clip(np.nan_to_num(c.reward, nan=0.0), 0.0, 1.0)
    importance = np.clip(np.nan_to_num(c.importance, nan=0.0) / 10.0, 0.0, 1.0)

    signals: tuple[np.ndarray, ...] = (similarity, recency, reward, c.outcome_score, importance)
    if normalize == "minmax":
        signals = tuple(minmax(s) for s in signals)
    w = weights
    terms = tuple(
        wi * s
        for wi, s in zip((w.similarity, w.recency, w.reward, w.outcome, w.importance), signals, strict=True)
    )
    priority = terms[0] + terms[1] + terms[2] + terms[3] + terms[4]
    role = c.regime
    regime, lifted = _regime(role, terms, signals[0], priority, w.similarity)
    priority = priority + regime
    index = np.arange(priority.shape[0])
    tie = np.nan_to_num(c.tie, nan=-1.0)  # none: after every tie-break (all are >= 0)
    order = np.lexsort((index, -tie, age, -priority))
    if lifted.any():  # right after the best CURRENT candidate, at its very priority (not one rounded off)
        best = order[role[order] == CURRENT][0]
        priority[lifted] = priority[best]
        lead = np.where(lifted, 1, 2)
        lead[best] = 0
        order = np.lexsort((index, -tie, age, lead, -priority))

    out = Scored(
        age=age,
        similarity=similarity,
        recency=recency,
        similarity_term=terms[0],
        recency_term=terms[1],
        reward_term=terms[2],
        outcome_term=terms[3],
        importance_term=terms[4],
        regime_term=regime,
        priority=priority,
        order=order,
    )
    for f in fields(out):  # every field is an array
        getattr(out, f.name).setflags(write=False)
    return out


def _regime(
    role: np.ndarray,
    terms: tuple[np.ndarray, ...],
    similarity: np.ndarray,
    priority: np.ndarray,
    w_sim: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The module's regime term (float64[n]) and which EVIDENCE candidates it lifts to the best CURRENT
    priority (bool[n])."""
    term = np.zeros_like(priority)
    stale, current, evidence = (role == STALE), (role == CURRENT), (role == EVIDENCE)
    term[current] = up = max(0.0, priority[stale].max(initial=0.0) - priority[current].max(initial=0.0))
    term[stale] = -(terms[2][stale] + terms[3][stale] + w_sim * np.minimum(similarity[stale], SUPERSEDED_GAP))
    lift, most = (priority + term)[current].max(initial=-1.0) - priority, up + w_sim * SUPERSEDED_GAP
    lifted = evidence & (lift >= 0) & (lift <= most)
    term[evidence] = np.clip(lift[evidence], 0.0, most) if current.any() else 0.0
    return np.maximum(term, -priority), lifted  # a stale priority is 0 at least, not -1e-17 by rounding


def _rewards_array(rewards: Sequence[float | None]) -> np.ndarray:
    """float64[n] with NaN for missing (None or NaN)."""
    return np.fromiter(
        (np.nan if r is None else float(r) for r in rewards), dtype=np.float64, count=len(rewards)
    )


def _mean_or_none(values: np.ndarray) -> float | None:
    present = values[~np.isnan(values)]
    return float(present.mean()) if present.size else None


def replay_context(
    strategies: Sequence[str | None],
    rewards: Sequence[float | None],
    outcomes: Sequence[str | None],
    priorities: Sequence[float],
    times: Sequence[float | None] | None = None,
    *,
    min_size: int = 3,
    stale: Sequence[bool] | None = None,
    since: float | None = None,
) -> dict[str, Any]:
    """What the recalled episodes say worked: the strategies to replay, best first.

    Inputs are parallel, one entry per recalled episode (`times`: completion times, UTC epoch seconds).
    Returns `{"episodes": n, "avg_reward": float | None, "success_rate": float | None, "strategies": [...]}`
    where each strategy entry is `{"strategy", "priority" (the max over its episodes), "episodes",
    "avg_reward" (missing rewards ignored; None if none), "success_rate" (share with outcome
    "success"), "changed_at", "earlier_episodes", "earlier_success_rate"}`, by priority descending,
    ties by first appearance; episodes without a strategy count in the totals only.

    With `times`, a strategy counts its newest regime only, as facts and `/v1/strategy` do
    (`shared.regimes.newest_regimes`, at least `min_size` each side of a flip): `changed_at` is when it
    began and `earlier_*` describe what was dropped (None / 0 when nothing changed). `stale[i]`: episode i
    is a success of an approach the whole pool shows superseded since `since` (the regime term's STALE
    role): it counts as earlier too, so a strategy of such successes alone has 0 `episodes` and a None
    `success_rate`, whatever `top_k` cut.
    """
    n = len(strategies)
    reward = _rewards_array(rewards)
    success = np.array([o == "success" for o in outcomes], dtype=bool)
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(strategies):
        if s is not None:
            groups.setdefault(s, []).append(i)
    order = [(t if t is not None else -math.inf, i) for i, t in enumerate(times or ())]
    decided = [None if times is None or o is None else o == "success" for o in outcomes]
    regimes = newest_regimes(strategies, order, decided, min_size)
    entries: list[dict[str, Any]] = []
    for s, idx in groups.items():
        rows, start = regimes.get(s, ([], 0))
        earlier, changed_at = rows[:start], times[rows[start]] if start and times else None
        old = [i for i in idx if stale and stale[i] and i not in set(earlier)]
        if old and changed_at is None:
            changed_at = since
        earlier = sorted([*earlier, *old])
        kept = [i for i in idx if i not in set(earlier)]
        entries.append(
            {
                "strategy": s,
                "priority": max(float(priorities[i]) for i in idx),
                "episodes": len(kept),
                "avg_reward": _mean_or_none(reward[kept]),
                "success_rate": float(success[kept].mean()) if kept else None,
                "changed_at": changed_at,
                "earlier_episodes": len(earlier),
                "earlier_success_rate": float(success[earlier].mean()) if earlier else None,
            }
        )
    entries.sort(key=lambda e: -e["priority"])  # stable: ties keep first appearance
    return {
        "episodes": n,
        "avg_reward": _mean_or_none(reward),
        "success_rate": float(success.mean()) if n else None,
        "strategies": entries,
    }


def learning_curve(
    rewards: Sequence[float | None], outcomes: Sequence[str | None], window: int = 5
) -> list[dict[str, Any]]:
    """Per episode, in the order given (time order, oldest first), how the agent is doing.

    Each point: `{"episode": 1-based position, "reward", "outcome", "cumulative_reward" (sum of the
    rewards so far, missing ones adding 0), "success_rate" (share of "success" among the last `window`
    episodes, or all so far while fewer), "avg_reward" (mean of the present rewards among those, None
    if none)}`; `window` >= 1 (the request model's bound).
    """
    n = len(rewards)
    if n == 0:
        return []
    reward = _rewards_array(rewards)
    present = ~np.isnan(reward)
    value = np.where(present, reward, 0.0)
    success = np.array([o == "success" for o in outcomes], dtype=np.float64)
    cumulative = np.cumsum(value)

    def rolling_sum(x: np.ndarray) -> np.ndarray:  # sum over the last `window` entries, exact per window
        padded = np.concatenate([np.zeros(window - 1), x])
        return np.lib.stride_tricks.sliding_window_view(padded, window).sum(axis=1)

    seen = np.minimum(np.arange(1, n + 1), window)
    success_rate = rolling_sum(success) / seen
    reward_sum = rolling_sum(value)
    reward_count = rolling_sum(present.astype(np.float64))
    return [
        {
            "episode": i + 1,
            "reward": float(reward[i]) if present[i] else None,
            "outcome": outcomes[i],
            "cumulative_reward": float(cumulative[i]),
            "success_rate": float(success_rate[i]),
            "avg_reward": float(reward_sum[i] / reward_count[i]) if reward_count[i] else None,
        }
        for i in range(n)
    ]
