"""`engram`: a command line for the query service's HTTP API.

    engram recall "fix the flaky migration test" --agent-id coder --top-k 5
    engram publish episodes.json          # one episode, or {"episodes": [...]}
    engram skills --agent-id coder
    engram forget --episode EPISODE_ID    # or --user USER_ID

`--url` (ENGRAM_URL, default http://127.0.0.1:8080) and `--api-key` (ENGRAM_API_KEY) select the service.
Errors are the service's problem details, printed to stderr with exit status 1 (2 for usage errors).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any
from urllib.parse import quote

import aiohttp
import click

DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(click.ClickException):
    """A non-2xx answer: shows the problem's detail and each invalid field."""

    def __init__(self, status: int, body: Any):
        if isinstance(body, dict):
            lines = [f"{status} {body.get('title', 'error')}: {body.get('detail', '')}".rstrip(": ")]
            lines += [f"  {e.get('field')}: {e.get('reason')}" for e in body.get("errors", [])]
            message = "\n".join(lines)
        else:
            message = f"{status}: {str(body)[:500]}"
        super().__init__(message)


async def _call(url: str, api_key: str | None, method: str, path: str, *, body: Any = None,
                params: dict[str, str] | None = None) -> Any:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.request(method, url.rstrip("/") + path, json=body, params=params,
                                   headers=headers) as resp:
            try:
                data = await resp.json(content_type=None)
            except (json.JSONDecodeError, UnicodeDecodeError):
                data = await resp.text()
            if resp.status >= 400:
                raise ApiError(resp.status, data)
            return data


def call(ctx: click.Context, method: str, path: str, **kwargs: Any) -> Any:
    try:
        return asyncio.run(_call(ctx.obj["url"], ctx.obj["api_key"], method, path, **kwargs))
    except aiohttp.ClientError as exc:
        raise click.ClickException(f"cannot reach {ctx.obj['url']}: {exc}") from None


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2))


def _scope(**options: Any) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v not in (None, ())}


@click.group()
@click.option("--url", envvar="ENGRAM_URL", default=DEFAULT_URL, show_default=True,
              help="Base URL of the query service (env ENGRAM_URL).")
@click.option("--api-key", envvar="ENGRAM_API_KEY", default=None,
              help="API key, sent as a Bearer token (env ENGRAM_API_KEY).")
@click.pass_context
def cli(ctx: click.Context, url: str, api_key: str | None) -> None:
    """Engram: episodic memory for LLM agents."""
    ctx.obj = {"url": url, "api_key": api_key}


@cli.command()
@click.argument("query")
@click.option("--agent-id")
@click.option("--user-id")
@click.option("--session-id")
@click.option("--category", multiple=True, help="Repeat for any of several.")
@click.option("--outcome", multiple=True, type=click.Choice(["success", "partial", "failure", "abandoned"]))
@click.option("--top-k", type=click.IntRange(1, 100))
@click.option("--mode", type=click.Choice(["vector", "keyword", "hybrid"]),
              help="Default: the service's (ENGRAM_RECALL_MODE, hybrid).")
@click.option("--preset", type=click.Choice(["auto", "early", "normal", "late"]))
@click.option("--since", help="ISO 8601 with an offset, or epoch seconds.")
@click.option("--until", help="ISO 8601 with an offset, or epoch seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the full JSON response.")
@click.pass_context
def recall(ctx: click.Context, query: str, as_json: bool, **options: Any) -> None:
    """Recall the episodes worth replaying for QUERY, best first."""
    body = {"query": query, **_scope(**options)}
    for key in ("category", "outcome"):
        if key in body:
            body[key] = list(body[key])
    data = call(ctx, "POST", "/v1/recall", body=body)
    if as_json:
        _emit(data)
        return
    for r in data["results"]:
        ep = r["episode"]
        task = (ep.get("task") or {}).get("description", "")
        click.echo(f"{r['priority']:.3f}  {ep.get('outcome', '-'):9}  {ep['episode_id']}  {task[:80]}")
    if not data["results"]:
        click.echo("no episodes in this scope", err=True)


@cli.command()
@click.argument("file", type=click.File("r", encoding="utf-8"))
@click.pass_context
def publish(ctx: click.Context, file) -> None:
    """Publish FILE: one episode (JSON object) or {"episodes": [...]}. "-" reads stdin."""
    try:
        body = json.load(file)
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"{file.name} is not JSON: {exc}") from None
    data = call(ctx, "POST", "/v1/episodes", body=body)
    for r in data["results"]:
        click.echo(f"accepted {r['episode_id']} (event {r['event_id']})")


@cli.command()
@click.option("--agent-id")
@click.option("--user-id")
@click.option("--session-id")
@click.option("--threshold", type=click.FloatRange(0, 1), help="Weak below this success rate (default 0.5).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def skills(ctx: click.Context, as_json: bool, **options: Any) -> None:
    """Per-category skill profiles; weak categories are marked."""
    params = {k: str(v) for k, v in _scope(**options).items()}
    data = call(ctx, "GET", "/v1/skills", params=params)
    if as_json:
        _emit(data)
        return
    for p in data["results"]:
        rate = "-" if p["success_rate"] is None else f"{p['success_rate']:.0%}"
        reward = "-" if p["avg_reward"] is None else f"{p['avg_reward']:.2f}"
        click.echo(f"{p['category']:24} {p['episodes']:6} episodes  success {rate:>5}  reward {reward:>5}"
                   f"{'  WEAK' if p['weak'] else ''}")


@cli.command()
@click.option("--episode", "episode_id", help="Forget one episode.")
@click.option("--user", "user_id", help="Forget every episode of a user.")
@click.pass_context
def forget(ctx: click.Context, episode_id: str | None, user_id: str | None) -> None:
    """Forget one episode (--episode) or a whole user (--user)."""
    if (episode_id is None) == (user_id is None):
        raise click.UsageError("give exactly one of --episode or --user")
    if episode_id is not None:
        data = call(ctx, "DELETE", f"/v1/episodes/{quote(episode_id, safe='')}")
        click.echo(f"forgetting episode {data['episode_id']} (event {data['event_id']})")
    else:
        data = call(ctx, "DELETE", f"/v1/users/{quote(user_id, safe='')}")
        click.echo(f"forgetting user {data['user_id']} (event {data['event_id']})")


def main() -> None:
    cli(prog_name="engram")


if __name__ == "__main__":
    sys.exit(main())
