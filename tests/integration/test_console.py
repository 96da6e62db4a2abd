"""`GET /console` in a real browser (Debian's headless Chromium driven by Playwright) against the query
service and a consolidator: every view loads with no console error and no failed request, what the page
changes is what the API then answers, the playground shows the API's ranking and components, and a key
only opens its own namespace. Screenshots of each view at 1280×800 go to docs/img/ (docs/console.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright

from engram_episodic import AsyncEngram
from tests.helpers import wait_until
from tests.integration.test_query_e2e import consolidating, drain
from tests.integration.test_query_support import KEY_A, KEY_B, auth

pytest_plugins = ["tests.integration.test_query_support"]

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The system's Chromium: installed from Debian's package when missing and we are root (never a
    browser downloaded by Playwright); the tests skip on a machine where neither is possible."""
    if not CHROMIUM.exists() and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
            check=False,
            capture_output=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    return CHROMIUM


class Watched:
    """A page with every console error, uncaught exception, failed request and 4xx/5xx answer noted."""

    def __init__(self, page: Page, base: str) -> None:
        self.page, self.base, self.problems = page, base, []
        page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"exception: {e}"))
        page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url} {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and self.problems.append(f"{r.status}: {r.url}"))

    async def view(self, fragment: str) -> None:
        """Show `#/<fragment>` and wait until the view has rendered its answers."""
        if self.page.url.startswith(f"{self.base}/console"):
            await self.page.evaluate("f => { location.hash = f }", f"#/{fragment}")
        else:
            await self.page.goto(f"{self.base}/console#/{fragment}")
        await self.page.wait_for_selector('main[aria-busy="false"]')

    async def unlabelled(self) -> list[str]:
        """The form controls of the view that no label names (each needs one for a screen reader)."""
        return await self.page.eval_on_selector_all(
            "main input, main select, main textarea",
            "els => els.filter(e => e.type !== 'hidden' && !e.labels.length && !e.getAttribute('aria-label'))"
            ".map(e => e.name || e.outerHTML)",
        )

    async def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        await self.page.screenshot(path=str(SHOTS / f"console-{name}.png"), full_page=True)


@pytest.fixture
async def browser(chromium):
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=str(chromium))
        yield b
        await b.close()


async def opened(browser, base: str, key: str | None, **options: Any) -> Watched:
    """A 1280×800 page (or as `options` say) whose tab remembers `key` (as the key form's "remember"
    box would)."""
    options = {"viewport": {"width": 1280, "height": 800}, **options}
    context = await browser.new_context(accept_downloads=True, **options)
    if key is not None:
        await context.add_init_script(f"sessionStorage.setItem('engram.console.key', {json.dumps(key)})")
    return Watched(await context.new_page(), base)


EPISODES = [
    {"task": "fix the flaky login test", "outcome": "success", "solution": "freeze the clock", "reward": 0.9},
    {"task": "fix the login redirect loop", "outcome": "failure", "solution": "retry", "reward": 0.1},
    {
        "task": "speed up the login page",
        "outcome": "success",
        "solution": "cache the session",
        "reward": 0.7,
        "category": "performance",
    },
] + [  # a cluster the consolidator distils into facts
    {
        "task": f"fix the flaky checkout test {n}",
        "outcome": "success" if n % 4 else "failure",
        "solution": "freeze the clock",
        "reward": 0.8 if n % 4 else 0.2,
        "strategy": "freeze_clock",
    }
    for n in range(6)
]


async def record_all(base: str) -> list[str]:
    async with AsyncEngram(base, api_key=KEY_A) as memory:
        return [
            await memory.record(
                task={"description": e["task"], "category": e.get("category", "debugging")},
                outcome=e["outcome"],
                solution=e["solution"],
                feedback={"reward": e["reward"]},
                strategy_used=e.get("strategy", f"s{i}"),
                agent_id="coder-1",
                user_id=f"user-{i % 3}",
                session_id=f"session-{i // 3}",
                **({"ttl": "30d"} if i == 2 else {}),
                actions=[{"action_type": "run_tests", "success": e["outcome"] == "success"}],
                wait=10,
            )
            for i, e in enumerate(EPISODES)
        ]


async def shown_ids(page: Page, selector: str) -> list[str]:
    return await page.eval_on_selector_all(selector, "els => els.map(e => e.dataset.episode)")


