"""RFC 9457 problem details: every error the API returns, mapped in one place.

Views raise domain errors (`engram_episodic.errors`), `Invalid` (a 422 with `errors: [{field, reason}]`) or
aiohttp's HTTP exceptions; `problems_middleware` turns each into `application/problem+json`. Anything
else is logged with its traceback and answered with a 500 problem: the service keeps running and the
client never sees internals.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Iterable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from pydantic import BaseModel, ValidationError
from redis.exceptions import ResponseError

from engram_episodic.errors import Backpressure, ConfigError, Conflict, InvalidEpisode, NotFound, PublishError
from engram_episodic.validation import json_kind, json_problem
from shared.embedding import EmbeddingError
from shared.index import SEARCH_TIMEOUT
from shared.retry import REDIS_FAULTS

log = logging.getLogger("engram.query")

PROBLEM_TYPE = "application/problem+json"
_TITLES = {
    400: "Malformed request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    408: "Request timeout",
    409: "Conflict",
    413: "Request body too large",
    415: "Unsupported media type",
    422: "Invalid request",
    429: "Too many requests",
    500: "Internal server error",
    503: "Service unavailable",
}


class Invalid(Exception):
    """A 422: the request is well-formed JSON but violates the API's rules."""

    def __init__(self, errors: Iterable[tuple[str, str]]):
        self.errors = [(f or "<root>", r) for f, r in errors]
        super().__init__("; ".join(f"{f}: {r}" for f, r in self.errors))


MAX_BODY_BYTES = web.AppKey("max_body_bytes", int)
"""The largest request body (`ENGRAM_MAX_BODY_BYTES`; set by make_app): a 413 says it, so that a client
can split what it sends by it (`engram_episodic.parts`)."""
EMBEDDER_RETRY_AFTER = 5
"""Seconds a 503 for a failed embedder asks the client to wait: the embedder already retried (the
`openai` one for seconds, `shared.embedding_openai`), so the provider is not back within Redis's 1 s."""
BODY_TIMEOUT = web.AppKey("body_timeout", float)
"""Seconds `read_json` waits for a body once its headers arrived (`Settings.body_timeout`; set by make_app)."""


class Problem(Exception):
    """Any other problem with a status and a detail (401, 404, 503, ...)."""

    def __init__(self, status: int, detail: str, *, headers: dict[str, str] | None = None, **extra: Any):
        self.status, self.detail, self.headers, self.extra = status, detail, headers, extra
        super().__init__(detail)


def route_of(request: web.Request, unmatched: str = "<no route>") -> str:
    """The request's route template (`/v1/users/{user_id}`), for logs, metrics and spans: ids live in
    paths (a user id may be an e-mail address), so the path itself is never written out."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else unmatched


def problem(
    status: int,
    detail: str | None = None,
    *,
    errors: list[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    body: dict[str, Any] = {"type": "about:blank", "title": _TITLES.get(status, "Error"), "status": status}
    if detail:
        body["detail"] = detail
    if errors is not None:
        body["errors"] = [{"field": f, "reason": r} for f, r in errors]
    body.update(extra)
    return web.Response(
        status=status, text=json.dumps(body, ensure_ascii=False), content_type=PROBLEM_TYPE, headers=headers
    )


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else (f"{out}.{part}" if out else str(part))
    return out


_EXPECTED = {
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a JSON object",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
}
"""pydantic's type errors by `type`, said as Engram says them (`validation.json_kind` for the value)."""
_SIZES = {
    "too_short": "must hold at least {min_length} item(s), not {actual_length}",
    "too_long": "must hold at most {max_length} items, not {actual_length}",
    "string_too_short": "must be at least {min_length} character(s)",
    "string_too_long": "must be at most {max_length} characters",
}
"""pydantic's length errors ("List should have at least 1 item after validation, not 0")."""


