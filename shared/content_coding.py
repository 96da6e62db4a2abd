"""Request bodies are taken as sent: both HTTP servers (the query API, the consolidator's operations
port) refuse a `Content-Encoding` other than `identity` with 415, before any handler reads the body.

Why: aiohttp decodes a gzip / deflate / br body itself, while parsing. A body that was not what its
header said failed there, and the failure surfaced after the handler had answered, when the connection
drained the unread body: the usual answer went out, then a 28-line ERROR traceback ("Unhandled
exception") was logged, on every route, `/healthz` included, an unauthenticated way to flood the logs.
So both servers run with aiohttp's `auto_decompress=False` (the parser never decodes; the unread body is
drained as plain bytes), and `identity_only` answers the refusal. No client of Engram compresses its
requests, so nothing is lost by not decoding.
"""

from __future__ import annotations

import orjson
from aiohttp import hdrs, web

ACCEPTED = frozenset({"", "identity"})
"""The request `Content-Encoding` values taken (absent, empty or `identity`, in any case)."""


def refused_coding(request: web.BaseRequest) -> str | None:
    """The request's `Content-Encoding` (every header of that name, joined as RFC 9110 §5.3 allows) when
    any coding of it is not one of ACCEPTED, else None."""
    values = request.headers.getall(hdrs.CONTENT_ENCODING, [])
    value = ", ".join(values)
    if all(coding.strip().lower() in ACCEPTED for coding in value.split(",")):
        return None
    return value


@web.middleware
async def identity_only(request: web.Request, handler) -> web.StreamResponse:
    """415 problem+json naming the header, with `Accept-Encoding: identity` (RFC 9110 §15.5.16), for a
    request whose Content-Encoding is refused (`refused_coding`); otherwise the handler's answer. Logs
    nothing of its own: the access log's line for the 415 is the one line."""
    coding = refused_coding(request)
    if coding is None:
        return await handler(request)
    body = {
        "type": "about:blank",
        "title": "Unsupported media type",
        "status": 415,
        "detail": f"Content-Encoding {coding[:40]!r} is not accepted: send the body uncompressed, "
        "without a Content-Encoding header (or with `identity`)",
    }
    return web.Response(
        status=415,
        body=orjson.dumps(body),
        content_type="application/problem+json",
        headers={hdrs.ACCEPT_ENCODING: "identity"},
    )
