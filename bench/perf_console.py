"""`make bench`'s console measure: the recall playground (`/console#/recall`) in headless Chromium
against the `POST /v1/recall` it shows, on the recall phase's namespace at its largest size (100,000
episodes by default) and the same query service.

Per query (distinct LoCoMo questions, each embedded live: the service's query cache is off): one
`POST /v1/recall` alone (`{query, top_k}`, timed by the client), then the playground asked the same
query, timed by the page itself from its first request to its hits rendered (`data-ms` of the results:
that is the recall, the `/v1/context` beside it, and drawing the bars). Reported: p50 of each, their
ratio, and the difference the console adds (the target: at most 100 ms).

Needs Debian's /usr/bin/chromium (`apt-get install chromium`); without it the measure says so and is
skipped. Playwright drives it; it never downloads a browser.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

CHROMIUM = Path("/usr/bin/chromium")
# set the fragment, then wait for the results of that query (the previous query's stay until replaced)
_ASK = """async ([fragment, query]) => {
  location.hash = fragment;
  for (;;) {
    const out = document.querySelector("section.results[data-ms]");
    const asked = document.querySelector('input[name="query"]');
    if (out && asked && asked.value === query) return Number(out.dataset.ms);
    const error = document.querySelector("main .error");
    if (error) throw new Error(error.textContent);
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
}"""


def _p50(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def playground_vs_api(base_url: str, queries: list[str], top_k: int) -> dict[str, Any]:
    """`{requests, api_p50_ms, playground_p50_ms, ratio, added_ms}` over `queries` (each asked once of
    each), or `{skipped: why}` without the system's Chromium."""
    if not CHROMIUM.exists():
        return {"skipped": f"no {CHROMIUM} (apt-get install chromium)"}
    import httpx
    from playwright.async_api import async_playwright

    api_ms: list[float] = []
    page_ms: list[float] = []
    async with async_playwright() as p, httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM))
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{base_url}/console#/recall")
            await page.wait_for_selector('main[aria-busy="false"]')
            for query in dict.fromkeys(queries):  # distinct: the page waits for its own query's hits
                started = time.perf_counter()
                resp = await http.post("/v1/recall", json={"query": query, "top_k": top_k})
                resp.raise_for_status()
                api_ms.append((time.perf_counter() - started) * 1000.0)
                fragment = "#/recall?" + urlencode({"query": query, "top_k": top_k, "A.weights": "preset"})
                page_ms.append(float(await page.evaluate(_ASK, [fragment, query])))
        finally:
            await browser.close()
    api, shown = _p50(api_ms), _p50(page_ms)
    return {
        "requests": len(api_ms),
        "api_p50_ms": api,
        "playground_p50_ms": shown,
        "ratio": shown / api if api > 0 else float("nan"),
        "added_ms": shown - api,
    }


def render_console(res: dict[str, Any]) -> str:
    """The measure's line (Markdown), or why it was skipped."""
    if "skipped" in res:
        return f"\n\nRecall playground: skipped ({res['skipped']})."
    return (
        f"\n\nRecall playground at {res['size']:,} episodes ({res['requests']} queries): p50 "
        f"{res['playground_p50_ms']:.0f} ms from its first request to its hits drawn vs {res['api_p50_ms']:.0f} ms "
        f"for the `POST /v1/recall` alone: ×{res['ratio']:.2f}, {res['added_ms']:+.0f} ms (target ≤ +100 ms)."
    )
