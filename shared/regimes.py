"""Regimes: where time-ordered outcomes change, decided by the episodes alone (pure, no I/O).

Facts (`services.consolidator.facts_plan`) and the advice of `/v1/strategy` and `/v1/suggest` need to
know when what used to work stopped working. Two adjacent runs of time-ordered episodes, `older` then
`newer`, are a *flip* when their **outcomes**, or **one strategy's** outcomes, flip: each run holds at
least `min_size` episodes (of that strategy), their success rates lie on either side of 50% and differ
by at least 0.5, and a one-sided Fisher exact test of the two runs' success counts gives p <= ALPHA
(0.05: 3 of 3 then 0 of 3 is p = 0.05; 2 of 3 then 0 of 3, p = 0.2, is bad luck). One strategy's flip
counts while the overall rate hardly moves because another strategy took over.

`segments` cuts a sequence into regimes, every two adjacent ones a flip: binary segmentation proposes
cuts (lowest p, then largest difference, then earliest), then adjacent candidates that are no flip are
merged, weakest evidence first. The result depends only on the sequence. Prefix sums make it O(n) per
strategy per cut.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from shared.keywords import STOPWORDS, words

FLIP_GAP = 0.5
"""Two runs' success rates must differ by at least this much (and lie on either side of 50%)."""
ALPHA = 0.05
"""...and the difference must be unlikely by chance: one-sided Fisher exact test, p <= ALPHA."""
SCAN_ALPHA = 0.1
"""A candidate cut is the best of many splits tried, so it must stay significant once corrected for them
(Bonferroni): a cut in a selection (all rows, or one strategy's) of m rows needs
p x (m - 2 min_size + 1) x selections <= SCAN_ALPHA, each selection charged only its own positions."""
_EPS = 1e-12


def approach(strategy: str | None, action_types: Iterable[str | None]) -> str | None:
    """The "strategy" whose flips are regimes: `strategy_used`, else the distinct tools called (action
    types by first use, joined by " + "; an agent switching `pip` to `uv` changed strategy); or None."""
    if strategy:
        return strategy
    return " + ".join(dict.fromkeys(t for t in action_types if t)) or None


MARK_BYTES = 100
"""Of each text, the first bytes whose words mark an approach (the tool is named early; ~0.05 ms a row)."""


def marks(strategy: str | None, texts: Iterable[bytes | None]) -> list[str]:
    """What marks an episode's approach for `flips`, distinct, in order: its strategy, then the words
    (`shared.keywords.words`, stop words left out) of the first MARK_BYTES of each of its texts as
    indexed (`fold_for_search`, UTF-8; a failed `pip install` names `pip` there)."""
    found = [strategy] if strategy else []
    found += (
        w for v in texts if v for w in words(v[:MARK_BYTES].decode(errors="ignore")) if w not in STOPWORDS
    )
    return list(dict.fromkeys(found))


