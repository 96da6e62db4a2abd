"""The route table: the one list of the API, each `Route` with its handler (`services.query.views`),
request models, success status, whether it is public and its documented error statuses.

`make_app` registers it, gives its `public` paths to the auth middleware and hands it to
`services.query.openapi.document` (which documents every field), so the three cannot drift apart (a
test checks the registered routes against the document anyway). Lists are answered under `results`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from aiohttp import web
from pydantic import BaseModel

from services.query import answers, console, models
from services.query.problems import Invalid, Problem, non_utf8_escape, read_json, validate
from services.query.views import (
    deadletters,
    docs,
    episodes,
    facts,
    forgetting,
    insights,
    listing,
    operations,
    recall,
    summary,
    updates,
)
from services.query.views.common import Handler, path_id, query_params


@dataclass(frozen=True, slots=True)
class Status:
    """A documented error answer: an RFC 9457 problem (or, with `problem=False`, a plain body)."""

    code: int
    description: str
    problem: bool = True


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    """One operation of the API, served by `call`: the handler gets each path parameter (a checked id),
    its `query` (the query string, validated by the model it annotates `query` with) and its `body` (the
    JSON body, validated by the model it annotates `body` with, unless `body` here is the JSON schema of
    a body the handler checks itself) as keyword arguments. Its docstring's first paragraph is the
    operation's summary.

    `errors` are completed with the statuses its shape implies (those given replace one of the same code
    in place): a body or query model → 400; a body → 413 and 415; a body, query model or path parameter
    → 422; a path parameter that names something looked up (`lookup`; not the scope of a bulk forget) →
    404; not public → 401; 202 (an event published) → 503 not published; outside `operations` → 503
    (start-up, Redis down; appended to the description of a 503 in `errors`). A JSON route names its
    success body's model (`answer`), any other documented one its OpenAPI response object (`response`),
    so the document has a schema for every answer (a unit test checks each such route gives one)."""

    method: str
    path: str
    handler: Handler
    status: int = 200
    public: bool = False  # no API key needed (services.query.auth); only template-free paths
    tag: str = "memory"
    errors: tuple[Status, ...] = ()  # in the order the document lists them
    response: dict[str, Any] | None = None  # the success response's OpenAPI object, if not a JSON object
    answer: type[BaseModel] | None = None  # the success body's model (services.query.answers), if JSON
    lookup: bool = True
    body: type[BaseModel] | dict[str, Any] | None = None
    query: type[BaseModel] | None = field(default=None, init=False)

    @property
    def summary(self) -> str:
        return " ".join((self.handler.__doc__ or "").strip().split("\n\n")[0].split())

    async def call(self, request: web.Request) -> web.StreamResponse:
        kwargs: dict[str, Any] = {name: path_id(request, name) for name in request.match_info}
        if self.query is not None:
            kwargs["query"] = query_params(request, self.query)
        if self.body is not None:
            body = await read_json(request)
            kwargs["body"] = validate(self.body, body) if isinstance(self.body, type) else body
        return await self.handler(request, **kwargs)

    def __post_init__(self) -> None:
        hints = get_type_hints(self.handler)
        if self.body is None and isinstance(body := hints.get("body"), type) and issubclass(body, BaseModel):
            object.__setattr__(self, "body", body)
        object.__setattr__(self, "query", hints.get("query"))
        implied: list[Status] = []
        if self.body is not None or self.query is not None:  # a long query string: before any handler
            implied.append(MALFORMED)
        if self.body is not None:
            implied += [TOO_LARGE, ENCODED]
        if self.body is not None or self.query is not None or "{" in self.path:
            implied.append(INVALID)
        if "{" in self.path and self.lookup:
            implied.append(NOT_FOUND)
        if not self.public:
            implied.append(UNAUTHORIZED)
        if self.status == 202:  # accepted: an event was published
            implied.append(NOT_PUBLISHED)
        by_code = {s.code: s for s in implied}
        by_code.update((s.code, s) for s in self.errors)
        if self.tag != "operations":
            given = by_code.get(503)
            by_code[503] = Status(
                503, UNAVAILABLE if given is None else f"{given.description}; or {UNAVAILABLE}"
            )
        object.__setattr__(self, "errors", tuple(by_code.values()))


MALFORMED = Status(400, "malformed JSON, or a request line or header longer than the server accepts")
TOO_LARGE = Status(413, "body too large")
ENCODED = Status(415, "a Content-Encoding other than identity: bodies are taken as sent, never decoded")
EMBEDDER_DOWN = Status(503, "the embedder is unavailable (its provider failed or timed out; Retry-After)")
EMBEDDER_CHANGED = Status(
    409,
    "the live index was rebuilt with another embedder under this process (`reindex --embedder`): a search "
    "that needs the query's vector until it is restarted with that one (keyword mode answers without it)",
)
INVALID = Status(422, "invalid fields, each named in `errors`")
NOT_FOUND = Status(404, "not in the caller's namespace")
UNAUTHORIZED = Status(401, "missing or invalid API key")
NOT_PUBLISHED = Status(503, "Redis did not accept the event; nothing was published (Retry-After)")
LAGGING = Status(429, "consumer lag above ENGRAM_MAX_LAG; nothing was published (Retry-After)")
# every route outside `operations` (services.query.startup's gate), and any route that reads Redis while
# it is down (services.query.problems)
UNAVAILABLE = (
    "the service is starting (GET /readyz lists what is pending) or Redis is unavailable (Retry-After)"
)


HTML_PAGE = {
    "description": "an HTML page that loads only this service's own files",
    "content": {"text/html": {"schema": {"type": "string"}}},
}
"""The success response object of `GET /docs` and `GET /console`."""


# `{id:(?s:.*)}`, not `.+`: an empty id (`DELETE /v1/agents/`) reaches its handler, whose 422 names it (with
# `.+` no route matched: a bare 404); `(?s:` so that an id holding a decoded newline (%0A) matches too and
# gets the handler's 422 for control characters, not the router's 404 (`.` stops at a newline)
ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/v1/recall",
        recall.recall,
        errors=(EMBEDDER_CHANGED, EMBEDDER_DOWN),
        answer=answers.RecallAnswer,
    ),
    Route(
        "POST",
        "/v1/episodes",
        episodes.ingest,
        body=models.INGEST_SCHEMA,
        status=202,
        errors=(LAGGING,),
        answer=answers.IngestAnswer,
    ),
    Route(
        "GET",
        "/v1/episodes",
        listing.list_episodes,
        answer=answers.EpisodePage,
    ),
    Route(
        "GET",
        "/v1/episodes/{episode_id:(?s:.*)}",
        episodes.get_episode,
        answer=answers.EpisodeAnswer,
    ),
    Route(
        "PATCH",
        "/v1/episodes/{episode_id:(?s:.*)}",
        updates.update_episode,
        body=models.UPDATE_SCHEMA,
        status=202,
        answer=answers.EpisodeUpdateAccepted,
    ),
    Route(
        "DELETE",
        "/v1/episodes/{episode_id:(?s:.*)}",
        episodes.delete_episode,
        status=202,
        answer=answers.EpisodeForgotten,
    ),
    Route(
        "DELETE",
        "/v1/users/{user_id:(?s:.*)}",
        episodes.delete_user,
        status=202,
        answer=answers.UserForgotten,
        lookup=False,
    ),
    Route(
        "DELETE",
        "/v1/agents/{agent_id:(?s:.*)}",
        forgetting.forget_agent,
        status=202,
        answer=answers.ForgetJobStarted,
        lookup=False,
    ),
    Route(
        "DELETE",
        "/v1/sessions/{session_id:(?s:.*)}",
        forgetting.forget_session,
        status=202,
        answer=answers.ForgetJobStarted,
        lookup=False,
    ),
    Route(
        "POST",
        "/v1/forget",
        forgetting.forget_episodes,
        status=202,
        errors=(Status(404, "none of the ids is in the caller's namespace"),),
        answer=answers.ForgetJobStarted,
    ),
    Route(
        "GET",
        "/v1/forget/{job_id:(?s:.*)}",
        forgetting.forget_job,
        answer=answers.ForgetJob,
    ),
    Route(
        "POST",
        "/v1/context",
        recall.context,
        errors=(EMBEDDER_CHANGED, EMBEDDER_DOWN),
        answer=answers.ContextAnswer,
    ),
    Route(
        "GET",
        "/v1/skills",
        insights.skills,
        answer=answers.SkillsAnswer,
    ),
    Route(
        "POST",
        "/v1/strategy",
        insights.strategy,
        errors=(EMBEDDER_CHANGED, EMBEDDER_DOWN),
        answer=answers.StrategyAnswer,
    ),
    Route(
        "POST",
        "/v1/suggest",
        insights.suggest,
        errors=(EMBEDDER_CHANGED, EMBEDDER_DOWN),
        answer=answers.SuggestAnswer,
    ),
    Route(
        "GET",
        "/v1/learning-curve",
        insights.learning_curve,
        answer=answers.LearningCurveAnswer,
    ),
    Route(
        "GET",
        "/healthz",
        operations.healthz,
        public=True,
        tag="operations",
        answer=answers.Health,
    ),
    Route(
        "GET",
        "/readyz",
        operations.readyz,
        public=True,
        tag="operations",
        errors=(Status(503, "not ready", problem=False),),
        answer=answers.Readiness,
    ),
    Route(
        "GET",
        "/metrics",
        operations.metrics,
        tag="operations",
        response={
            "description": "Prometheus text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        errors=(
            Status(401, "with API keys configured: missing or invalid ENGRAM_METRICS_KEY"),
            Status(403, "a tenant's API key: metrics span every namespace"),
        ),
    ),
    Route(
        "GET",
        "/v1/summary",
        summary.summary,
        answer=answers.Summary,
    ),
    Route(
        "GET",
        "/v1/dead-letters",
        deadletters.list_dead_letters,
        answer=answers.DeadLetterPage,
    ),
    *(
        Route(
            "POST",
            f"/v1/dead-letters/{verb}",
            handler,
            errors=(Status(404, "none of the ids is a dead letter of the caller's namespace"),),
            answer=answers.DeadLettersActed,
        )
        for verb, handler in (
            ("redrive", deadletters.redrive_dead_letters),
            ("discard", deadletters.discard_dead_letters),
        )
    ),
    Route(
        "GET",
        "/openapi.json",
        operations.openapi_json,
        public=True,
        tag="operations",
        answer=answers.OpenAPIDocument,
    ),
    Route(
        "GET",
        "/docs",
        docs.docs_page,
        public=True,
        tag="operations",
        response=HTML_PAGE,
    ),
    Route(
        "GET",
        "/console",
        console.console_page,
        public=True,
        tag="operations",
        response=HTML_PAGE,
    ),
    # the pages' own files: served, but no operations of the API (the document leaves them out)
    *(
        Route("GET", path, handler, public=True, tag="operations")
        for path, handler in (docs.files() | console.files()).items()
    ),
    Route(
        "POST",
        "/v1/facts/search",
        facts.facts_search,
        tag="facts",
        errors=(EMBEDDER_CHANGED, EMBEDDER_DOWN),
        answer=answers.FactsAnswer,
    ),
    Route(
        "GET",
        "/v1/facts",
        listing.list_facts,
        tag="facts",
        answer=answers.FactPage,
    ),
    Route(
        "GET",
        "/v1/facts/{fact_id:(?s:.*)}",
        facts.fact_detail,
        tag="facts",
        answer=answers.FactDetail,
    ),
    Route(
        "POST",
        "/v1/consolidate",
        facts.consolidate,
        tag="facts",
        answer=answers.ConsolidateAnswer,
    ),
)


def url_middleware(routes: tuple[Route, ...] = ROUTES) -> Callable:
    """Middleware of what a URL may be and what the route table says about it, before any handler reads it:

    - a URL whose percent-escapes are not UTF-8 (`problems.non_utf8_escape`) is a 400.
    - a path with a trailing slash that no route of its method matches, where the path without the slash
      is one (`/docs/`, `POST /v1/recall/`), answers 308 to it: 308 keeps the method and the body, and the
      `Location` is relative (`../docs`) so a proxy's path prefix is kept (the docs page's own links are
      relative for the same reason). An id route's empty id (`DELETE /v1/agents/`) is its handler's
      422 naming the id; any other unknown path stays a 404.
    - query parameters sent to an API route that takes none (`DELETE /v1/agents/a?dry_run=1`) are a 422
      naming each, as on every GET route: a call that forgets must not ignore an option it was sent.
      The operations routes keep ignoring them (`/docs?x`, cache-busting `?v=` on its files)."""
    no_query = {(r.method, r.call) for r in routes if r.query is None and r.tag != "operations"}

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        bad = non_utf8_escape(request.raw_path)
        if bad is not None:
            raise Problem(
                400, f"the URL has percent-escapes that are not UTF-8 ({bad}); ids and values are UTF-8"
            )
        info = request.match_info
        if info.http_exception is not None:  # 404 or 405: no route of this method matches the path
            raw = request.raw_path.partition("?")[0]
            if raw.endswith("/") and not raw.endswith("//") and len(raw) > 1:
                found = await request.app.router.resolve(request.clone(rel_url=raw[:-1]))
                if found.http_exception is None:
                    last = raw[:-1].rsplit("/", 1)[1]
                    query = request.raw_path.partition("?")[2]
                    raise web.HTTPPermanentRedirect(f"../{last}" + (f"?{query}" if query else ""))
            return await handler(request)
        if request.query and (request.method, info.handler) in no_query:
            raise Invalid([(key, "is not a known query parameter") for key in dict.fromkeys(request.query)])
        return await handler(request)

    return check
