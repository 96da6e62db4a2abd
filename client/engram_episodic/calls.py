"""The API's requests as values, described once for both clients (`Engram`, `AsyncEngram`): no I/O.

`Calls.<route>(...)` returns a `Call` (method, path, body, query parameters, how to read the answer and
whether a repeat after a lost answer is harmless); the clients' method of the same name takes the same
arguments and sends it (`engram_episodic.client`, which callers import `Call` and `Calls` from).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, Unpack
from urllib.parse import quote

from engram_episodic.drafts import finished_episode
from engram_episodic.errors import (
    EngramError,
    EpisodeForgotten,
    InvalidEpisode,
    InvalidRequest,
)
from engram_episodic.events import Episode
from engram_episodic.options import (
    ContextOptions,
    CurveOptions,
    EpisodeChanges,
    EpisodeListOptions,
    FactListOptions,
    FactSearchOptions,
    RecallOptions,
    SkillsOptions,
    StrategyOptions,
    SuggestOptions,
)
from engram_episodic.parts import DEFAULT_MAX_BODY_BYTES, request_bodies
from engram_episodic.shapes import episode_to_dict
from engram_episodic.timeutil import format_instant
from engram_episodic.types import (
    Accepted,
    Consolidation,
    Context,
    DeadLetters,
    DeadLettersActed,
    EpisodePage,
    Fact,
    FactDetail,
    FactPage,
    ForgetJob,
    Forgetting,
    IngestResult,
    LearningCurve,
    Recall,
    Skills,
    StoredEpisode,
    StrategyChoice,
    Suggestion,
    Summary,
    Updated,
)
from engram_episodic.validation import (
    empty_changes,
    json_kind,
    parse_update,
    repeated_id,
    unicode_problem,
)

T = TypeVar("T")
MAX_WAIT = 30.0
"""The longest `?wait=` (seconds) the service holds a write or a forget for: the one bound of the client's
`wait` arguments, the CLI's `--wait` and the service's query parameter."""


class WaitTimeout(EngramError, TimeoutError):
    """A wait gave up: the episode was not projected within the timeout (it was accepted all the same;
    `episode_ids` names the episodes), or it never will be (forgotten before, dead-lettered, expired).
    `result`: the whole ingest's answer (each episode's `projected` and `reason`)."""

    result: IngestResult | None = None


def _wire(value: Any, name: str) -> Any:
    """A Python argument in its JSON form: datetimes as ISO 8601 with their offset, timedeltas as seconds.

    Raises InvalidRequest naming the argument for what JSON cannot carry (a naive datetime, NaN)."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidRequest(
                [(name, "a datetime needs a UTC offset (tzinfo); naive times are ambiguous")]
            )
        return format_instant(value.timestamp())
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest([(name, "must be finite (NaN and infinity are not JSON)")])
    if isinstance(value, Mapping):
        return {k: _wire(v, f"{name}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_wire(v, f"{name}[{i}]") for i, v in enumerate(value)]
    return value


def _body(options: Mapping[str, Any], **required: Any) -> dict[str, Any]:
    out = {k: _wire(v, k) for k, v in required.items()}
    out.update({k: _wire(v, k) for k, v in options.items() if v is not None})
    return out


def _params(options: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in options.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _path(value: str, name: str) -> str:
    """`value` as one URL path segment. `.` and `..` are valid ids but dot segments, which URL
    normalisation removes (`/v1/users/..` would become `/v1`, and a forget of user `..` a 404),
    so their dots are percent-encoded (the server decodes `%2E` back to `.`). Raises InvalidRequest
    naming `name` for an empty or non-string value or one holding a lone surrogate."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest([(name, "must be a non-empty string")])
    if value in (".", ".."):
        return value.replace(".", "%2E")
    if why := unicode_problem(value):  # a lone surrogate has no UTF-8 form, so no URL can carry it
        raise InvalidRequest([(name, why)])
    return quote(value, safe="")


# --- one request, described once for both clients -------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One API request and how to read its answer. `idempotent`: safe to repeat after a lost answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    body: Any = None
    params: Mapping[str, str] | None = None
    idempotent: bool = True

    def as_json(self) -> Call[Any]:
        """The same request answering the service's JSON as it came (dicts and lists), unparsed."""
        return dataclasses.replace(self, parse=lambda data: data)


def text_errors(call: Call[Any]) -> list[tuple[str, str]]:
    """Every query parameter and body field of `call` holding text with no UTF-8 form (a lone surrogate,
    which is what Python makes of a command line's invalid bytes), as `(field, reason)` named as the
    service names them (`agent_id`, `category[1]`, `metadata.note`) with its reason; [] when none does.
    A key that is not valid Unicode is named by the object holding it (`<query>`, `<body>` at the top)."""
    errors: list[tuple[str, str]] = []
    for name, value in (call.params or {}).items():
        if unicode_problem(name):
            errors.append(("<query>", "has a parameter name that is not valid Unicode text"))
        elif why := unicode_problem(value):
            errors.append((name, why))
    stack: list[tuple[Any, str]] = [(call.body, "")]  # depth-first without recursion, in the body's order
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if why := unicode_problem(item):
                errors.append((path or "<body>", why))
        elif isinstance(item, Mapping):
            if any(not isinstance(k, str) or unicode_problem(k) for k in item):
                errors.append((path or "<body>", "has a key that is not valid Unicode text"))
            named = [(v, f"{path}.{k}" if path else str(k)) for k, v in item.items()]
            stack.extend(reversed(named))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(v, f"{path}[{i}]") for i, v in enumerate(item)]))
    return errors