def pydantic_errors(exc: ValidationError, unknown: str = "field") -> list[tuple[str, str]]:
    """(field, reason) pairs: `reward.gt: is not a known field` (`unknown` names what an extra one is not),
    `top_k: must be an integer between ...`."""
    out = []
    for err in exc.errors(include_url=False):
        field = _loc(tuple(err.get("loc", ())))
        reason = str(err.get("msg", "is invalid"))
        if err.get("type") == "extra_forbidden":
            reason = f"is not a known {unknown}"
        elif err.get("type") == "missing":
            reason = "is required"
        elif err.get("type") == "model_type":  # "a valid dictionary or instance of NumRange": no class names
            reason = "must be a JSON object"
        elif err.get("type") in _EXPECTED:  # a wrong type: what it must be, and what it was, in JSON's words
            reason = f"must be {_EXPECTED[err['type']]}, not {json_kind(err.get('input'))}"
        elif err.get("type") == "literal_error":
            reason = f"must be one of {(err.get('ctx') or {}).get('expected', 'the listed values')}"
        elif err.get("type") in _SIZES:
            reason = _SIZES[err["type"]].format(**(err.get("ctx") or {}))
        reason = reason.removeprefix("Value error, ")
        if reason.startswith("Input should be "):  # pydantic's voice for the rest of its built-in checks
            reason = "must be " + reason.removeprefix("Input should be ")
        head, sep, tail = reason.partition(": ")
        if sep and head.isidentifier():  # model-level validators name their field as "field: reason"
            field = f"{field}.{head}" if field else head
            reason = tail
        out.append((field or "<root>", reason))
    return out


def validate(model: type[BaseModel], data: Any, strict: bool | None = None, unknown: str = "field"):
    """Validate `data` against `model`, raising Invalid (422) naming each bad field (an extra one "is not
    a known `unknown`"); `strict=False` for query parameters (strings that spell a number or a boolean)."""
    if not isinstance(data, dict):
        raise Invalid([("<root>", "must be a JSON object")])
    try:
        return model.model_validate(data, strict=strict)
    except ValidationError as exc:
        raise Invalid(pydantic_errors(exc, unknown)) from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: web.Request) -> Any:
    """The body as JSON: 413 over the size limit (client_max_size), 400 when it is not JSON."""
    timeout = request.app[BODY_TIMEOUT]
    try:
        async with asyncio.timeout(timeout):  # a body trickled or never finished holds no connection for ever
            raw = await request.read()  # raises HTTPRequestEntityTooLarge past client_max_size
    except (RequestPayloadError, HttpProcessingError) as exc:  # e.g. broken chunked framing
        raise Problem(400, f"the request body cannot be read: {exc}") from None
    except TimeoutError:
        raise Problem(
            408, f"the request body did not arrive within {timeout:g} s", headers={"Connection": "close"}
        ) from None
    except ConnectionResetError:  # the client went away mid-body: its fault, not a server error
        log.info("client closed the connection mid-body ◆ %s %s", request.method, route_of(request))
        raise Problem(
            400, "the request body ended early: the connection was closed", headers={"Connection": "close"}
        ) from None
    if not raw.strip():
        raise Problem(400, "the request body is empty; send a JSON object")
    body = _parse(raw)
    # text that is not valid Unicode (a lone "\ud800"), numbers no store can hold, absurd nesting:
    # rejected here, once, for every route, naming where they are
    problem = json_problem(body, max_depth=64)
    if problem is not None:
        raise Invalid([(problem[0] or "<body>", problem[1])])
    return body


# orjson turns an integer beyond 64 bits (and one below -2**63, 19 digits) into a float, which would
# hide it from json_problem's range check: a body with a run of 19+ digits takes the stdlib's path, which
# keeps it an int (the run is found by mapping digits to "0" and searching, ~25x faster than a regex over
# a 600 KB body). So does a body orjson refuses: the stdlib names the problem as before (a lone surrogate
# stays a 422 naming its field; NaN, 1e400, thousands of digits and deep nesting keep their messages).
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * 19