def _splits(
    success: np.ndarray, member: np.ndarray | None, min_size: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """For every split i = 0..n of the rows selected by `member` (all when None; split i puts rows [:i]
    in the older part): the one-sided Fisher p-value in the observed direction (2.0 where a part has
    fewer than `min_size` selected rows), the rates' difference, and how many distinct splits of the
    selected rows were tested (for the scan's correction)."""
    n = len(success)
    count, wins = np.arange(n + 1), np.zeros(n + 1, dtype=np.int64)
    if member is not None:
        np.cumsum(member, out=count[1:])
    np.cumsum(success if member is None else success & member, out=wins[1:])
    total, total_wins = int(count[-1]), int(wins[-1])
    before, after = count, total - count
    older = wins / np.maximum(before, 1)
    newer = (total_wins - wins) / np.maximum(after, 1)
    gap = np.abs(older - newer)
    sized = (before >= min_size) & (after >= min_size)
    p = np.full(n + 1, 2.0)
    i = np.flatnonzero(sized & (gap > _EPS))
    if len(i):
        p[i] = _fisher(wins[i], before[i], total, total_wins, older[i] > newer[i])
    return p, gap, max(0, total - 2 * min_size + 1)


def _fisher(k, m, total, total_wins, down) -> np.ndarray:
    """One-sided Fisher exact p (float64, broadcast shape of the int arguments): of `total` rows with
    `total_wins` successes, `m` fall in the older part, `k` of them successes; the chance of at least that
    many (`down`: the rate fell) or at most. The hypergeometric tail summed exactly over its support from
    a log-factorial table (scipy.stats' per-call checks cost ~1 ms, about all of a recall's regime test)."""
    k, m, total, wins = (np.asarray(v, dtype=np.int64) for v in (k, m, total, total_wins))
    fails = total - wins
    lo, hi = np.maximum(m - fails, 0), np.minimum(wins, m)  # the support of k
    first, last = np.where(down, np.maximum(k, lo), lo), np.where(down, hi, np.minimum(k, hi))
    lf = _log_factorials(int(total.max(initial=0)))[0]
    j = first[..., None] + np.arange(int((last - first).max(initial=-1)) + 1)  # the tail's k, padded
    inside, j = j <= last[..., None], np.minimum(j, hi[..., None])  # (first >= lo)
    log_pmf = (lf[wins] + lf[fails] + lf[m] + lf[total - m] - lf[total])[..., None] - (
        lf[j] + lf[wins[..., None] - j] + lf[m[..., None] - j] + lf[(fails - m)[..., None] + j]
    )
    return np.minimum(np.exp(log_pmf, where=inside, out=np.zeros(j.shape)).sum(axis=-1), 1.0)


def _fisher_one(k: int, m: int, total: int, total_wins: int, down: bool) -> float:
    """`_fisher` of one split in plain Python (numpy's per-call cost would be most of it)."""
    lf, fails = _log_factorials(total)[1], total - total_wins
    lo, hi = max(m - fails, 0), min(total_wins, m)
    c = lf[total_wins] + lf[fails] + lf[m] + lf[total - m] - lf[total]
    tail = range(max(k, lo), hi + 1) if down else range(lo, min(k, hi) + 1)
    pmf = (math.exp(c - (lf[j] + lf[total_wins - j] + lf[m - j] + lf[fails - m + j])) for j in tail)
    return min(1.0, sum(pmf))


_LOG_FACTORIALS: list[tuple[np.ndarray, list[float]]] = [(np.zeros(1), [0.0])]


def _log_factorials(n: int) -> tuple[np.ndarray, list[float]]:
    """log(i!) for i = 0..n at least, as float64[] and as a list (each within an ulp or so; grown on
    demand, then kept)."""
    if len(_LOG_FACTORIALS[0][1]) <= n:
        table = [math.lgamma(i + 1.0) for i in range(max(n + 1, 256))]
        _LOG_FACTORIALS[0] = (np.array(table), table)
    return _LOG_FACTORIALS[0]


def _members(strategies: Sequence[Hashable | None] | None, n: int, min_size: int) -> list[np.ndarray | None]:
    """Row selections to test: all rows, then each strategy with at least 2 * min_size rows (except one
    that covers every row: that is the first selection again)."""
    out: list[np.ndarray | None] = [None]
    if strategies is None:
        return out
    labels: dict[Hashable, list[int]] = {}
    for i, s in enumerate(strategies):
        if s is not None:
            labels.setdefault(s, []).append(i)
    for s in sorted(labels, key=str):
        if 2 * min_size <= len(labels[s]) < n:
            member = np.zeros(n, dtype=bool)
            member[labels[s]] = True
            out.append(member)
    return out


def best_split(
    success: Sequence[bool], strategies: Sequence[Hashable | None] | None, min_size: int
) -> int | None:
    """The candidate cut (older = [:i]): the most significant difference of the outcomes or of one
    strategy's (corrected, SCAN_ALPHA), then the largest, then the earliest; None if none is."""
    n = len(success)
    if min_size < 1 or n < 2 * min_size:
        return None
    ok = np.asarray(success, dtype=bool)
    members, lowest = _members(strategies, n, min_size), np.inf
    for j, member in enumerate(members):
        p, gap, t = _splits(ok, member, min_size)
        p = np.where(p <= 1.0, p * max(1, t) * len(members), np.inf)  # 2.0: no split there
        lowest, p = min(lowest, p.min()), _tied(p)
        if j == 0:  # what the merge below would make of it against no split at all
            best_p, best_gap = p, gap
            continue
        better = (p < best_p) | ((p == best_p) & (gap > best_gap))
        best_p, best_gap = np.where(better, p, best_p), np.where(better, gap, best_gap)
    if lowest > SCAN_ALPHA + _EPS:
        return None
    return int(np.lexsort((np.arange(n + 1), -best_gap, best_p))[0])


def _tied(p: np.ndarray) -> np.ndarray:
    """`p` (float64[]) to 9 decimals of its binary mantissa (~1e-9 relative): p-values equal but for
    rounding rank as ties, so the rules' next criterion decides, not the last bits of a sum."""
    mantissa, exponent = np.frexp(p)
    return np.ldexp(np.round(mantissa, 9), exponent)


def _tied_one(p: float) -> float:
    """`_tied` of one p-value."""
    mantissa, exponent = math.frexp(p)
    return math.ldexp(round(mantissa, 9), exponent)


def flip(
    older: Sequence[bool],
    newer: Sequence[bool],
    older_strategies: Sequence[Hashable | None] | None,
    newer_strategies: Sequence[Hashable | None] | None,
    min_size: int,
) -> tuple[bool, float, float]:
    """Whether `older` then `newer` is a flip (see the module), with the lowest p and its difference."""
    groups: list[tuple[list[bool], list[bool]]] = [(list(older), list(newer))]
    if older_strategies is not None and newer_strategies is not None:
        by: dict[Hashable, tuple[list[bool], list[bool]]] = {}
        for side, (oks, names) in enumerate(((older, older_strategies), (newer, newer_strategies))):
            for ok, s in zip(oks, names, strict=True):
                if s is not None:
                    by.setdefault(s, ([], []))[side].append(ok)
        groups += [by[s] for s in sorted(by, key=str)]
    found, best_p, best_gap, best_tied = False, 2.0, 0.0, 2.0
    for a, b in groups:
        if len(a) < min_size or len(b) < min_size:
            continue
        ra, rb = sum(a) / len(a), sum(b) / len(b)
        gap = abs(ra - rb)
        p = _fisher_one(sum(a), len(a), len(a) + len(b), sum(a) + sum(b), ra > rb) if gap > _EPS else 1.0
        found |= (ra >= 0.5) != (rb >= 0.5) and gap >= FLIP_GAP - _EPS and p <= ALPHA + _EPS
        tied = _tied_one(p)
        if tied < best_tied or (tied == best_tied and gap > best_gap):
            best_p, best_gap, best_tied = p, gap, tied
    return found, best_p, best_gap


def segments(
    success: Sequence[bool], strategies: Sequence[Hashable | None] | None, min_size: int
) -> list[tuple[int, int]]:
    """The regimes of a time-ordered sequence as `[start, end)` ranges, oldest first, covering it.
    `strategies[i]` is row i's strategy (None: none); `strategies=None` considers outcomes only."""
    n = len(success)
    if n == 0:
        return []
    ok = list(map(bool, success))
    strat = None if strategies is None else list(strategies)

    def part(a: int, b: int) -> tuple[list[bool], list[Hashable | None] | None]:
        return ok[a:b], None if strat is None else strat[a:b]

    cuts: list[int] = []
    stack = [(0, n)]
    while stack:
        a, b = stack.pop()
        cut = best_split(*part(a, b), min_size)
        if cut is not None:
            cuts.append(a + cut)
            stack += [(a, a + cut), (a + cut, b)]
    bounds = [0, *sorted(cuts), n]
    while len(bounds) > 2:
        weakest = None
        for j in range(1, len(bounds) - 1):
            a, c, b = bounds[j - 1], bounds[j], bounds[j + 1]
            (oa, sa), (ob, sb) = part(a, c), part(c, b)
            is_flip, p, gap = flip(oa, ob, sa, sb, min_size)
            if not is_flip and (weakest is None or (-_tied_one(p), gap, j) < weakest[0]):
                weakest = ((-_tied_one(p), gap, j), j)
        if weakest is None:
            break
        del bounds[weakest[1]]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def last_regime(success: Sequence[bool], strategies: Sequence[Hashable | None] | None, min_size: int) -> int:
    """Where the newest regime starts (0 when the sequence has one regime)."""
    parts = segments(success, strategies, min_size)
    return parts[-1][0] if parts else 0


def newest_regimes(
    names: Sequence[Hashable | None], order: Sequence[Any], success: Sequence[bool | None], min_size: int
) -> dict[Hashable | None, tuple[list[int], int]]:
    """Per name of `names` (None too), its decided rows (`success[i]` not None) sorted by `order[i]` (the
    completion time, then a tie-break) and where its newest regime starts among them (`last_regime`)."""
    rows: dict[Hashable | None, list[int]] = {}
    for i in sorted((i for i, ok in enumerate(success) if ok is not None), key=order.__getitem__):
        rows.setdefault(names[i], []).append(i)
    return {n: (r, last_regime([bool(success[i]) for i in r], None, min_size)) for n, r in rows.items()}


STALE, CURRENT, EVIDENCE = -1, 1, 2
"""`superseded`'s roles of a row (0: none)."""


def _likely_flips(tests: list[tuple[int, ...]], ok: np.ndarray, min_size: int) -> tuple[list, int]:
    """The `tests` (row indices in time order) with a cut ending in a failing run (`superseded`'s shape)
    whose one-sided Fisher p, times the tests holding `min_size` successes and failures, is at most
    ALPHA, and that number: every cut of every test at once (one `_fisher` call)."""
    if not tests:
        return [], 0
    flat = np.concatenate([np.asarray(t) for t in tests])
    size = np.array([len(t) for t in tests])
    seg, start = np.repeat(np.arange(len(tests)), size), np.cumsum(size) - size
    cum = np.cumsum(ok[flat])
    before = cum - (cum[start] - ok[flat][start])[seg]  # wins up to and including each row
    total = before[start + size - 1]
    tested = (total >= min_size) & (size - total >= min_size)
    m, n, total_wins = np.arange(len(flat)) - start[seg] + 1, size[seg], total[seg]  # m: older rows
    older, newer = before / m, (total_wins - before) / np.maximum(n - m, 1)
    cut = tested[seg] & (m >= min_size) & (n - m >= min_size) & (older >= 0.5) & (newer < 0.5)
    cut &= older - newer >= FLIP_GAP - _EPS
    p, count = np.full(len(tests), np.inf), int(tested.sum())
    if cut.any():
        np.minimum.at(p, seg[cut], _fisher(before[cut], m[cut], n[cut], total_wins[cut], True))
    return [t for t, pt in zip(tests, p, strict=True) if pt < np.inf and pt * count <= ALPHA + _EPS], count


def flips(
    times: Sequence[float],
    success: Sequence[bool | None],
    marks: Sequence[Iterable[Hashable]],
    min_size: int,
) -> tuple[list[tuple[tuple[int, ...], int]], list[int]]:
    """The marks whose decided rows, in time order, end in a failing regime after a succeeding one
    (`superseded`'s test, its arguments), each as (its rows in time order, where its newest regime
    starts among them); and the decided rows in time order."""
    decided = sorted((i for i, ok in enumerate(success) if ok is not None), key=lambda i: (times[i], i))
    good = [ok is True for ok in success]
    rows: dict[Hashable, list[int]] = {}  # per mark, its decided rows in time order
    for i in decided:
        for m in set(marks[i]):
            rows.setdefault(m, []).append(i)
    tested = (r for r in rows.values() if min_size <= sum(map(good.__getitem__, r)) <= len(r) - min_size)
    tests = sorted({tuple(r) for r in tested})
    ok_all = np.array(good, dtype=bool)
    likely, count = _likely_flips(tests, ok_all, min_size)
    out = []
    for idx in likely:
        ok: list[bool] = ok_all[list(idx)].tolist()
        parts = segments(ok, None, min_size)
        a, start = parts[-2] if len(parts) > 1 else (0, 0)
        older, newer = ok[a:start], ok[start:]
        if not older or 2 * sum(newer) >= len(newer) or 2 * sum(older) < len(older):
            continue  # one regime, or the newest one works, or the one before did not
        if flip(older, newer, None, None, min_size)[1] * count > ALPHA + _EPS:
            continue
        out.append((idx, start))
    return out, decided


def superseded(
    times: Sequence[float],
    success: Sequence[bool | None],
    marks: Sequence[Iterable[Hashable]],
    key: Sequence[float],
    min_size: int,
    flipped: tuple[list[tuple[tuple[int, ...], int]], list[int]] | None = None,
) -> np.ndarray:
    """Which rows tell of an approach that stopped working, as int8[n] roles (0: none); `flipped`:
    `flips` of these arguments when known.

    Rows are episodes: `times[i]` their completion (UTC epoch s), `success[i]` True, False (another
    outcome) or None (undecided), `marks[i]` what identifies their approach (hashables: the strategy,
    the tools, the solution's words), `key[i]` ranks evidence (higher first: relevance). A mark whose
    decided rows, in time order, end in a regime (`segments`) failing more often than not after one
    that succeeded, while rows without it succeeded since, was superseded: STALE its successes before
    that regime (what used to work), CURRENT the successes since of rows without it (what works now),
    EVIDENCE its newest regime's failure of the highest key, then the newest (why it changed). Marks
    holding the same rows are one test; the flip's p-value, times the tests (rows sets holding
    `min_size` successes and failures), is at most ALPHA (Bonferroni: many words, few flips by
    chance). STALE wins over CURRENT (a row superseded for another mark)."""
    role = np.zeros(len(times), dtype=np.int8)
    flipping, decided = flipped or flips(times, success, marks, min_size)
    found: dict[int, list[int]] = {STALE: [], CURRENT: [], EVIDENCE: []}
    for idx, start in flipping:
        ok = [success[i] is True for i in idx]
        mine = set(idx)
        now = [i for i in decided if success[i] and times[i] >= times[idx[start]] and i not in mine]
        if not now:
            continue
        found[STALE] += [i for i, good in zip(idx[:start], ok[:start], strict=True) if good]
        found[CURRENT] += now
        failed = [i for i, good in zip(idx[start:], ok[start:], strict=True) if not good]
        found[EVIDENCE].append(max(failed, key=lambda i: (key[i], times[i], -i)))
    for r in (CURRENT, EVIDENCE, STALE):
        role[found[r]] = r
    return role