def _post_episodes(body: dict[str, Any], wait: float | None) -> Call[IngestResult]:
    return Call(
        "POST",
        "/v1/episodes",
        IngestResult.from_json,
        body=body,
        params=_wait(wait),
    )


def joined(results: list[IngestResult]) -> IngestResult:
    """One `IngestResult` of the requests `Calls.publish` made: every episode once, in the list's order,
    `projected` only if each of its parts was, the whole only if every request's was (None without `wait`)."""
    if len(results) == 1:
        return results[0]
    parts: dict[str, list[Accepted]] = {}
    for a in (a for r in results for a in r.results):
        parts.setdefault(a.episode_id, []).append(a)
    accepted = tuple(
        dataclasses.replace(p[0], projected=False, reason=next((a.reason for a in p if a.reason), None))
        if any(a.projected is False for a in p)
        else p[0]
        for p in parts.values()
    )
    flags = [r.projected for r in results]
    projected = None if any(f is None for f in flags) else all(flags)
    return dataclasses.replace(results[0], accepted=len(accepted), results=accepted, projected=projected)


_WHY = {
    "forgotten": "forgotten before, so not published (a forgotten episode_id is never stored again: publish under a new one)",
    "dead_lettered": "dead-lettered by the consolidator (`engram-admin dead-letters` says why)",
    "expired": "expired (past its expires_at: hidden from every read; publish under a new episode_id)",
}


def _waited(result: IngestResult, wait: float | None, recorded: str | None = None) -> IngestResult:
    """`result`, or WaitTimeout when `wait` was given and an episode was not projected. `recorded`: the
    episode_id of `record`, refused with EpisodeForgotten when it was forgotten before (nothing was
    published, so there is nothing to wait for)."""
    if recorded is not None and any(a.forgotten for a in result.results if a.episode_id == recorded):
        raise EpisodeForgotten(recorded)
    if wait and result.projected is False:
        late = [a for a in result.results if a.projected is False]
        parts = []
        for reason, what in _WHY.items():
            ids = [a.episode_id for a in late if a.reason == reason]
            if ids:
                parts.append(f"{', '.join(ids[:10])}: {what}")
        slow = [a.episode_id for a in late if a.reason not in _WHY]
        if slow:
            parts.append(f"not projected within {wait:g}s: {', '.join(slow[:10])}")
        # a forgotten id was not even published: "accepted" would say otherwise
        lead = "accepted, but " if any(a.reason != "forgotten" for a in late) else ""
        timeout = WaitTimeout(lead + "; ".join(parts))
        timeout.episode_ids = tuple(a.episode_id for a in late)
        timeout.result = result
        raise timeout
    return result


