"""`GET /docs`: an interactive page of `/openapi.json` (Swagger UI 5, which reads OpenAPI 3.1), served
from the `swagger-ui-py` package's files: the page references only this service's own paths, so it
works offline and behind a firewall. (`swagger-ui-bundle` ships Swagger UI 4.15, which refuses an
OpenAPI 3.1 document: "Supported version fields are ... openapi: 3.0.n".)

The package is located without importing it (its `__init__` imports its framework handlers and
jinja2); the few files the page needs are read once and kept.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from aiohttp import web

from services.query.problems import Problem
from services.query.views.common import Handler, file_handler

ASSETS = {  # the swagger-ui-py files the page loads (its `static/`) → content type
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "application/javascript",
    "favicon-32x32.png": "image/png",
}
INIT_JS = """window.onload = function () {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    persistAuthorization: false,
    tryItOutEnabled: false,
  });
};
"""
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Engram query service · API</title>
  <link rel="stylesheet" href="docs/swagger-ui.css">
  <link rel="icon" type="image/png" href="docs/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="docs/swagger-ui-bundle.js"></script>
  <script src="docs/init.js"></script>
</body>
</html>
"""
# the page may load nothing but this service's own files (Swagger UI sets inline styles; its logo is data:)
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; frame-ancestors 'none'"
)
_CACHE = "public, max-age=86400"


@functools.cache
def _asset(name: str) -> bytes:
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise Problem(503, "the docs page needs the swagger-ui-py package (pip install swagger-ui-py)")
    return (Path(next(iter(spec.submodule_search_locations))) / "static" / name).read_bytes()


async def docs_page(request: web.Request) -> web.Response:
    """An interactive page of this document (Swagger UI, served offline)"""
    # relative asset paths: the page also works behind a proxy that mounts the service under a prefix
    return web.Response(text=PAGE, content_type="text/html", headers={"Content-Security-Policy": CSP})


def files() -> dict[str, Handler]:
    """`/docs/<name>` → its handler: the page's script, and the swagger-ui-py files it loads (a 503 without
    the package), each cached for a day."""
    out = {"/docs/init.js": file_handler(INIT_JS.encode, "application/javascript; charset=utf-8", _CACHE)}
    for name, content_type in ASSETS.items():
        out[f"/docs/{name}"] = file_handler(functools.partial(_asset, name), content_type, _CACHE)
    return out
