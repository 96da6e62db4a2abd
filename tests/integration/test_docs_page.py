"""`GET /docs`: an interactive page of the OpenAPI document that works offline: every file it loads is
one of the service's own (no CDN), each is served, and it needs no API key."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

pytest_plugins = ["tests.integration.test_query_support"]


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.refs.append(value)


async def test_docs_page_loads_only_local_files_without_a_key(make_client):
    client = await make_client(api_keys={"docs-key-0000000000000000": "ns-docs"})
    resp = await client.get("/docs")
    assert resp.status == 200 and resp.content_type == "text/html"
    assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
    parser = _Refs()
    parser.feed(await resp.text())
    assert len(parser.refs) >= 3  # the stylesheet, the icon, the two scripts
    for ref in parser.refs:
        parts = urlsplit(ref)
        assert not parts.scheme and not parts.netloc, ref  # no https://cdn..., no //host/...
        path = urljoin("/docs", ref)
        asset = await client.get(path)
        assert asset.status == 200, path
        body = await asset.read()
        assert len(body) > 100, path
        if path.endswith(".js"):
            text = body.decode()
            assert "SwaggerUIBundle" in text, path
    init = await (await client.get("/docs/init.js")).text()
    assert 'url: "openapi.json"' in init  # relative to /docs: the service's own document
    doc = await client.get(urljoin("/docs", "openapi.json"))
    assert doc.status == 200 and (await doc.json())["openapi"].startswith("3.1")


async def test_the_bundled_swagger_ui_reads_openapi_3_1(api):
    bundle = await (await api.get("/docs/swagger-ui-bundle.js")).text()
    assert "isOAS31" in bundle  # Swagger UI 4 (swagger-ui-bundle) refuses `openapi: 3.1.0`


async def test_docs_with_a_trailing_slash_redirects_to_the_page(make_client):
    """`/docs/` is not a 404. Served there, the page's relative links would name
    `/docs/docs/...`: a redirect to `/docs` keeps them right, relative so a proxy's prefix stays."""
    client = await make_client(api_keys={"docs-key-0000000000000000": "ns-docs"})
    resp = await client.get("/docs/", allow_redirects=False)
    assert resp.status == 308 and resp.headers["Location"] == "../docs"
    page = await client.get("/docs/")  # followed, without a key: the page is public
    assert page.status == 200 and page.url.path == "/docs" and page.content_type == "text/html"
