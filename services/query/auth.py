"""API keys → namespace. The namespace of a request comes from its key, never from its body: a body cannot choose another tenant.

With `settings.api_keys` empty the service is single-tenant (dev mode): every request gets
`settings.default_namespace`, and `__main__` refuses to bind to a non-loopback address. Keys are compared
in constant time and never logged.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from engram_episodic.validation import is_loopback
from services.query.appkeys import NAMESPACE
from services.query.problems import Problem
from shared import cluster

METRICS_PATH = "/metrics"  # every namespace's traffic: with API keys, only ENGRAM_METRICS_KEY reads it


# RFC 9110 §11.4: `credentials = auth-scheme [ 1*SP token68 ]`, the scheme case-insensitive; tabs are
# tolerated as aiohttp's parser does for OWS. Only these ASCII blanks separate or pad: `str.split()` and
# `strip()` would also eat U+00A0 or U+2003, and a key padded with them must not match.
_BLANKS = " \t"


def namespace_for(api_keys: dict[str, str], header: str | None) -> str | None:
    """The namespace of the Bearer key in `header`, or None for a missing, malformed or unknown key.

    The token is compared byte for byte with each configured key: a header byte that is not UTF-8
    (aiohttp hands it over as a lone surrogate) simply does not match.
    """
    if not header or not header[:6].isascii() or header[:6].lower() != "bearer":
        return None
    rest = header[6:]
    token = rest.lstrip(_BLANKS)
    if token == rest:  # no separator ("Bearerkey", "Bearer\u2003key")
        return None
    token = token.rstrip(_BLANKS)
    if not token:
        return None
    # surrogateescape gives back the bytes as they came off the wire (b"key\xa0" from "key\udca0"); a plain
    # encode() raised UnicodeEncodeError there: a 500 with a traceback for any unauthenticated caller
    raw = token.encode("utf-8", "surrogateescape")
    namespace = None
    for key, ns in api_keys.items():  # no early exit: constant time over the key set
        if hmac.compare_digest(key.encode("utf-8", "surrogateescape"), raw):
            namespace = ns
    return namespace


def auth_middleware(
    api_keys: dict[str, str],
    default_namespace: str,
    metrics_key: str | None = None,
    *,
    public: frozenset[str],
):
    """Sets request[NAMESPACE] from the Bearer key (401 without a known one), or the default namespace
    in dev mode; a request whose path is one of `public` (the fixed paths of the public routes) passes
    without either, whatever its method (a wrong one still answers 405 without a key). With API keys,
    `/metrics` takes `metrics_key` only: its totals span every namespace."""

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        if request.path in public:
            return await handler(request)
        if not api_keys:
            request[NAMESPACE] = default_namespace
            cluster.set_route(default_namespace)  # a cluster's search commands go to its primary
            return await handler(request)
        headers = request.headers.getall("Authorization", [])
        if len(headers) > 1:  # which credential is meant is the client's to say, never a pick
            raise Problem(400, "send one Authorization header, not several")
        header = headers[0] if headers else None
        if request.path == METRICS_PATH:
            if metrics_key is not None and namespace_for({metrics_key: ""}, header) is not None:
                return await handler(request)
            if namespace_for(api_keys, header) is not None:
                raise Problem(
                    403,
                    "an API key does not read /metrics (its totals span every namespace); "
                    "scrape it with ENGRAM_METRICS_KEY",
                )
        namespace = namespace_for(api_keys, header)
        if namespace is None:
            detail = (
                "missing API key: send 'Authorization: Bearer <key>'"
                if "Authorization" not in request.headers
                else "invalid API key"
            )
            raise Problem(401, detail, headers={"WWW-Authenticate": 'Bearer realm="engram"'})
        request[NAMESPACE] = namespace
        cluster.set_route(namespace)
        return await handler(request)

    return middleware


def check_bind(host: str, api_keys: dict[str, str]) -> None:
    """Raise ValueError when dev mode (no keys) would listen beyond this machine, or for a bracketed
    address (a URL's form: the socket cannot bind it)."""
    if host.startswith("["):
        raise ValueError(f"ENGRAM_HOST={host!r}: give the address without brackets ({host.strip('[]')})")
    if not api_keys and not is_loopback(host):
        raise ValueError(
            f"ENGRAM_HOST={host!r} is not a loopback address and no API keys are configured; "
            f"set ENGRAM_API_KEYS (key=namespace,...) or ENGRAM_API_KEYS_FILE, "
            f"or bind to 127.0.0.1"
        )
