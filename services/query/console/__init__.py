"""`GET /console`: a browser console of this API (overview, episodes, recall playground, learning,
facts, operations), served by the query service itself so `make run` shows it with nothing else installed.

The console is a client of the public HTTP API only: its script sends the API key the user types as the
`Authorization` header of its own `fetch` calls, never in a URL, a cookie or a log line. The page and
its files (`static/`, no build step, no CDN) are public; every datum still needs the key. Each file is
served under a name holding a digest of its content with a one-year `immutable` Cache-Control, so a
browser never mixes an older release's file with a newer page; the Content-Security-Policy lets the
page load nothing but these files.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from aiohttp import web

from services.query.views.common import Handler, file_handler

STATIC = Path(__file__).resolve().parent / "static"
TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
# own files only; `data:` for the icon; the script sets inline styles through the CSSOM (bar widths)
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
IMMUTABLE = "public, max-age=31536000, immutable"


@functools.cache
def assets() -> dict[str, tuple[bytes, str]]:
    """Every file of `static/` but the page: `{hashed name: (body, content type)}`, read once.

    The hashed name is `<stem>.<first 10 hex digits of the body's SHA-256><suffix>`."""
    out: dict[str, tuple[bytes, str]] = {}
    for path in sorted(STATIC.iterdir()):
        if path.suffix in TYPES:
            body = path.read_bytes()
            digest = hashlib.sha256(body).hexdigest()[:10]
            out[f"{path.stem}.{digest}{path.suffix}"] = (body, TYPES[path.suffix])
    return out


@functools.cache
def page() -> str:
    """`index.html` with each `{name}` placeholder (`{app.js}`) replaced by its hashed path, relative to
    `/console` so the page also works behind a proxy that mounts the service under a prefix."""
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    for hashed in assets():
        stem, _, rest = hashed.partition(".")
        html = html.replace("{" + stem + "." + rest.partition(".")[2] + "}", f"console/{hashed}")
    return html


async def console_page(request: web.Request) -> web.Response:
    """A browser console of this API: overview, episodes, recall playground, facts (served offline)"""
    return web.Response(
        text=page(),
        content_type="text/html",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )


def files() -> dict[str, Handler]:
    """`/console/<hashed name>` → its handler, the file cached for a year: its name changes with it."""
    return {
        f"/console/{name}": file_handler(body, content_type, IMMUTABLE)
        for name, (body, content_type) in assets().items()
    }
