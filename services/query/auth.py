"""API keys → namespace. The namespace of a request comes from its key, never from its body (C03).

With `settings.api_keys` empty the service is single-tenant (dev mode): every request gets
`settings.default_namespace`, and `__main__` refuses to bind to a non-loopback address. Keys are compared
in constant time and never logged.
"""

from __future__ import annotations

import hmac
import ipaddress

from aiohttp import web

from services.query.problems import Problem

NAMESPACE = web.RequestKey("namespace", str)  # request[NAMESPACE]: the caller's namespace
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})


def namespace_for(api_keys: dict[str, str], header: str | None) -> str | None:
    """The namespace of the Bearer key in `header`, or None for a missing, malformed or unknown key."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    found = None
    for key, namespace in api_keys.items():  # no early exit: constant time over the key set
        if hmac.compare_digest(key.encode(), token.encode()):
            found = namespace
    return found


def auth_middleware(api_keys: dict[str, str], default_namespace: str):
    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS:
            return await handler(request)
        if not api_keys:
            request[NAMESPACE] = default_namespace
            return await handler(request)
        namespace = namespace_for(api_keys, request.headers.get("Authorization"))
        if namespace is None:
            detail = ("missing API key: send 'Authorization: Bearer <key>'"
                      if "Authorization" not in request.headers else "invalid API key")
            raise Problem(401, detail, headers={"WWW-Authenticate": 'Bearer realm="engram"'})
        request[NAMESPACE] = namespace
        return await handler(request)
    return middleware


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_keys: dict[str, str]) -> None:
    """Raise ValueError when dev mode (no keys) would listen beyond this machine."""
    if not api_keys and not is_loopback(host):
        raise ValueError(f"ENGRAM_HOST={host!r} is not a loopback address and no API keys are configured; "
                         f"set ENGRAM_API_KEYS (key=namespace,...) or ENGRAM_API_KEYS_FILE, "
                         f"or bind to 127.0.0.1")
