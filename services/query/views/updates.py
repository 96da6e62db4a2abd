"""`PATCH /v1/episodes/{id}`: change an episode's feedback, outcome, importance or metadata after the fact.

The change is an `EpisodeUpdated` event on the stream like every other write; the consolidator folds it
into the document (`services.consolidator.projection`), and a replay rebuilds it from the events.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from engram_episodic.errors import NotFound
from engram_episodic.events import Episode, EpisodeUpdated, updated
from engram_episodic.validation import (
    Collector,
    empty_changes,
    episode_problems,
    parse_episode,
    parse_update,
)
from services.query.appkeys import METRICS
from services.query.problems import Invalid
from services.query.views.common import ns_of, publisher, reply
from services.query.views.episodes import WAIT_EXPIRED, WaitQuery, _projected, stored_or_pending


async def _stored_episode(request: web.Request, episode_id: str) -> tuple[str | None, Episode | None]:
    """The episode's user (its sealed events' data key) and its stored state, if projected; NotFound
    for an id the namespace does not hold (never had, forgot, or another namespace's). An episode
    accepted but not projected yet may be updated too: the update sorts after its snapshot and is
    folded with it (which skips it if the merge is refused, `projection._updated`)."""
    found = await stored_or_pending(request, episode_id)
    if found is None:
        return None, None
    doc: dict[str, Any] = orjson.loads(found[b"doc"] or b"{}")
    user = doc.get("user_id")
    parsed = Collector()
    episode = parse_episode(doc, "", parsed, require_task=False, max_actions=None)
    return (user if isinstance(user, str) else None), episode


async def update_episode(request: web.Request, episode_id: str, query: WaitQuery, body: Any) -> web.Response:
    """Change an episode's feedback, outcome, importance or metadata after the fact"""
    errs = Collector()
    changes = parse_update(body, "", errs)
    for field, why in empty_changes(body):
        errs.add(field, why)
    errs.raise_if_any()  # 422 naming every bad field; nothing is published
    assert changes is not None
    user, stored = await _stored_episode(request, episode_id)
    event = EpisodeUpdated(
        namespace=ns_of(request), episode_id=episode_id, occurred_at=time.time(), user_id=user, **changes
    )
    if stored is not None and (problems := episode_problems(updated(stored, event))):
        # each field was valid alone; merged with the stored episode it is not (the fold would skip it)
        raise Invalid([(path, f"{reason} once merged with the stored episode") for path, reason in problems])
    [stream_id] = await publisher(request).publish([event])
    request.app[METRICS].published.labels("EpisodeUpdated").inc()
    out: dict[str, Any] = {"episode_id": episode_id, "event_id": event.event_id}
    if query.wait > 0:
        [reason] = await _projected(request, [event], [stream_id], query.wait)
        if reason == WAIT_EXPIRED and event.expires_at is not None:
            reason = None  # this change moved the expiry into the past: hidden, as asked
        out["projected"] = reason is None
        if reason is not None:
            out["reason"] = reason
        else:
            await _applied(request, event)
    return reply(out, status=202)


async def _applied(request: web.Request, event: EpisodeUpdated) -> None:
    """Raise Invalid (422) when the projected episode refuses `event` once merged: the fold skipped it.
    That happens when the episode was not projected yet as the change arrived (nothing to check it
    against), or when two changes raced and each was valid alone; the event stays in the log without
    effect (a replay skips it again). An episode gone meanwhile (forgotten, expired) says nothing."""
    try:
        _, now = await _stored_episode(request, event.episode_id)
    except NotFound:
        return
    if now is not None and (problems := episode_problems(updated(now, event))):
        raise Invalid(
            [
                (path, f"{reason} once merged with the stored episode; this change was not applied")
                for path, reason in problems
            ]
        )
