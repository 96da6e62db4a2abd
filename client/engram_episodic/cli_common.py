"""What the `engram` commands share: a client on the group's options (`--url`, `--api-key`,
`--max-body-bytes`, in `ctx.obj`), its errors said in one message, and a scope from the options given (`scoped`).

A leaf of the command line: `cli` (the group) and `cli_transfer` (export, import) both import it.
"""

from __future__ import annotations

import os
from typing import Any

import click

from engram_episodic.client import Engram
from engram_episodic.errors import ApiError, EngramError, InvalidEpisode


def _client(ctx: click.Context) -> Engram:
    return Engram(
        ctx.obj["url"], api_key=ctx.obj["api_key"], timeout=60.0, max_body_bytes=ctx.obj["max_body_bytes"]
    )


def call(ctx: click.Context, fn: Any) -> Any:
    """`fn(client)` on a client of the group's options, closed after; every error of the client (ApiError,
    InvalidEpisode, ConnectionFailed, EngramError, ValueError) becomes a one-screen ClickException: exit
    status 1."""
    try:
        with _client(ctx) as client:
            return fn(client)
    except ApiError as exc:
        lines = [f"{exc.status} {exc.title}" + (f": {exc.detail}" if exc.detail else "")]
        lines += [f"  {field}: {reason}" for field, reason in exc.errors]
        if exc.status == 401:
            lines.append(
                "  pass the API key with --api-key or ENGRAM_API_KEY"
                if not ctx.obj["api_key"]
                else "  the key given (--api-key or ENGRAM_API_KEY) is not one of the service's ENGRAM_API_KEYS"
            )
        raise click.ClickException("\n".join(lines)) from None
    except InvalidEpisode as exc:
        raise click.ClickException("invalid:\n" + "\n".join(f"  {f}: {r}" for f, r in exc.errors)) from None
    except (EngramError, ValueError) as exc:  # ValueError: the client's own checks (a URL, a padded key)
        raise click.ClickException(str(exc)) from None


def scope_of(**options: Any) -> dict[str, Any]:
    """The options given (not None, not an empty tuple), tuples as lists: keyword arguments of the client."""
    out = {k: v for k, v in options.items() if v not in (None, ())}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def service_options(fn: Any) -> Any:
    """`fn` with `--url` (ENGRAM_URL, else port ENGRAM_PORT or 8080 on this host, as the client finds a
    local stack) and `--api-key` (ENGRAM_API_KEY): of `engram` and of its MCP server."""
    fn = click.option(
        "--api-key", envvar="ENGRAM_API_KEY", help="API key, sent as a Bearer token (env ENGRAM_API_KEY)."
    )(fn)
    return click.option(
        "--url",
        envvar="ENGRAM_URL",
        default=lambda: f"http://127.0.0.1:{os.environ.get('ENGRAM_PORT') or '8080'}",
        show_default="http://127.0.0.1:$ENGRAM_PORT",
        help="Base URL of the query service (env ENGRAM_URL).",
    )(fn)


def scoped(fn: Any) -> Any:
    """`fn` with the scope options `--agent-id`, `--user-id`, `--session-id`."""
    for name in ("--session-id", "--user-id", "--agent-id"):
        fn = click.option(name)(fn)
    return fn