async def test_every_view_loads_and_what_the_page_changes_the_api_answers(browser, tenants, settings, redis):
    base = str(tenants.server.make_url("")).rstrip("/")
    async with consolidating(settings, redis):
        ids = await record_all(base)
        made = await tenants.post("/v1/consolidate", json={}, headers=auth(KEY_A))
        assert made.status == 200, await made.text()
        w = await opened(browser, base, KEY_A)
        await w.view("overview")
        stats = dict(
            zip(
                await w.page.locator(".stat dt").all_inner_texts(),
                await w.page.locator(".stat dd").all_inner_texts(),
                strict=True,
            )
        )
        assert (stats["Episodes"], stats["Agents"], stats["Users"], stats["Sessions"]) == ("9", "1", "3", "3")
        assert stats["Success rate"] == "67 %"
        assert await w.page.locator("main ul li a[href^='#/episode/']").count() == 1  # the one expiring
        assert int(stats["Facts"]) >= 1  # the consolidation above distilled some
        for view in ("overview", "episodes", "learning?task=fix+the+login+test", "facts", "operations"):
            await w.view(view)
            assert await w.page.inner_text("main h1"), view
            assert await w.unlabelled() == [], view
            if view.startswith("learning"):  # a curve per category, the two of this namespace
                assert await w.page.locator(".small-multiples figure").count() == 2
            await w.shot(view.partition("?")[0])
        phone = await opened(
            browser, base, KEY_A, viewport={"width": 390, "height": 844}, color_scheme="dark"
        )
        for view in ("overview", "episodes", f"episode/{ids[0]}", "recall?query=login&compare=1"):
            await phone.view(view)
            width = await phone.page.evaluate("() => document.documentElement.scrollWidth")
            assert width <= 390, (view, width)  # nothing wider than a phone: no sideways scrolling
        await phone.shot("phone-dark")
        assert not await phone.page.is_visible("nav") and await phone.page.is_visible("#menu")
        await phone.page.click("#menu")
        assert await phone.page.is_visible("nav a[href='#/facts']")
        assert phone.problems == []
        await w.view("facts")
        first_fact = w.page.locator("ul.facts a").first
        text = await first_fact.inner_text()
        await first_fact.click()
        await w.page.locator('main[aria-busy="false"] h1', has_text=text).wait_for()
        assert await w.page.locator("main ul a[href^='#/episode/']").count() >= 1  # its evidence
        await w.shot("fact")
        fact_url = w.page.url
        await w.page.locator("main ul a[href^='#/episode/']").first.click()
        await w.page.locator('main[aria-busy="false"] h2', has_text="Evidence for facts").wait_for()
        back = w.page.locator("main a[href^='#/fact/']")  # the episode names the fact it is evidence for
        hrefs = [await a.get_attribute("href") for a in await back.all()]
        assert any(h and fact_url.endswith(h) for h in hrefs), (fact_url, hrefs)
        await w.view("episodes")
        assert set(await shown_ids(w.page, "tr[data-episode]")) == set(ids)

        # the playground: each hit's bar adds up to its priority; the ranking is the API's
        body = {"query": "login test", "top_k": 10, "weights": {"similarity": 0.5, "reward": 0.5}}
        await w.view(
            "recall?query=login+test&top_k=10&compare=1&A.weights=preset&A.preset=normal"
            "&B.weights=custom&B.similarity=0.5&B.recency=0&B.reward=0.5&B.outcome=0&B.importance=0"
        )
        await w.shot("playground")
        assert await w.unlabelled() == []
        hits = await w.page.eval_on_selector_all(
            '[data-side="B"] li[data-episode]',
            """els => els.map(li => ({id: li.dataset.episode, priority: Number(li.dataset.priority),
                 parts: [...li.querySelectorAll('.seg')].map(s => Number(s.dataset.value))}))""",
        )
        answer = await (await tenants.post("/v1/recall", json=body, headers=auth(KEY_A))).json()
        assert [h["id"] for h in hits] == [r["episode"]["episode_id"] for r in answer["results"]]
        for hit, result in zip(hits, answer["results"], strict=True):
            assert round(sum(hit["parts"]), 3) == round(hit["priority"], 3) == round(result["priority"], 3)
        normal = {"query": "login test", "top_k": 10, "preset": "normal"}
        answer_a = await (await tenants.post("/v1/recall", json=normal, headers=auth(KEY_A))).json()
        shown_a = await shown_ids(w.page, '[data-side="A"] li[data-episode]')
        assert shown_a == [r["episode"]["episode_id"] for r in answer_a["results"]]

        # the scope filters reach the request: the API's hits for the same filtered request
        await w.view("recall?query=login+test&top_k=10&outcome=failure&since=2000-01-01T00:00:00Z")
        failed = {"query": "login test", "top_k": 10, "outcome": "failure", "since": "2000-01-01T00:00:00Z"}
        expected = await (await tenants.post("/v1/recall", json=failed, headers=auth(KEY_A))).json()
        shown = await shown_ids(w.page, '[data-side="A"] li[data-episode]')
        assert shown == [r["episode"]["episode_id"] for r in expected["results"]] and len(shown) == 3

        # a PATCH made in the page
        target = ids[1]
        await w.view(f"episode/{target}")
        assert "login redirect loop" in await w.page.inner_text("main h1")
        await w.shot("episode")
        await w.page.fill('input[name="reward"]', "0.25")
        await w.page.click("text=Save reward")
        await w.page.wait_for_selector("text=Reward saved.")

        async def reward() -> Any:
            got = await (await tenants.get(f"/v1/episodes/{target}", headers=auth(KEY_A))).json()
            return got["episode"]["feedback"]["reward"] == 0.25

        await wait_until(reward, message="the reward saved in the page")

        # a forget made in the page: gone from the list, recall and the export
        await w.page.click("text=Forget this episode…")
        assert target in await w.page.inner_text("dialog")  # the confirmation names what it erases
        await w.page.click("dialog >> text=Forget it")
        await w.page.wait_for_selector('main[aria-busy="false"] h1:text-is("Episodes")')

        async def gone() -> bool:
            listed = await (await tenants.get("/v1/episodes", headers=auth(KEY_A))).json()
            return target not in [e["episode_id"] for e in listed["results"]]

        await wait_until(gone, message="the forgotten episode leaves the list")
        await w.view("episodes?order=asc")
        assert target not in await shown_ids(w.page, "tr[data-episode]")
        recalled = await (await tenants.post("/v1/recall", json=body, headers=auth(KEY_A))).json()
        assert target not in [r["episode"]["episode_id"] for r in recalled["results"]]
        await w.view("operations")
        async with w.page.expect_download() as download:
            await w.page.click("text=Export the namespace as JSONL")
        exported = [
            json.loads(line) for line in Path(await (await download.value).path()).read_text().splitlines()
        ]
        assert sorted(e["episode_id"] for e in exported) == sorted(set(ids) - {target})
        async with AsyncEngram(base, api_key=KEY_B) as other:  # the file `engram import` reads
            assert (await other.publish(exported, wait=10)).accepted == len(exported)
        assert w.problems == []


