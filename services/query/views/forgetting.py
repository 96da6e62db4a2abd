"""Bulk forgetting: `DELETE /v1/agents/{id}`, `DELETE /v1/sessions/{id}`, `POST /v1/forget` (a list of
episode ids), each a job whose status `GET /v1/forget/{job_id}` reads.

Each publishes one `EpisodeForgotten` per episode; the consolidator erases the episode and leaves its
tombstone. The job is done when each of its episodes is tombstoned and its document deleted. The job
record (`Keys.forget_job`, expiring after JOB_TTL) holds the namespace, counts and the tombstone keys'
digests — never the ids, so it keeps nothing of what it erases.

An agent's or a session's forget first records its time (`Keys.agent_tombstone`,
`Keys.session_tombstone`), then lists the episodes the index holds (drafts included): an episode of
theirs that began no later than that and was not projected yet is refused by the projection's write
scripts and erased (`services.consolidator.scripts.FORGET_USER_LUA`); one that begins later is kept.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

import orjson
from aiohttp import web
from pydantic import Field

from engram_episodic.errors import NotFound
from engram_episodic.events import EpisodeForgotten
from engram_episodic.timeutil import format_instant
from services.query import models
from services.query.appkeys import KEYS, METRICS
from services.query.store import JOB_TTL, EpisodeStore
from services.query.views.common import (
    accepted_ids,
    index_of,
    ns_of,
    publisher,
    redis_of,
    reply,
    store_of,
    tags_of,
)
from shared.index import Scope
from shared.index_pages import every_key
from shared.keys import digest

MAX_IDS = 1000  # episode ids per POST /v1/forget
PUBLISH_CHUNK = 1000  # EpisodeForgotten events per XADD call (one atomic script each)


class ForgetRequest(models.Model):
    """`POST /v1/forget`: the episodes to forget, by id."""

    episode_ids: Annotated[list[models.IdStr], Field(min_length=1, max_length=MAX_IDS)]


async def _ids_of_scope(request: web.Request, scope: Scope) -> list[str]:
    """The ids of every episode document of the scope (drafts too), read from the stored JSON (the
    index holds digests of ids, `shared.tags`)."""
    keys = await every_key(redis_of(request), index_of(request), scope.query())
    ids: dict[str, None] = {}
    for raw in await store_of(request).field(keys, "doc"):
        if raw is None:
            continue  # forgotten meanwhile
        eid = orjson.loads(raw).get("episode_id")
        if isinstance(eid, str):
            ids[eid] = None
    return list(ids)


async def _start(request: web.Request, kind: str, episode_ids: list[str], **extra: Any) -> web.Response:
    """Publish the forgets of `episode_ids`, record the job, answer 202 with its status."""
    store, ns = store_of(request), ns_of(request)
    now = time.time()
    pub = publisher(request)
    for start in range(0, len(episode_ids), PUBLISH_CHUNK):
        chunk = episode_ids[start : start + PUBLISH_CHUNK]
        await pub.publish([EpisodeForgotten(namespace=ns, episode_id=e, occurred_at=now) for e in chunk])
    request.app[METRICS].published.labels("EpisodeForgotten").inc(len(episode_ids))
    job_id = uuid.uuid4().hex
    tombs = "".join(digest(ns, e) for e in episode_ids)  # what Keys.tombstone_of takes
    job = {
        "namespace": ns,
        "kind": kind,
        "episodes": len(episode_ids),
        "created_at": repr(now),
        "tombs": tombs,
    }
    await store.record_job(job_id, job)
    return reply({**await _status(store, job_id, ns), **extra}, status=202)


async def _status(store: EpisodeStore, job_id: str, ns: str) -> dict[str, Any]:
    raw = await store.job(job_id)
    if not raw or raw.get(b"namespace") != ns.encode():
        raise NotFound(f"no forget job {job_id[:80]!r} in this namespace")
    tombs = raw.get(b"tombs", b"").decode()
    done = await store.erased(ns, [tombs[i : i + 32] for i in range(0, len(tombs), 32)])
    total = int(raw[b"episodes"])
    created = float(raw[b"created_at"])
    return {
        "job_id": job_id,
        "kind": raw[b"kind"].decode(),
        "status": "done" if done >= total else "pending",
        "episodes": total,
        "forgotten": done,
        "created_at": format_instant(created),
        "expires_at": format_instant(created + JOB_TTL),
        "job": f"/v1/forget/{job_id}",
    }


async def forget_agent(request: web.Request, agent_id: str) -> web.Response:
    """Forget every episode of an agent (a job: how many, and when done)"""
    ns = ns_of(request)
    # the forget time first, then the listing: what the index misses (in flight) the write scripts refuse
    await store_of(request).forget_since(request.app[KEYS].agent_tombstone(ns, agent_id))
    scope = Scope(namespace=ns, tags=await tags_of(request), agent_id=agent_id, status=None)
    return await _start(request, "agent", await _ids_of_scope(request, scope), agent_id=agent_id)


async def forget_session(request: web.Request, session_id: str) -> web.Response:
    """Forget every episode of a session (a job: how many, and when done)"""
    ns = ns_of(request)
    await store_of(request).forget_since(request.app[KEYS].session_tombstone(ns, session_id))
    scope = Scope(namespace=ns, tags=await tags_of(request), session_id=session_id, status=None)
    return await _start(request, "session", await _ids_of_scope(request, scope), session_id=session_id)


async def forget_episodes(request: web.Request, body: ForgetRequest) -> web.Response:
    """Forget a list of episodes by id (a job: how many, and when done)

    The ids the namespace holds (a document, stored events, dead letters, or accepted and not yet
    projected) are forgotten; those it never had are listed in `unknown`, those forgotten before in
    `already_forgotten` (neither is published)."""
    ns = ns_of(request)
    wanted = list(dict.fromkeys(body.episode_ids))
    gone: list[str] = []
    held: list[str] = []
    unsure: list[str] = []
    for e, (tomb, has) in zip(wanted, await store_of(request).holdings(ns, wanted), strict=True):
        (gone if tomb else held if has else unsure).append(e)
    if unsure:
        pending = await accepted_ids(request)
        held += [e for e in unsure if e in pending]
        unsure = [e for e in unsure if e not in pending]
    if not held and not gone:
        raise NotFound("none of these episodes is in this namespace")
    return await _start(request, "episodes", held, unknown=unsure, already_forgotten=gone)


async def forget_job(request: web.Request, job_id: str) -> web.Response:
    """The status of a bulk forget: pending or done, and how many episodes are erased"""
    return reply(await _status(store_of(request), job_id, ns_of(request)))