def _parse(raw: bytes) -> Any:
    """The JSON value of a request body, as the stdlib reads it; Problem 400 when it is not JSON.

    orjson when its reading is the stdlib's: 50 episodes with 768-dim vectors (780 KB) 14.5 → 2.5 ms,
    50 small episodes 0.032 → 0.018 ms, 50 text-heavy ones (610 KB) 2.7 → 2.6 ms."""
    if raw.translate(_DIGITS_AS_ZERO).find(_LONG_RUN) < 0:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise Problem(400, "the request body is not UTF-8") from None
    except RecursionError:
        raise Problem(400, "the request body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        if "digits" in str(exc):  # int() refuses numbers with thousands of digits
            raise Problem(400, "the request body has a number with too many digits") from None
        raise Problem(400, f"the request body is not valid JSON: {str(exc)[:200]}") from None


def _outage(request: web.Request, exc: Exception) -> web.Response | None:
    """The 503 of a dependency that failed (Redis, a search past its timeout, the embedder, the event
    stream, the deployment's configuration), logged as one line without a traceback; None for any other
    exception."""
    if isinstance(exc, ResponseError) and SEARCH_TIMEOUT in str(exc):
        # ON_TIMEOUT FAIL (shared.index.check_on_timeout): an error, never a part of the results
        log.warning("search timeout ◆ %s %s", request.method, route_of(request))
        return problem(
            503,
            "a search ran past RediSearch's TIMEOUT (the store is busy, or the scope is very large); "
            "retry later, or narrow the scope",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, REDIS_FAULTS):  # an outage (a cluster's too), not a bug: no traceback
        log.warning("redis unavailable ◆ %s %s ◆ %s", request.method, route_of(request), type(exc).__name__)
        return problem(503, "the memory store is unavailable; retry later", headers={"Retry-After": "1"})
    if isinstance(exc, ConfigError):  # the deployment's, not the request's: how to fix it is in the log
        log.error("misconfigured ◆ %s %s ◆ %s", request.method, route_of(request), exc)
        return problem(
            503, "the service is misconfigured; its log says how to fix it", headers={"Retry-After": "5"}
        )
    if isinstance(exc, EmbeddingError):  # the provider down, slow or refusing, a model raising: no traceback
        log.warning("embedder unavailable ◆ %s %s ◆ %s", request.method, route_of(request), str(exc)[:300])
        return problem(
            503,
            "the embedding model is unavailable (its provider failed or timed out); retry later",
            headers={"Retry-After": str(EMBEDDER_RETRY_AFTER)},
        )
    if isinstance(exc, PublishError):
        log.warning("publish failed ◆ %s", exc)
        return problem(
            503, "the event stream did not accept the request; retry later", headers={"Retry-After": "1"}
        )
    return None


def _to_problem(request: web.Request, exc: Exception) -> web.StreamResponse:
    if isinstance(exc, Invalid | InvalidEpisode):
        return problem(422, "the request has invalid fields", errors=exc.errors)
    if isinstance(exc, Problem):
        return problem(exc.status, exc.detail, headers=exc.headers, **exc.extra)
    if isinstance(exc, NotFound):
        return problem(404, str(exc) or "not found")
    if isinstance(exc, Conflict):
        return problem(409, str(exc))
    if isinstance(exc, Backpressure):  # before PublishError, its base class: nothing was published
        return problem(
            429,
            f"the consolidator is {exc.lag} entries behind (limit {exc.max_lag}); "
            f"nothing was published, retry later",
            headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))},
            lag=exc.lag,
            max_lag=exc.max_lag,
        )
    outage = _outage(request, exc)
    if outage is not None:
        return outage
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = request.app.get(MAX_BODY_BYTES)
        if not limit:
            return problem(413, exc.text or "the request body is too large")
        return problem(
            413,
            f"the request body is larger than this service takes ({limit:,} bytes: ENGRAM_MAX_BODY_BYTES)",
            max_body_bytes=limit,
        )
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        return problem(
            exc.status,
            exc.reason,
            headers={k: v for k, v in exc.headers.items() if k.lower() in ("allow", "www-authenticate")},
        )
    log.error("unhandled error ◆ %s %s", request.method, route_of(request), exc_info=exc)
    return problem(500, "an unexpected error occurred; it was logged")


@web.middleware
async def problems_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:
        if isinstance(exc, web.HTTPException) and exc.status < 400:
            raise  # a redirect is an answer, not a problem
        try:
            return _to_problem(request, exc)
        except Exception:  # a fault while mapping must still not crash the request
            log.exception("error while mapping an error ◆ %s %s", request.method, request.path)
            return problem(500, "an unexpected error occurred; it was logged")


_ESCAPES = re.compile(r"(?:%[0-9A-Fa-f]{2})+")


def non_utf8_escape(raw: str) -> str | None:
    """The first run of percent-escapes in a raw URL (path and query) that is not UTF-8, or None.

    aiohttp leaves such a run undecoded in a path (`%FF` stays the three characters, so `/x/%FF` and
    `/x/%25FF` would name one id) and replaces it with U+FFFD in a query value (so `%FF` and `%FE` would
    name one id): two byte strings on one id either way, hence refused."""
    for run in _ESCAPES.finditer(raw):
        try:
            bytes.fromhex(run.group(0).replace("%", "")).decode("utf-8")
        except UnicodeDecodeError:
            return run.group(0)[:24]
    return None