async def test_a_key_opens_only_its_namespace_and_a_wrong_key_asks_again(browser, tenants, settings, redis):
    base = str(tenants.server.make_url("")).rstrip("/")
    async with consolidating(settings, redis):
        ids = await record_all(base)
        w = await opened(browser, base, None)
        await w.view("episodes")
        assert await w.page.is_visible('input[name="key"]')  # no key: the key form
        await w.page.fill('input[name="key"]', "not-a-key-0000000000")
        await w.page.click("text=Open")
        await w.page.wait_for_selector("text=This key is not valid here.")
        await w.page.fill('input[name="key"]', KEY_B)
        await w.page.click("text=Open")
        await w.page.wait_for_selector("text=No episodes yet")  # ns-b is empty: how to record one
        assert "Engram(" in await w.page.inner_text("main pre")
        assert await shown_ids(w.page, "tr[data-episode]") == []
        await w.view(f"episode/{ids[0]}")
        assert "Not found" in await w.page.inner_text("main .error")
        # an API error: the problem's title and the field it names, marked in the form
        await w.view("recall?query=login&top_k=500")
        error = await w.page.inner_text("main .error")
        assert error.startswith("Invalid request") and "top_k: must be" in error, error
        assert await w.page.get_attribute('input[name="top_k"]', "aria-invalid") == "true"
        key_in_url = [p for p in w.problems if KEY_B in p]
        assert key_in_url == [] and KEY_B not in w.page.url


