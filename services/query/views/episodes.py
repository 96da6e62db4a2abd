"""`POST /v1/episodes` (ingest, optionally waiting until projected), `GET` and `DELETE
/v1/episodes/{id}`, `DELETE /v1/users/{id}`."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Annotated, Any

from aiohttp import web
from pydantic import Field

from engram_episodic.calls import MAX_WAIT
from engram_episodic.errors import NotFound
from engram_episodic.events import (
    EpisodeCompleted,
    EpisodeEvent,
    EpisodeForgotten,
    UserForgotten,
    new_event_id,
)
from engram_episodic.shapes import episode_to_dict
from engram_episodic.timeutil import format_instant
from engram_episodic.validation import Collector, parse_episode, repeated_id
from services.query import models
from services.query import recall as rc
from services.query.appkeys import EMBEDDER, METRICS, SETTINGS
from services.query.problems import Invalid, Problem
from services.query.views.common import (
    accepted_ids,
    episode_of,
    group_of,
    ns_of,
    publisher,
    reply,
    store_of,
)
from shared.index import SearchHit

STATUS_PENDING = "pending"  # accepted into the stream, not yet projected by the consolidator
MAX_INGEST_WAIT = MAX_WAIT  # seconds a ?wait= may hold a request: the client checks the same bound
INGEST_WAIT_POLL = 0.02


class WaitQuery(models.Model):
    """The query parameters of a write (ingest, update, forget)."""

    wait: Annotated[float, models.Bounded(0.0, MAX_INGEST_WAIT, from_query=True)] = Field(
        0.0,
        description="seconds to wait until the consolidator has applied the write: the episodes "
        "projected (recallable; the answer says which are, `projected`) or erased (`forgotten` says "
        "whether they were); 0 answers at once",
    )


WAIT_FORGOTTEN = "forgotten"  # the id is tombstoned: never projected again (publish under a new id)
WAIT_DEAD_LETTERED = "dead_lettered"  # the consolidator gave up on the event (`engram-admin dead-letters`)
WAIT_TIMEOUT = "timeout"  # not projected within `wait`
WAIT_EXPIRED = "expired"  # projected, but past its expires_at: hidden from every read, erased soon


async def _projected(
    request: web.Request, events: Sequence[EpisodeEvent], stream_ids: list[str], wait: float
) -> list[str | None]:
    """Poll until each event is projected, up to `wait` s: None for a projected one, else why not
    (`WAIT_FORGOTTEN`, `WAIT_DEAD_LETTERED`, `WAIT_EXPIRED`, `WAIT_TIMEOUT`). Projected = the group acked
    its entry (after the document write committed) and its episode's event hash holds it (the hash is
    written a step before the document). An event acked but never recorded was dropped or
    dead-lettered: said at once instead of waiting out `wait`."""
    store, group = store_of(request), group_of(request)
    deadline = time.monotonic() + wait
    why: list[str | None] = [WAIT_TIMEOUT] * len(events)
    while True:
        todo = [i for i, w in enumerate(why) if w == WAIT_TIMEOUT]
        acked = await group.acked([stream_ids[i] for i in todo])
        found = await store.recorded([events[i] for i in todo])
        for i, ok, (recorded, expired) in zip(todo, acked, found, strict=True):
            if ok and recorded:
                # projected, but hidden: an expired episode posted again keeps its expiry (the fold keeps
                # the stored fields a re-post would make invalid)
                why[i] = WAIT_EXPIRED if expired else None
            elif ok:
                why[i] = await _dropped(request, events[i], stream_ids[i])
        if all(w != WAIT_TIMEOUT for w in why) or time.monotonic() >= deadline:
            return why
        await asyncio.sleep(min(INGEST_WAIT_POLL, max(0.0, deadline - time.monotonic())))


async def _dropped(request: web.Request, event: EpisodeEvent, stream_id: str) -> str | None:
    """Why an acked event is not in its episode's event hash: its episode was forgotten, or the event
    was dead-lettered; None (projected) when the episode was re-published under another user, which
    dropped the event (its stream entry is gone, the episode's document stays:
    `Forgetting.drop_superseded`); `WAIT_TIMEOUT` (keep waiting) when none of these shows yet."""
    store, ns, eid = store_of(request), event.namespace, event.episode_id
    if await store.tombstoned(ns, eid):
        return WAIT_FORGOTTEN
    if await store.dead_lettered(ns, eid, stream_id):
        return WAIT_DEAD_LETTERED
    return None if await store.superseded(ns, eid, stream_id) else WAIT_TIMEOUT


def _future(ep: Any, path: str, errs: Collector, limit: float, now: float) -> bool:
    """Name every instant of `ep` later than `limit` (UTC epoch s); True if there was one.

    An instant hours ahead (a skewed agent clock) would pin recency at 1 until then, head the short-term
    window and put learning-curve points in the future; a small skew (ENGRAM_MAX_CLOCK_SKEW) is normal.
    """

    def name(field: str) -> str:
        return f"{path}.{field}" if path else field

    found = [
        (name(f), getattr(ep, f)) for f in ("started_at", "completed_at") if (getattr(ep, f) or 0) > limit
    ]
    found += [
        (name(f"actions[{i}].timestamp"), a.timestamp)
        for i, a in enumerate(ep.actions)
        if (a.timestamp or 0) > limit
    ]
    for field, value in found:
        errs.add(
            field,
            f"is {value - now:,.0f} s in the future (more than ENGRAM_MAX_CLOCK_SKEW = "
            f"{limit - now:g} s ahead of the service's clock)",
        )
    return bool(found)


def _ingest_items(body: Any) -> tuple[bool, list[Any]]:
    """Whether an ingest body is a batch (`{"episodes": [...]}`), and its episodes; Invalid for a bad batch."""
    if not (isinstance(body, dict) and "episodes" in body):
        return False, [body]
    extra = [k for k in body if k != "episodes"]
    if extra:
        raise Invalid([(k, 'is not a known field (send one episode, or {"episodes": [...]})') for k in extra])
    items = body["episodes"]
    if not isinstance(items, list) or not items or len(items) > models.MAX_BATCH:
        raise Invalid([("episodes", f"must be a list of 1..{models.MAX_BATCH} episodes")])
    return True, items


async def ingest(request: web.Request, query: WaitQuery, body: Any) -> web.Response:
    """Ingest one finished episode or a batch {episodes: [...]}"""
    received = time.time()
    batch, items = _ingest_items(body)
    errs = Collector()
    episodes = []
    first_index: dict[str, int] = {}
    for i, item in enumerate(items):
        path = f"episodes[{i}]" if batch else ""
        # completed_at defaults to the receive time, before a ttl is counted from it
        ep = parse_episode(item, path, errs, default_episode_id=new_event_id(), default_completed_at=received)
        if ep is not None and (repeat := repeated_id(first_index, i, ep.episode_id)):
            errs.add(f"{path}.episode_id", f"{repeat}; send one version of an episode per request")
            ep = None
        if isinstance(item, dict) and item.get("outcome") is None:
            errs.add(f"{path}.outcome" if path else "outcome", "is required for a finished episode")
            ep = None
        dim = request.app[EMBEDDER].dim
        if ep is not None and ep.vector is not None and len(ep.vector) != dim:
            # the consolidator would dead-letter it; the service knows the index's dimension, so say it now
            errs.add(
                f"{path}.vector" if path else "vector",
                f"has {len(ep.vector)} dimensions; this index expects {dim}",
            )
            ep = None
        if ep is not None and _future(
            ep, path, errs, received + request.app[SETTINGS].max_clock_skew, received
        ):
            ep = None
        if ep is not None:
            episodes.append(ep)
    errs.raise_if_any()  # InvalidEpisode → 422 naming every bad field; nothing is published
    # a forgotten id is not published again, so no stream (nor its AOF, RDB) holds its text again (an
    # `engram import` of an export made before the forget); a racing forget the consolidator honours
    ids = [ep.episode_id for ep in episodes]
    forgotten = await store_of(request).forgotten(ns_of(request), ids) if ids else set()
    now = time.time()
    events = [
        EpisodeCompleted(
            namespace=ns_of(request),
            episode_id=ep.episode_id,
            occurred_at=now,
            episode=ep,
        )
        for ep in episodes
        if ep.episode_id not in forgotten
    ]
    stream_ids = await publisher(request, backpressure=True).publish(events) if events else []
    request.app[METRICS].published.labels("EpisodeCompleted").inc(len(events))
    sent = {e.episode_id: e for e in events}
    results: list[dict[str, Any]] = [
        {"episode_id": e.episode_id, "event_id": e.event_id}
        if (e := sent.get(ep.episode_id)) is not None
        else {"episode_id": ep.episode_id, "event_id": None, "projected": False, "reason": WAIT_FORGOTTEN}
        for ep in episodes
    ]
    out: dict[str, Any] = {"results": results, "accepted": len(events)}
    if forgotten:
        out["forgotten"] = len(forgotten)
    if query.wait > 0:
        out["projected"] = await _waited_for(request, events, stream_ids, query.wait, results)
    if not batch:
        out.update(results[0])
    return reply(out, status=202)


async def _waited_for(
    request: web.Request,
    events: Sequence[EpisodeEvent],
    stream_ids: list[str],
    wait: float,
    results: list[dict[str, Any]],
) -> bool:
    """`_projected` of the published `events`, set on their `results` (those with an event id, in
    order); True when every result is projected."""
    why = iter(await _projected(request, events, stream_ids, wait) if events else [])
    for result in results:
        if result["event_id"] is not None:
            reason = next(why)
            result["projected"] = reason is None
            if reason is not None:
                result["reason"] = reason
    return all(result["projected"] for result in results)


async def stored_or_pending(request: web.Request, episode_id: str) -> dict[bytes, bytes | None] | None:
    """The episode's stored fields (`EpisodeStore.stored`), or None while it is accepted but not yet
    projected (read-your-writes: not "never existed"); NotFound otherwise (naming the dead letters when
    its events were dead-lettered). A negative pending check is followed by a second read: an event
    acked between the first read and the check has its document by the second (acked after the write)."""
    store, ns = store_of(request), ns_of(request)
    try:
        return await store.stored(ns, episode_id)
    except NotFound:
        if await store.tombstoned(ns, episode_id):
            raise
        if episode_id in await accepted_ids(request):
            return None
    try:
        return await store.stored(ns, episode_id)
    except NotFound as exc:  # its events were given up on: say where they are, not "never existed"
        if await store.dead_lettered(ns, episode_id):
            raise NotFound(
                f"{exc}: its events were dead-lettered by the consolidator (`engram-admin dead-letters` says "
                f"why; `engram-admin redrive` after a fix, `engram-admin discard` to drop them)"
            ) from None
        raise


async def get_episode(request: web.Request, episode_id: str) -> web.Response:
    """One episode of the caller's namespace"""
    found = await stored_or_pending(request, episode_id)
    if found is None:
        return reply(
            {
                "episode": None,
                "episode_id": episode_id,
                "status": STATUS_PENDING,
                "access_count": 0,
                "last_accessed": None,
            }
        )
    # a search hit has no None fields: the ones this document lacks are left out (read as missing alike)
    c = rc.decode_hit(SearchHit(key=b"", fields={k: v for k, v in found.items() if v is not None}))
    if c is None:
        raise Problem(500, "the stored episode is unreadable; it was logged")
    out = {
        "episode": episode_to_dict(episode_of(c), iso=True),
        "status": (found[b"status"] or b"").decode(),
        "access_count": c.access_count,
        "last_accessed": format_instant(c.last_accessed) if math.isfinite(c.last_accessed) else None,
    }
    return reply(out)


