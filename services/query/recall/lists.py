"""The recency / reward / importance candidate lists of a recall: the scope's top `depth` episodes by a
signal, in the order (value, then tie-break), each answered from a remembered floor (the (depth + 1)-th
of that order) once one is known (`Floors`, one per app), so a recall asks Redis for ~depth + 1
episodes instead of sorting the whole scope (linear in it).

A floor is a hint, never trusted: every narrowed answer is checked to be the exact top `depth` before
it is used, so a stale floor costs at most a wider or a second query; each exact answer moves its
floor. A scope without a floor is first narrowed from a `hint` (a value near the top of the similarity
pool) and sorted whole only when that cannot be proven exact.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from services.query.recall.arms import knn_union
from shared.index import TIE_FIELD, Scope, SearchHit, filter_search, numeric_text


def number(raw: bytes | None) -> float:
    """A returned value as a number; NaN when absent or not a number."""
    try:
        return float(raw) if raw is not None else math.nan
    except ValueError:
        return math.nan


def field_float(fields: dict[bytes, bytes], name: bytes) -> float:
    """The number a hit returned for `name` (`number`)."""
    return number(fields.get(name))


FLOORS_CAP = 10_000
"""(scope, field) floors remembered per process; all are dropped when full (each is re-found by one
sort of its scope)."""
FLOOR_SLACK = 1e-11
"""Relative margin below the remembered floor: more than the rounding of a 12-significant-digit reply."""
TIED_CAP = 4
"""A floor at a tie is trusted while at most TIED_CAP × (depth + 1) episodes lie at or above it."""
_TIE = TIE_FIELD.encode()
_NO_TIE = -math.inf  # the floor's tie-break when the boundary is between two values: any episode of it


def _tie(hit: SearchHit) -> float:
    """The hit's `tiebreak` (`shared.ties.tie_break`; every document has one)."""
    return float(hit.fields[_TIE])


def _sort_key(field: bytes) -> Any:
    """The lists' order, best first when sorted in reverse: the value, then the tie-break."""
    return lambda h: (field_float(h.fields, field), _tie(h))


def _at_least(scope: Scope, name: str, floor: float, tie: float = _NO_TIE) -> Scope | None:
    """`scope` narrowed to episodes whose (`name`, tie-break) is at least (`floor`, `tie`) in
    lexicographic order (None when that leaves none). With `tie` -inf: `name` at least `floor`; else
    `name` above `floor`, or equal to it with a tie-break at least `tie` (a clause of its own)."""
    if tie != _NO_TIE:
        v = numeric_text(floor)
        clause = f"(@{name}:[({v} +inf] | (@{name}:[{v} {v}] @{TIE_FIELD}:[{numeric_text(tie)} +inf]))"
        return dataclasses.replace(scope, clause=f"{scope.clause} {clause}".strip())
    if name == "completed_at":
        if scope.until is not None and floor > scope.until:
            return None
        return dataclasses.replace(scope, since=max(floor, scope.since) if scope.since is not None else floor)
    lo, hi = getattr(scope, name)
    if hi is not None and floor > hi:
        return None
    narrowed: tuple[float | None, float | None] = (max(floor, lo) if lo is not None else floor, hi)
    if name == "reward":
        return dataclasses.replace(scope, reward=narrowed)
    if name == "importance":
        return dataclasses.replace(scope, importance=narrowed)
    raise ValueError(f"no floor on {name!r}")


def _valued(scope: Scope, name: str) -> Scope:
    """`scope` without the episodes that have no `name` (reward and importance are optional): those
    score 0 on it, like the lowest value, so a list of them adds nothing."""
    if name in ("reward", "importance") and getattr(scope, name) == (None, None):
        narrowed = _at_least(scope, name, -math.inf)
        assert narrowed is not None  # no upper bound
        return narrowed
    return scope


def _below(value: float) -> float:
    """A floor for a boundary `value` as the index printed it: a relative FLOOR_SLACK lower (see
    `_full_sort`)."""
    return value - abs(value) * FLOOR_SLACK


@dataclass(frozen=True, slots=True)
class _Ask:
    """One list asked of Redis: the top `depth` of `scope` by `name`, each hit with `fields`."""

    r: aioredis.Redis
    index: str
    scope: Scope
    name: str
    depth: int
    fields: tuple[str, ...]

    async def sorted(self, scope: Scope, limit: int, by: str | None = None) -> list[SearchHit]:
        """The first `limit` episodes of `scope` by `by` (default `name`), highest first."""
        by = by or self.name
        _, hits = await filter_search(
            self.r, self.index, scope, return_fields=self.fields, sort_by=by, descending=True, limit=limit
        )
        return hits