async def test_the_page_and_its_files_load_nothing_from_elsewhere(make_client):
    client = await make_client(api_keys={KEY_A: "ns-a"})
    page = await client.get("/console")
    assert page.status == 200 and "default-src 'self'" in page.headers["Content-Security-Policy"]
    html = await page.text()
    assert "http" not in html.replace('"http://www.w3.org', "")
    from services.query.console import assets

    total = 0
    for name, (body, _) in assets().items():
        resp = await client.get(f"/console/{name}")
        assert resp.status == 200 and f"console/{name}" in html
        assert "immutable" in resp.headers["Cache-Control"]
        total += len(body)
        assert b"https://" not in body and b"cdn" not in body.lower(), name
    assert total <= 400_000  # the page weight budget
    doc = await (await client.get("/openapi.json")).json()
    assert "/console" in doc["paths"] and not [p for p in doc["paths"] if p.startswith("/console/")]


async def test_the_bench_times_the_playground_against_the_recall_it_shows(
    chromium, make_client, settings, redis
):
    """`make bench`'s measure (bench.perf_console) on a small namespace with no API keys (`make run`'s
    default: the console opens directly)."""
    from bench.perf_console import playground_vs_api, render_console

    api = await make_client()
    base = str(api.server.make_url("")).rstrip("/")
    async with consolidating(settings, redis):
        async with AsyncEngram(base) as memory:
            for e in EPISODES[:3]:
                await memory.record(task=e["task"], outcome=e["outcome"], wait=10)
        res = await playground_vs_api(base, ["login test", "the login page", "redirect loop"], top_k=3)
    assert res["requests"] == 3 and res["api_p50_ms"] > 0 and res["playground_p50_ms"] > 0
    assert res["ratio"] > 0 and "Recall playground at 3 episodes" in render_console({**res, "size": 3})


async def test_dead_letters_are_redriven_and_discarded_from_the_page(browser, tenants, settings, redis):
    from tests.integration.test_dead_letters_http import dead_lettered

    await dead_lettered(settings, redis, "ns-a", "bad-a")
    await dead_lettered(settings, redis, "ns-b", "bad-b")
    w = await opened(browser, tenants.server.make_url("").human_repr().rstrip("/"), KEY_A)
    await w.view("operations")
    rows = w.page.locator("tr[data-dead]")
    assert await rows.count() == 1 and "vector" in await rows.first.inner_text()  # why, of ns-a's only
    assert "bad-b" not in await w.page.inner_text("main")
    ready = await (await tenants.get("/readyz")).json()
    generation = await w.page.inner_text("[data-generations]")
    assert f"Recall reads generation {ready['generations']['live']}; no replay" in generation
    first = await rows.first.get_attribute("data-dead")
    await w.page.click("text=Redrive")

    async def redriven() -> bool:
        listed = await (await tenants.get("/v1/dead-letters", headers=auth(KEY_A))).json()
        return listed["total"] == 0

    await wait_until(redriven, message="the dead letter published again")
    await drain(settings, redis)  # dead-lettered again: the fault is in the event itself
    await w.view("overview")
    await w.view("operations")
    assert await rows.count() == 1 and await rows.first.get_attribute("data-dead") != first
    w.page.once("dialog", lambda d: d.accept())  # the confirmation of a discard
    await w.page.click("text=Discard")
    await w.page.locator("text=None: the consolidator projected every event").wait_for()
    left = await (await tenants.get("/v1/dead-letters", headers=auth(KEY_A))).json()
    assert left["total"] == 0
    assert (await (await tenants.get("/v1/dead-letters", headers=auth(KEY_B))).json())["total"] == 1
    assert w.problems == []


