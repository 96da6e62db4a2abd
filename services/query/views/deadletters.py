"""`GET /v1/dead-letters`, `POST /v1/dead-letters/redrive`, `POST /v1/dead-letters/discard`: the
caller's dead letters (events the consolidator gave up on), why, and publishing them again or deleting
them (`services.consolidator.deadletters` does both, as `engram-admin redrive` / `discard` do).

The dead-letter stream is one per deployment (`engram-admin dead-letters` lists every namespace's):
these routes see and act on only the entries whose payload names the caller's namespace
(`shared.codec.peek_identity`), so a tenant neither reads another's reasons nor re-drives them. An entry
naming no namespace (bytes that are no event) belongs to no tenant: only `engram-admin` reaches it.
"""

from __future__ import annotations

from typing import Annotated

from aiohttp import web
from pydantic import Field

from engram_episodic.errors import NotFound
from engram_episodic.timeutil import format_instant
from services.consolidator import deadletters
from services.query import models
from services.query.appkeys import KEYS
from services.query.views.common import ns_of, redis_of, reply
from shared.codec import peek_identity

SCAN = 100_000  # dead letters looked through for the caller's (few unless something is broken)
MAX_IDS = 1000


class DeadLetterQuery(models.Model):
    """`GET /v1/dead-letters` query parameters."""

    limit: Annotated[int, models.Bounded(1, 1000, from_query=True)] = Field(
        100, description="dead letters listed, oldest first, 1..1000"
    )


class DeadLetterIds(models.Model):
    """`POST /v1/dead-letters/redrive` and `/discard`: the dead letters to act on, by id."""

    ids: Annotated[list[models.IdStr], Field(min_length=1, max_length=MAX_IDS)] = Field(
        description="`id`s of `GET /v1/dead-letters`"
    )


async def _mine(request: web.Request) -> list[tuple[deadletters.DeadLetter, str]]:
    """The caller's dead letters, oldest first, each with the episode id its payload names."""
    ns = ns_of(request)
    out = []
    for letter in await deadletters.list_dead_letters(redis_of(request), request.app[KEYS], limit=SCAN):
        ident = peek_identity(letter.payload) if letter.payload else None
        if ident is not None and ident[0] == ns:
            out.append((letter, ident[1]))
    return out


async def list_dead_letters(request: web.Request, query: DeadLetterQuery) -> web.Response:
    """The namespace's dead letters (events the consolidator gave up on) and why"""
    mine = await _mine(request)
    results = [
        {
            "id": letter.dead_id,
            "episode_id": episode_id,
            "reason": letter.reason,
            "consumer": letter.consumer,
            "at": format_instant(letter.at),
        }
        for letter, episode_id in mine[: query.limit]
    ]
    return reply({"results": results, "total": len(mine)})


async def _act(request: web.Request, ids: list[str], act) -> web.Response:
    """`act` (re-drive or discard) on the caller's dead letters among `ids`; NotFound if none is."""
    wanted = list(dict.fromkeys(ids))
    chosen = [letter for letter, _ in await _mine(request) if letter.dead_id in wanted]
    if not chosen:
        raise NotFound("none of the ids is a dead letter of this namespace")
    done = await act(redis_of(request), request.app[KEYS], chosen)
    found = {letter.dead_id for letter in chosen}
    return reply({"done": done, "unknown": [i for i in wanted if i not in found]})


async def redrive_dead_letters(request: web.Request, body: DeadLetterIds) -> web.Response:
    """Publish the namespace's dead letters named again (after a fix)"""
    return await _act(request, body.ids, deadletters.redrive)


async def discard_dead_letters(request: web.Request, body: DeadLetterIds) -> web.Response:
    """Delete the namespace's dead letters named, and their events"""
    return await _act(request, body.ids, deadletters.discard)