async def _tied(ask: _Ask, hits: list[SearchHit], value: float) -> tuple[list[SearchHit], float] | None:
    """The top `depth` of the scope when the depth-th and (depth + 1)-th of `hits` (the scope's top
    depth + 1 by `name`) share `value`: those above it, then the episodes at exactly `value` by
    tie-break, best first; and the tie-break of the (depth + 1)-th (the floor's). None when that order
    is not total there (two with the same tie-break, or `value` not the stored number: the printed
    value of one rounded in its 13th digit)."""
    field, scope = ask.name.encode(), ask.scope
    above = [h for h in hits if field_float(h.fields, field) > value]
    need = ask.depth + 1 - len(above)
    v = numeric_text(value)
    at = dataclasses.replace(scope, clause=f"{scope.clause} @{ask.name}:[{v} {v}]".strip())
    same = await ask.sorted(at, need, TIE_FIELD)
    ties = [_tie(h) for h in same]
    if len(same) < need or any(a <= b for a, b in zip(ties, ties[1:], strict=False)):
        return None
    return sorted(above, key=_sort_key(field), reverse=True) + same[: need - 1], ties[-1]


class Floors:
    """The remembered floors of the lists, per (index, scope, field, depth): `floors` → (floor value,
    floor tie-break), and `deepest` per (index, scope, field) → (the deepest list's depth, its
    floor), at most FLOORS_CAP (all dropped when full: each is re-found by one sort). One per app
    (`services.query.appkeys.FLOORS`)."""

    def __init__(self) -> None:
        self.floors: dict[tuple[str, str, str, int], tuple[float, float]] = {}
        self.deepest: dict[tuple[str, str, str], tuple[int, float]] = {}

    def _remember(self, key: tuple[str, str, str, int], floor: float, tie: float) -> None:
        if len(self.floors) >= FLOORS_CAP and key not in self.floors:
            self.floors.clear()
            self.deepest.clear()
        self.floors[key] = (floor, tie)
        index, scope_key, name, depth = key
        if depth >= self.deepest.get((index, scope_key, name), (0, 0.0))[0]:
            self.deepest[(index, scope_key, name)] = (depth, floor)

    def hint_for(self, index: str, scope: Scope, name: str, depth: int) -> float | None:
        """A remembered floor of a list of `scope` by `name` at least `depth` deep, as a `top_by` hint
        for a list of `depth`, or None (`/v1/context`'s newest episodes ride on its recall's floor)."""
        found = self.deepest.get((index, scope.cache_key(), name))
        return found[1] if found is not None and found[0] >= depth else None

    def _moved(self, key: tuple[str, str, str, int], next_value: float, last_value: float) -> None:
        """An exact answer's top depth ends at `last_value` and the (depth + 1)-th holds `next_value`:
        when they differ, the floor moves to that boundary (a floor at a tie stays, still exact)."""
        if last_value > next_value and math.isfinite(next_value):
            self._remember(key, _below(next_value), _NO_TIE)

    async def _full_sort(self, ask: _Ask, key: tuple[str, str, str, int]) -> list[SearchHit]:
        """`top_by` without a floor: the scope sorted by `name`; at a tie between the depth-th and the next
        value, the tied episodes sorted by their tie-break (`_tied`). Remembers the floor it finds."""
        field, depth = ask.name.encode(), ask.depth
        hits = await ask.sorted(ask.scope, depth + 1)
        order = _sort_key(field)
        if len(hits) <= depth:  # the whole scope: nothing below to exclude, nothing to remember
            return sorted(hits, key=order, reverse=True)
        boundary = field_float(hits[depth].fields, field)
        if not math.isfinite(boundary):
            return sorted(hits, key=order, reverse=True)[:depth]
        if field_float(hits[depth - 1].fields, field) > boundary:
            # a SORTABLE value comes back rounded to 12 significant digits ("%.12g"): the stored one may
            # lie just below it, so the floor is a little lower (as exact: the narrowed answer is checked)
            self._remember(key, _below(boundary), _NO_TIE)
            return sorted(hits[:depth], key=order, reverse=True)
        tied = await _tied(ask, hits, boundary)
        if tied is None:  # no total order at the tie: the sorted answer, remembering nothing
            return sorted(hits, key=order, reverse=True)[:depth]
        out, tie = tied
        self._remember(key, boundary, tie)
        return out

    async def top_by(
        self,
        r: aioredis.Redis,
        index: str,
        scope: Scope,
        name: str,
        depth: int,
        fields: tuple[str, ...],
        *,
        hint: float | None = None,
    ) -> list[SearchHit]:
        """The scope's `depth` episodes with the highest `name` (completed_at, last_accessed, reward,
        importance), best first, equal values by the highest tie-break (`shared.ties.tie_break`); each
        hit also returns `tiebreak`. Episodes without a reward (importance) are in no reward
        (importance) list (`_valued`).

        The (depth + 1)-th of the order is remembered per (scope, field) and the next query asks only for
        episodes at or above it, an answer used only when it holds depth + 1 episodes and the depth-th
        is strictly above the next (the exact top depth); otherwise the whole scope is sorted again. At a
        tie the floor is the value and the tie-break. Values equal to 12 significant digits (what the
        index returns) count as equal. Without a floor, `hint` (a value some episode of the scope holds)
        is tried as one first; it changes what the lists cost, never the lists.
        """
        key = (index, scope.cache_key(), name, depth)
        fields = fields if TIE_FIELD in fields else (*fields, TIE_FIELD)
        field = name.encode()
        scope = _valued(scope, name)
        ask = _Ask(r, index, scope, name, depth, fields)
        cached = self.floors.get(key) if name != "last_accessed" else None
        if cached is None and hint is not None and math.isfinite(hint) and name != "last_accessed":
            cached = (_below(hint), _NO_TIE)
        if cached is not None:
            narrowed = _at_least(scope, name, *cached)
            if narrowed is not None:
                order = _sort_key(field)
                if cached[1] == _NO_TIE:  # the (depth + 1)-th by value is all it takes
                    hits = await ask.sorted(narrowed, depth + 1)
                    # Redis picks among equal values at its LIMIT: only a gap in value proves the set
                    if len(hits) == depth + 1:
                        last = field_float(hits[depth - 1].fields, field)
                        boundary = field_float(hits[depth].fields, field)
                        if last > boundary:
                            self._moved(key, boundary, last)
                            return sorted(hits[:depth], key=order, reverse=True)
                else:  # at a tie Redis's sort cannot pick among the tied: every episode above the floor
                    cap = TIED_CAP * (depth + 1)
                    total, hits = await filter_search(r, index, narrowed, return_fields=fields, limit=cap)
                    hits.sort(key=order, reverse=True)
                    if (
                        total <= cap
                        and len(hits) >= depth + 1
                        and order(hits[depth - 1]) > order(hits[depth])
                    ):
                        return hits[:depth]
        return await self._full_sort(ask, key)

    async def remembered_lists(
        self,
        r: aioredis.Redis,
        index: str,
        scope: Scope,
        query_vector: np.ndarray,
        names: list[str],
        depth: int,
        fields: tuple[str, ...],
    ) -> list[list[SearchHit]] | None:
        """`top_by` of each of `names` from the remembered floors, all in one query that also returns each
        episode's cosine distance (so `_complete` needs no restricted KNN for them); None when a floor is
        not remembered (or is `last_accessed`'s) or the answer cannot be proven exact. An exact answer
        moves each floor to its list's new boundary, as `top_by` does.

        One KNN over the union of the narrowed scopes (`arms.knn_union`); each list is then its members
        sorted by value and tie-break, under `top_by`'s rule (depth + 1 members, the depth-th strictly
        above the next).
        """
        fields = fields if TIE_FIELD in fields else (*fields, TIE_FIELD)
        narrowed = []
        for name in names:
            key = (index, scope.cache_key(), name, depth)
            cached = self.floors.get(key)
            if name == "last_accessed" or cached is None:
                return None
            sub = _at_least(_valued(scope, name), name, *cached)
            if sub is None:
                return None
            narrowed.append((key, name.encode(), cached, sub))
        k = 2 * len(names) * (depth + 1)
        hits = await knn_union(r, index, [sub for *_, sub in narrowed], query_vector, k, return_fields=fields)
        if hits is None:
            return None
        lists, moves = [], []
        for key, field, floor, _ in narrowed:
            order = _sort_key(field)
            valued = [(o, h) for h in hits if (o := order(h)) >= floor]  # each hit's order read once
            valued.sort(key=itemgetter(0), reverse=True)
            if len(valued) < depth + 1 or not valued[depth - 1][0] > valued[depth][0]:
                return None
            lists.append([h for _, h in valued[:depth]])
            moves.append((key, valued[depth][0][0], valued[depth - 1][0][0]))
        for key, boundary, last in moves:  # all lists exact: their boundaries are the scope's
            self._moved(key, boundary, last)
        return lists