async def test_inputs_long_texts_and_empty_answers_are_shown_for_what_they_are(
    browser, tenants, settings, redis
):
    """An empty reward is refused in the page (never saved as 0); a save shows the episode as the API
    then reads it, with one status line; an 82,000-character task is clipped in lists, hits, headings
    and dialogs (whole on its episode page); no view renders a null as text; a fact search that finds
    nothing says so; the key form keeps the focus; "Compare" shows the second setting at once."""
    base = str(tenants.server.make_url("")).rstrip("/")
    long_task = ("reproduce the login failure " + "with a very long log line " * 3200).strip()
    assert len(long_task) > 82_000
    async with consolidating(settings, redis):
        ids = await record_all(base)
        async with AsyncEngram(base, api_key=KEY_A) as memory:
            long_id = await memory.record(task=long_task, outcome="failure", solution="retry", wait=10)
        made = await tenants.post("/v1/consolidate", json={}, headers=auth(KEY_A))
        assert made.status == 200, await made.text()
        w = await opened(browser, base, None)
        patches: list[str] = []
        w.page.on("request", lambda r: r.method == "PATCH" and patches.append(r.post_data or ""))

        # the service has keys and this tab none: the key form, with the focus in its box
        await w.view("episodes")
        assert await w.page.evaluate("() => document.activeElement.name") == "key"
        await w.page.keyboard.type(KEY_A)
        await w.page.keyboard.press("Enter")
        await w.page.wait_for_selector("tr[data-episode]")
        w.problems.clear()  # the 401 that asked for the key

        # long texts: clipped in the list, the heading and the dialog; whole on the episode page
        link = w.page.locator(f'tr[data-episode="{long_id}"] a')
        assert len(await link.inner_text()) <= 160
        assert await w.page.evaluate("() => document.documentElement.scrollHeight") < 4000
        await w.view(f"episode/{long_id}")
        assert len(await w.page.inner_text("main h1")) <= 160
        assert len(await w.page.eval_on_selector("dialog", "e => e.textContent")) < 1000
        whole = await w.page.eval_on_selector("main details pre", "e => e.textContent")
        assert whole == long_task
        await w.view("recall?query=login+failure+log+line&top_k=20")
        hits = await w.page.eval_on_selector_all(".hits li a", "els => els.map(a => a.textContent)")
        assert hits and max(len(t) for t in hits) <= 160

        # the reward: an empty box is refused, naming the field, and nothing is sent
        target = ids[1]
        await w.view(f"episode/{target}")
        await w.page.fill('input[name="reward"]', "")
        await w.page.click("text=Save reward")
        error = await w.page.inner_text("main .error")
        assert "Reward: enter a number" in error, error
        assert await w.page.get_attribute('input[name="reward"]', "aria-invalid") == "true"
        assert patches == []
        stored = await (await tenants.get(f"/v1/episodes/{target}", headers=auth(KEY_A))).json()
        assert stored["episode"]["feedback"]["reward"] == 0.1

        # a save shows the new reward at once, and one status line however many saves
        for value, shown in (("0.25", "0.25"), ("0.5", "0.50")):
            await w.page.fill('input[name="reward"]', value)
            await w.page.click("text=Save reward")
            await w.page.locator("main dd", has_text=shown).wait_for()
            await w.page.wait_for_selector("text=Reward saved.")
            assert await w.page.locator("main .ok").count() == 1
            assert await w.page.locator("main .error").count() == 0
            assert await w.page.input_value('input[name="reward"]') == value
        assert [json.loads(p) for p in patches] == [
            {"feedback": {"reward": 0.25}},
            {"feedback": {"reward": 0.5}},
        ]

        # "Compare" shows the second setting at once, even before a query is typed
        await w.view("recall")
        await w.page.check("#compare")
        await w.page.locator("fieldset legend", has_text="Setting B").wait_for()
        assert "compare" not in w.page.url
        await w.page.uncheck("#compare")
        assert await w.page.locator("fieldset legend", has_text="Setting B").count() == 0

        # no null rendered as text; every fact says where it was distilled
        for view in ("facts", "learning", "overview", f"episode/{ids[0]}"):
            await w.view(view)
            assert "null" not in await w.page.inner_text("main"), view
        await w.view("facts")
        facts = await w.page.locator("ul.facts li").all_inner_texts()
        assert facts and all("whole namespace" in f or "agent " in f for f in facts), facts
        assert w.problems == []

        # a search that finds nothing is not "no facts yet" (ns-b has none to find)
        b = await opened(browser, base, KEY_B)
        await b.view("facts?q=login")
        shown = await b.page.inner_text("main")
        assert 'No fact matches "login"' in shown and "No facts yet" not in shown
