"""Request bodies are taken as sent: both HTTP servers refuse a `Content-Encoding` other than
`identity` with 415 before any handler reads the body (aiohttp's own decoding, off with
`auto_decompress=False`, failed after the answer, flooding the log); no Engram client compresses.
"""

from __future__ import annotations

import orjson
from aiohttp import hdrs, web

ACCEPTED = frozenset({"", "identity"})
"""The request `Content-Encoding` values taken (absent, empty or `identity`, in any case)."""


@web.middleware
async def identity_only(request: web.Request, handler) -> web.StreamResponse:
    """415 problem+json naming the header (every `Content-Encoding` of the request, joined as RFC 9110
    §5.3 allows), with `Accept-Encoding: identity`, when any coding of it is not one of ACCEPTED;
    otherwise the handler's answer."""
    coding = ", ".join(request.headers.getall(hdrs.CONTENT_ENCODING, []))
    if all(part.strip().lower() in ACCEPTED for part in coding.split(",")):
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