def _wait(wait: float | None) -> dict[str, str] | None:
    """The `?wait=` query parameter of a call that can wait (seconds), or None without one (or 0).

    Raises InvalidRequest naming `wait` for anything but a number of seconds in 0..MAX_WAIT, which the
    service would refuse after the episode's validation: nothing is sent."""
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= MAX_WAIT:
        shown = (
            f"the number {wait!r}"
            if isinstance(wait, int | float) and not isinstance(wait, bool)
            else json_kind(wait)
        )
        raise InvalidRequest(
            [("wait", f"must be a number of seconds between 0 and {MAX_WAIT:g}, not {shown}")]
        )
    return {"wait": repr(float(wait))} if wait else None


class Calls:
    """The API's requests as values (no I/O): what `Engram` and `AsyncEngram` send. A route's method
    here takes the arguments of the clients' method of the same name, which sends what it returns."""

    @staticmethod
    def recall(query: str, **options: Unpack[RecallOptions]) -> Call[Recall]:
        """The episodes worth replaying for `query`, best first (`POST /v1/recall`)."""
        return Call(
            "POST",
            "/v1/recall",
            Recall.from_json,
            body=_body(options, query=query),
            idempotent=not options.get("touch"),
        )

    @staticmethod
    def context(task: str, **options: Unpack[ContextOptions]) -> Call[Context]:
        """Working memory for `task`: recalled episodes, the short-term window, facts and a ready `prompt`."""
        return Call("POST", "/v1/context", Context.from_json, body=_body(options, task=task))

    @staticmethod
    def strategy(task: str, **options: Unpack[StrategyOptions]) -> Call[StrategyChoice]:
        """Which strategy to use for `task`, with the rule and the reason (`POST /v1/strategy`)."""
        return Call("POST", "/v1/strategy", StrategyChoice.from_json, body=_body(options, task=task))

    @staticmethod
    def suggest(task: str, **options: Unpack[SuggestOptions]) -> Call[Suggestion]:
        """How confident past experience is about `task`, and what failed before (`POST /v1/suggest`)."""
        return Call("POST", "/v1/suggest", Suggestion.from_json, body=_body(options, task=task))

    @staticmethod
    def skills(**options: Unpack[SkillsOptions]) -> Call[Skills]:
        """Per-category skill profiles and the weak categories (`GET /v1/skills`)."""
        return Call("GET", "/v1/skills", Skills.from_json, params=_params(options))

    @staticmethod
    def learning_curve(**options: Unpack[CurveOptions]) -> Call[LearningCurve]:
        """Rolling success rate and reward per episode, oldest first (`GET /v1/learning-curve`)."""
        return Call("GET", "/v1/learning-curve", LearningCurve.from_json, params=_params(options))

    @staticmethod
    def search_facts(query: str | None = None, **options: Unpack[FactSearchOptions]) -> Call[list[Fact]]:
        """Facts near `query` (the most confident without one), current only unless asked (`POST /v1/facts/search`)."""
        body = _body(options, **({"query": query} if query is not None else {}))
        return Call(
            "POST", "/v1/facts/search", lambda d: [Fact.from_json(f) for f in d["results"]], body=body
        )

    @staticmethod
    def get_fact(fact_id: str) -> Call[FactDetail]:
        """One fact with its evidence episodes and the facts it superseded; ResourceNotFound (404) if none."""
        return Call("GET", f"/v1/facts/{_path(fact_id, 'fact_id')}", FactDetail.from_json)

    @staticmethod
    def consolidate(
        *, agent_id: str | None = None, category: str | None = None, all_scopes: bool = True
    ) -> Call[Consolidation]:
        """Consolidate episodes into facts now: every scope, the namespace scope, or one (agent, category)."""
        body: dict[str, Any] = {"all_scopes": all_scopes}
        if agent_id is not None or category is not None:
            body = {"agent_id": agent_id, "category": category}
        return Call("POST", "/v1/consolidate", Consolidation.from_json, body=body)

    @staticmethod
    def record_parts(
        episode: Episode | Mapping[str, Any] | None,
        fields: Mapping[str, Any],
        wait: float | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> tuple[Episode, list[Call[IngestResult]]]:
        """`record` for the clients: one single-episode request when it fits one (`max_body_bytes`,
        1,000 actions), else its parts as `publish` sends them."""
        prepared = finished_episode(episode, max_actions=None, **fields)
        bodies = request_bodies([episode_to_dict(prepared)], max_bytes=max_body_bytes)
        if len(bodies) == 1:
            bodies = [episode_to_dict(prepared)]  # the single-episode body
        return prepared, [_post_episodes(body, wait) for body in bodies]

    @staticmethod
    def publish(
        episodes: Iterable[Episode | Mapping[str, Any]],
        wait: float | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> tuple[list[Episode], list[Call[IngestResult]]]:
        """The episodes validated, and the requests that publish them (`parts.request_bodies`). Raises
        InvalidEpisode naming every bad field, or the field or action too large for one request."""
        if isinstance(episodes, str | bytes | Mapping | Episode) or not isinstance(episodes, Iterable):
            raise InvalidEpisode([("episodes", "must be a list of episodes")])
        prepared, errors = [], []
        for i, item in enumerate(episodes):
            try:
                prepared.append(finished_episode(item, max_actions=None))
            except InvalidEpisode as exc:  # every bad field of every episode at once, as the service does
                errors += [
                    (f"episodes[{i}].{path}" if path else f"episodes[{i}]", why) for path, why in exc.errors
                ]
        if errors:
            raise InvalidEpisode(errors)
        if not prepared:
            raise InvalidEpisode([("episodes", "must hold at least one episode")])
        first: dict[str, int] = {}
        for i, e in enumerate(prepared):  # the service refuses a repeat too, within one request
            if repeat := repeated_id(first, i, e.episode_id):
                errors.append((f"episodes[{i}].episode_id", f"{repeat}; send one version of an episode"))
        if errors:
            raise InvalidEpisode(errors)
        bodies = request_bodies([episode_to_dict(e) for e in prepared], max_bytes=max_body_bytes)
        return prepared, [_post_episodes(body, wait) for body in bodies]

    @staticmethod
    def list_episodes(**options: Unpack[EpisodeListOptions]) -> Call[EpisodePage]:
        """One page of `GET /v1/episodes` (newest first unless `order="asc"`); see `iter_episodes`."""
        return Call("GET", "/v1/episodes", EpisodePage.from_json, params=_params(_body(options)))

    @staticmethod
    def list_facts(**options: Unpack[FactListOptions]) -> Call[FactPage]:
        """One page of `GET /v1/facts` (newest first unless `order="asc"`; `episode_id`: the facts that
        episode is evidence for)."""
        return Call("GET", "/v1/facts", FactPage.from_json, params=_params(_body(options)))

    @staticmethod
    def get_episode(episode_id: str) -> Call[StoredEpisode]:
        """One projected episode of the caller's namespace; ResourceNotFound (404) otherwise."""
        return Call("GET", f"/v1/episodes/{_path(episode_id, 'episode_id')}", StoredEpisode.from_json)

    @staticmethod
    def update_episode(
        episode_id: str, *, wait: float | None = None, **changes: Unpack[EpisodeChanges]
    ) -> Call[Updated]:
        """Change an episode after the fact (`PATCH /v1/episodes/{id}`): `feedback` merges field by
        field (a reward that arrives later), `metadata` key by key, `outcome`, `outcome_details` and
        `importance` replace. With `wait`, returns once projected (`Updated.projected`). Raises
        InvalidEpisode for bad fields (nothing sent), ResourceNotFound for an id the namespace lacks."""
        # validated here as the service does; a repeat after a lost answer folds the same change again
        body = _body(changes)
        body.update({k: None for k in ("expires_at", "ttl") if k in changes and changes[k] is None})  # clears
        parse_update(body)
        if empty := empty_changes(body):
            raise InvalidEpisode(empty)
        return Call(
            "PATCH",
            f"/v1/episodes/{_path(episode_id, 'episode_id')}",
            Updated.from_json,
            body=body,
            params=_wait(wait),
        )

    @staticmethod
    def forget_episode(episode_id: str, *, wait: float | None = None) -> Call[Forgetting]:
        """Forget one episode (202); ResourceNotFound if the namespace has none. The consolidator erases
        it (normally within milliseconds; a read in that window can still return it); with `wait`
        (seconds, at most 30) the call returns once it has, or at `wait`: `Forgetting.forgotten` says
        which."""
        path = f"/v1/episodes/{_path(episode_id, 'episode_id')}"
        return Call("DELETE", path, Forgetting.from_json, params=_wait(wait))

    @staticmethod
    def forget_user(user_id: str, *, wait: float | None = None) -> Call[Forgetting]:
        """Forget every episode of `user_id` in the caller's namespace (202). The consolidator erases
        them (normally within milliseconds); with `wait` (seconds, at most 30) the call returns once it
        has, or at `wait`: `Forgetting.forgotten` says which."""
        path = f"/v1/users/{_path(user_id, 'user_id')}"
        return Call("DELETE", path, Forgetting.from_json, params=_wait(wait))

    @staticmethod
    def forget_agent(agent_id: str) -> Call[ForgetJob]:
        """Forget every episode of an agent; the job says how many, `forget_job` when it is done."""
        return Call("DELETE", f"/v1/agents/{_path(agent_id, 'agent_id')}", ForgetJob.from_json)

    @staticmethod
    def forget_session(session_id: str) -> Call[ForgetJob]:
        """Forget every episode of a session (as `forget_agent`)."""
        return Call("DELETE", f"/v1/sessions/{_path(session_id, 'session_id')}", ForgetJob.from_json)

    @staticmethod
    def forget_episodes(episode_ids: Iterable[str]) -> Call[ForgetJob]:
        """Forget up to 1,000 episodes by id; ids the namespace lacks come back in `unknown`."""
        body = {"episode_ids": list(episode_ids)}
        return Call("POST", "/v1/forget", ForgetJob.from_json, body=body)

    @staticmethod
    def forget_job(job_id: str) -> Call[ForgetJob]:
        """The status of a bulk forget (`done` once every episode is erased)."""
        return Call("GET", f"/v1/forget/{_path(job_id, 'job_id')}", ForgetJob.from_json)

    @staticmethod
    def ready() -> Call[dict[str, Any]]:
        """`GET /readyz`: `{"status": "ready", "checks": {...}}`; ServiceUnavailable (503) while not ready."""
        return Call("GET", "/readyz", dict)

    @staticmethod
    def summary() -> Call[Summary]:
        """What the namespace holds (`GET /v1/summary`): counts and the episodes expiring soonest."""
        return Call("GET", "/v1/summary", Summary.from_json)

    @staticmethod
    def dead_letters(*, limit: int | None = None) -> Call[DeadLetters]:
        """The namespace's dead letters, oldest first (`limit` 1..1000, default 100), and their `total`."""
        return Call("GET", "/v1/dead-letters", DeadLetters.from_json, params=_params({"limit": limit}))

    @staticmethod
    def redrive_dead_letters(ids: Iterable[str]) -> Call[DeadLettersActed]:
        """Publish the dead letters `ids` (`DeadLetter.id`, 1..1000) again, after a fix, and drop them
        from the dead letters. ResourceNotFound when none is the namespace's."""
        return _act_on_dead_letters("redrive", ids)

    @staticmethod
    def discard_dead_letters(ids: Iterable[str]) -> Call[DeadLettersActed]:
        """Delete the dead letters `ids` and their original events. ResourceNotFound when none is the
        namespace's."""
        return _act_on_dead_letters("discard", ids)


def _act_on_dead_letters(action: str, ids: Iterable[str]) -> Call[DeadLettersActed]:
    """Not repeated after a lost answer: done once, the ids are no dead letters any more and a repeat
    answers 404, not what the first did."""
    body = {"ids": [ids] if isinstance(ids, str) else list(ids)}
    return Call("POST", f"/v1/dead-letters/{action}", DeadLettersActed.from_json, body=body, idempotent=False)
