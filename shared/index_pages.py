"""Keyset pages over a RediSearch index: the listing routes' one query (`GET /v1/episodes`, `GET /v1/facts`).

A page is ordered by a SORTABLE numeric field (`completed_at`, a fact's `created_at`), then for
episodes by `tiebreak` (`shared.ties`; documents without one last), then by the key's digest suffix: a
total order on values fixed while a document lives, so `asc` is `desc` reversed. The next page starts
strictly after the previous one's last row (a keyset, not an offset): a listing paging through while
others publish sees every document that existed throughout exactly once; one whose sort value moved
meanwhile is seen once or not at all, never twice.

`FT.AGGREGATE`, as only it sorts by several keys and compares strings; the numeric bound is also in the
query, so the engine skips what lies before the cursor and the FILTER only settles ties.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from shared.cluster import unless_missing
from shared.index import aggregate_rows, numeric_clause, search_limit

SUFFIX = re.compile(r"[0-9a-f]{32}")  # the digest every document key ends with (shared.keys)


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page ends: the last row's sort value (UTC epoch seconds), its tie-break (None: the
    listing has none, or the document lacks one) and its key's digest suffix."""

    value: float
    suffix: str
    tie: float | None = None


@dataclass(frozen=True, slots=True)
class Row:
    key: bytes
    position: Position


def _literal(x: float) -> str:
    return repr(float(x)) if math.isfinite(x) else ("inf" if x > 0 else "-inf")


async def page(
    r: aioredis.Redis,
    index: str,
    query: str,
    *,
    sort_field: str,
    descending: bool,
    after: Position | None,
    limit: int,
    tie_field: str | None = None,
) -> tuple[list[Row], bool]:
    """At most `limit` documents of `query` in (`sort_field`, `tie_field`, key suffix) order, every key
    descending or every key ascending (a document without `tie_field` after those with one, either
    way), strictly after `after` (None: from the start).

    Every key of the index ends with a 32-hex digest (`shared.keys`; after the namespace's hash tag).
    Returns the rows and whether more follow. A document without `sort_field` is never listed (a
    missing NUMERIC matches no range). A missing index is an empty page. Raises ValueError for a suffix
    that is not a digest (callers validate cursors before).
    """
    expr = query
    tie = ""
    if after is not None:
        if not SUFFIX.fullmatch(after.suffix):
            raise ValueError("a position's suffix must be 32 lower-case hex characters")
        lo, hi = (None, after.value) if descending else (after.value, None)
        expr = f"{query} {numeric_clause(sort_field, lo, hi)}"
        beyond = "<" if descending else ">"
        v = _literal(after.value)
        rest = f'@k {beyond} "{after.suffix}"'
        if tie_field is not None:  # those without one come last: an `exists` first, as theirs has no value
            t, has = f"@{tie_field}", f"exists(@{tie_field})"
            if after.tie is None:
                rest = f"(!{has} && {rest})"
            else:
                x = _literal(after.tie)
                rest = f"(!{has} || {t} {beyond} {x} || ({t} == {x} && {rest}))"
        tie = f"@{sort_field} {beyond} {v} || (@{sort_field} == {v} && {rest})"
    loads = ["@__key", f"@{sort_field}", *([f"@{tie_field}"] if tie_field else [])]
    args: list[Any] = [
        "FT.AGGREGATE",
        index,
        expr,
        *search_limit(),
        "LOAD",
        len(loads),
        *loads,
        "APPLY",
        "substr(@__key, strlen(@__key) - 32, 32)",  # keys end with the digest (after a hash tag)
        "AS",
        "k",
    ]
    if tie:
        args += ["FILTER", tie]
    direction = "DESC" if descending else "ASC"
    keys = [f"@{sort_field}", *([f"@{tie_field}"] if tie_field else []), "@k"]
    args += ["SORTBY", 2 * len(keys), *(x for key in keys for x in (key, direction))]
    # one row more than asked: whether there is a next page, without an empty last page to fetch
    args += ["MAX", int(limit) + 1, "DIALECT", 2]
    reply = await unless_missing(r.execute_command(*args))
    if reply is None:
        return [], False
    rows = []
    for f in aggregate_rows(reply):
        key, value, suffix = f.get("__key"), f.get(sort_field), f.get("k")
        if key is None or value is None or suffix is None:
            continue  # deleted between the index's match and the load
        tb = f.get(tie_field) if tie_field else None
        rows.append(Row(key, Position(float(value), suffix.decode(), float(tb) if tb is not None else None)))
    more = len(rows) > limit
    rows = rows[:limit]
    if rows:
        # FT.AGGREGATE prints a SORTABLE number with ~12 significant digits (1764605454.899795 came
        # back as 1764605454.9), and a cursor rounded up would start the next page at the same row:
        # the last row's value, the only one a cursor holds, is read exactly from its hash
        exact = await r.hget(rows[-1].key, sort_field)
        if exact is not None:
            last = rows[-1]
            rows[-1] = Row(last.key, Position(float(exact), last.position.suffix, last.position.tie))
    return rows, more


async def cursor_pages(
    r: aioredis.Redis, index: str, query: str, fields: Sequence[str], *, batch: int, **target: Any
) -> AsyncIterator[list[dict[str, Any]]]:
    """The documents of `query` as pages of rows ({name: raw value} of the loaded `fields`, e.g.
    `@__key`), `batch` per read (`FT.AGGREGATE ... WITHCURSOR`, then `FT.CURSOR READ`), in no
    particular order; a document without any SORTABLE field (a draft) is found too. `target`
    (`target_nodes=` on a cluster, `shared.cluster.search_targets`) goes with every read, since a cursor
    lives on the node that opened it. ResponseError for a missing index."""
    aggregate = ("FT.AGGREGATE", index, query, *search_limit(), "LOAD", len(fields), *fields)
    reply, cursor = await r.execute_command(
        *aggregate, "WITHCURSOR", "COUNT", int(batch), "DIALECT", 2, **target
    )
    while True:
        yield aggregate_rows(reply)
        if not int(cursor):
            return
        reply, cursor = await r.execute_command(
            "FT.CURSOR", "READ", index, cursor, "COUNT", int(batch), **target
        )


async def every_key(
    r: aioredis.Redis, index: str, query: str, *, batch: int = 1000, **target: Any
) -> list[bytes]:
    """The key of every document of `query` (`cursor_pages`); a missing index holds none."""
    pages = cursor_pages(r, index, query, ["@__key"], batch=batch, **target)
    keys: list[bytes] = []
    rows = await unless_missing(anext(pages))
    while rows is not None:
        keys += [f["__key"] for f in rows if f.get("__key") is not None]
        rows = await anext(pages, None)
    return keys