async def _forget(
    request: web.Request, event: EpisodeForgotten | UserForgotten, out: dict[str, Any], wait: float
) -> web.Response:
    """Publish the forget `event`: 202 with `out`, its `event_id` and, when `wait` > 0, `forgotten`:
    whether the consolidator acked it within `wait` seconds. It erases before it acks
    (`services.consolidator.forgetting`), so acked = gone from every read."""
    [stream_id] = await publisher(request).publish([event])
    request.app[METRICS].published.labels(type(event).__name__).inc()
    out["event_id"] = event.event_id
    if wait > 0:
        group, deadline = group_of(request), time.monotonic() + wait
        while not (done := (await group.acked([stream_id]))[0]) and time.monotonic() < deadline:
            await asyncio.sleep(INGEST_WAIT_POLL)
        out["forgotten"] = bool(done)
    return reply(out, status=202)


async def delete_episode(request: web.Request, episode_id: str, query: WaitQuery) -> web.Response:
    """Forget one episode"""
    try:
        # accepted but not yet projected counts too: it would be projected after a refused forget
        await stored_or_pending(request, episode_id)
    except NotFound:
        # no readable document, but the namespace may still hold its data: stored events of a draft or
        # of an episode not yet written, or dead letters, which a forget must reach too
        [(tombstoned, held)] = await store_of(request).holdings(ns_of(request), [episode_id])
        if tombstoned:
            # forgotten already: DELETE is idempotent (a client repeating it after a lost answer got a 404)
            again: dict[str, Any] = {"episode_id": episode_id, "event_id": None, "already_forgotten": True}
            if query.wait > 0:  # the tombstone is written by the erase: nothing left to wait for
                again["forgotten"] = True
            return reply(again, status=202)
        if not held:
            raise
    event = EpisodeForgotten(namespace=ns_of(request), episode_id=episode_id, occurred_at=time.time())
    return await _forget(request, event, {"episode_id": episode_id}, query.wait)


async def delete_user(request: web.Request, user_id: str, query: WaitQuery) -> web.Response:
    """Forget every episode of a user"""
    # the projector erases a user's episodes before it acks the event (`Forgetting.erase_user`)
    event = UserForgotten(namespace=ns_of(request), user_id=user_id, occurred_at=time.time())
    return await _forget(request, event, {"user_id": user_id}, query.wait)
