"""`engram`: the command line of Engram's query service, on the typed client (`engram_episodic.Engram`).

The commands, `--url` / `--api-key` and the output and exit statuses: docs/api.md, "Command line". Only
the commands of the HTTP API are here: the operator's (`replay`, `dead-letters`, ...) are the server's
`engram-admin`, which imports this package (never the reverse); `engram replay` and the others say so
in one line (exit status 2). The plots are in `engram_episodic.cli_plot`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from engram_episodic.calls import MAX_WAIT, Calls
from engram_episodic.cli_common import call, scope_of, scoped, service_options
from engram_episodic.cli_transfer import export_command, import_command
from engram_episodic.hooks.commands import register as register_hooks
from engram_episodic.parts import DEFAULT_MAX_BODY_BYTES


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2))


def _number_or_text(value: str) -> float | str:
    """`value` as a float when it is a plain decimal number (`1767225600`, `3600.5`), else unchanged."""
    try:
        return float(value) if value.strip().replace(".", "", 1).isdigit() else value
    except ValueError:
        return value


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@click.group()
@click.version_option(package_name="engram-episodic", prog_name="engram")
@service_options
@click.option(
    "--max-body-bytes",
    envvar="ENGRAM_MAX_BODY_BYTES",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    help="Largest request body the service takes (its ENGRAM_MAX_BODY_BYTES): import splits by it.",
)
@click.pass_context
def cli(ctx: click.Context, url: str, api_key: str | None, max_body_bytes: int) -> None:
    """Engram: episodic memory for LLM agents."""
    ctx.obj = {"url": url, "api_key": api_key, "max_body_bytes": max_body_bytes}


def _plot_options(fn: Any) -> Any:
    fn = click.option(
        "--out",
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        help="Write the plot to this PNG (matplotlib) instead of the terminal.",
    )(fn)
    return click.option("--plot", is_flag=True, help="Draw it (terminal: plotext; extra: [plot]).")(fn)


def _shown(kind: str, found: Any, setting: Any, as_json: bool, plot: bool, out: Path | None) -> bool:
    """Whether `found` (skills or a curve) was shown whole: as JSON, drawn, or said to be empty (not an
    empty screen; the MCP tools say it too). Drawn with `cli_plot.<kind>_figure` (to the PNG `out`) or
    `<kind>_terminal` when `--plot` or `--out` asked for it; `setting` is the plot's second argument (the
    skills' threshold, the curve's window). ClickException when the scope has nothing to plot."""
    results = found.results
    if as_json:
        _emit(found.raw)
        return True
    if not plot and out is None:
        if not results:
            click.echo("no completed episodes in this scope", err=True)
        return not results
    from engram_episodic import cli_plot

    if not results:
        raise click.ClickException("no episodes in this scope: nothing to plot")
    if out is not None:
        click.echo(f"wrote {cli_plot.png(getattr(cli_plot, f'{kind}_figure')(results, setting), out)}")
    else:
        click.echo(getattr(cli_plot, f"{kind}_terminal")(results, setting))
    return True


@cli.command()
@click.argument("query")
@scoped
@click.option("--category", multiple=True, help="Repeat for any of several.")
@click.option("--outcome", multiple=True, type=click.Choice(["success", "partial", "failure", "abandoned"]))
@click.option("--top-k", type=click.IntRange(1, 100))
@click.option(
    "--mode",
    type=click.Choice(["vector", "keyword", "hybrid"]),
    help="Default: the service's (ENGRAM_RECALL_MODE, hybrid).",
)
@click.option("--preset", type=click.Choice(["auto", "early", "normal", "late"]))
@click.option("--since", help="ISO 8601 with an offset, or epoch seconds.")
@click.option("--until", help="ISO 8601 with an offset, or epoch seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the full JSON response.")
@click.pass_context
def recall(ctx: click.Context, query: str, as_json: bool, **options: Any) -> None:
    """Recall the episodes worth replaying for QUERY, best first."""
    found = call(ctx, lambda c: c.recall(query, **scope_of(**options)))
    if as_json:
        _emit(found.raw)
        return
    for hit in found:
        ep = hit.episode
        task = ep.task.description if ep.task else ""
        click.echo(f"{hit.priority:.3f}  {ep.outcome or '-':9}  {ep.episode_id}  {task[:80]}")
    if not found.results:
        click.echo("no episodes in this scope", err=True)


@cli.command()
@click.argument("task")
@scoped
@click.option("--category")
@click.option("--top-k", type=click.IntRange(1, 100))
@click.option("--max-chars", type=click.IntRange(200, 200_000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def context(ctx: click.Context, task: str, as_json: bool, **options: Any) -> None:
    """The working-memory prompt section for TASK (recalled episodes, recent ones, facts)."""
    found = call(ctx, lambda c: c.context(task, **scope_of(**options)))
    if as_json:
        _emit(found.raw)
    else:
        click.echo(found.prompt)


def _accepted(result: Any, as_json: bool) -> None:
    """Print what was published; exit status 1 when an episode was not (its id was forgotten before),
    as with --wait, where the client raises for it."""
    refused = any(a.forgotten for a in result.results)
    if as_json:
        _emit(result.raw)
    else:
        for accepted in result.results:
            if accepted.forgotten:
                click.echo(
                    f"not published {accepted.episode_id}: it was forgotten before, and a forgotten "
                    f"episode_id is never stored again (publish under a new one)"
                )
                continue
            state = {None: "", True: " projected", False: " not yet projected"}[accepted.projected]
            click.echo(f"accepted {accepted.episode_id} (event {accepted.event_id}){state}")
    if refused:
        raise SystemExit(1)


_wait_option = click.option(
    "--wait", type=click.FloatRange(0, MAX_WAIT), help="Seconds to wait until recallable (read-your-writes)."
)


@cli.command()
@click.argument("file", type=click.File("r", encoding="utf-8-sig"))  # -sig: a byte-order mark is no error
@_wait_option
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def publish(ctx: click.Context, file: Any, wait: float | None, as_json: bool) -> None:
    """Publish FILE: one episode (a JSON object), a JSON list of them or {"episodes": [...]}. "-" reads
    stdin. One episode per line (JSONL, as `engram export` writes): `engram import FILE`."""
    try:
        body = json.load(file)
    except json.JSONDecodeError as exc:
        hint = " (one episode per line is JSONL: `engram import` reads it)" if exc.msg == "Extra data" else ""
        raise click.ClickException(f"{file.name} is not JSON: {exc}{hint}") from None
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"{file.name} is not UTF-8 ({exc.reason})") from None
    if isinstance(body, dict) and set(body) == {"episodes"}:
        episodes = body["episodes"]
    else:
        episodes = body if isinstance(body, list) else [body]
    _accepted(call(ctx, lambda c: c.publish(episodes, wait=wait)), as_json)


@cli.command()
@click.argument("task")
@click.option("--outcome", required=True, type=click.Choice(["success", "partial", "failure", "abandoned"]))
@scoped
@click.option("--category", help="Task category (default unknown).")
@click.option("--solution")
@click.option("--reward", type=float, help="Feedback reward (recall clips it to [0, 1]).")
@click.option("--message", help="Feedback message (what went wrong or right).")
@click.option("--strategy", "strategy_used")
@click.option("--importance", type=click.FloatRange(1, 10))
@click.option("--episode-id", help="Default: a new id (publishing the same id again replaces it).")
@click.option("--ttl", help="Expire the episode this long after now: seconds, or 90s, 30m, 12h, 30d, 1w.")
@click.option(
    "--expires-at", help="Expire the episode at this instant: ISO 8601 with an offset, or epoch seconds."
)
@_wait_option
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def record(
    ctx: click.Context,
    task: str,
    category: str | None,
    reward: float | None,
    message: str | None,
    wait: float | None,
    as_json: bool,
    expires_at: str | None,
    **fields: Any,
) -> None:
    """Record one finished episode of TASK from options (`publish` takes JSON files).

    `--ttl` and `--expires-at` are the episode's `ttl` and `expires_at` (docs/api.md, Expiry): one of the
    two; the client's validation names a bad one (exit status 1) before anything is sent."""
    if expires_at is not None:  # epoch seconds arrive as text: the episode model takes them as a number
        fields["expires_at"] = _number_or_text(expires_at)
    episode: dict[str, Any] = {
        "task": {"description": task, **({"category": category} if category else {})},
        **{k: v for k, v in fields.items() if v is not None},
    }
    feedback = {k: v for k, v in (("reward", reward), ("message", message)) if v is not None}
    if feedback:
        episode["feedback"] = feedback
    _accepted(call(ctx, lambda c: c.publish([episode], wait=wait)), as_json)


@cli.command()
@click.argument("query", required=False)
@click.option("--agent-id")
@click.option("--user-id")
@click.option("--category", multiple=True)
@click.option(
    "--kind", multiple=True, type=click.Choice(["strategy", "failure_pattern", "best_practice", "preference"])
)
@click.option("--top-k", type=click.IntRange(1, 100))
@click.option("--include-superseded", is_flag=True, default=None)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def facts(ctx: click.Context, query: str | None, as_json: bool, **options: Any) -> None:
    """Facts (semantic memory) near QUERY, or the most confident ones without it."""
    if as_json:  # the service's answer as it came (`results`, and `as_of` when given), as other commands
        _emit(call(ctx, lambda c: c.call(Calls.search_facts(query, **scope_of(**options)).as_json())))
        return
    found = call(ctx, lambda c: c.search_facts(query, **scope_of(**options)))
    # the level tells apart one fact distilled for the namespace and for an agent's category
    for fact in found:
        click.echo(
            f"{fact.kind:16} {fact.level:14} support {fact.support:4}  {fact.fact_id}  {fact.text[:100]}"
        )
    if not found:
        click.echo("no facts in this scope", err=True)


@cli.command()
@scoped
@click.option("--threshold", type=click.FloatRange(0, 1), help="Weak below this success rate (default 0.5).")
@click.option("--json", "as_json", is_flag=True)
@_plot_options
@click.pass_context
def skills(ctx: click.Context, as_json: bool, plot: bool, out: Path | None, **options: Any) -> None:
    """Per-category skill profiles; weak categories are marked (`--plot`: a bar chart)."""
    found = call(ctx, lambda c: c.skills(**scope_of(**options)))
    if _shown("skills", found, found.threshold, as_json, plot, out):
        return
    for p in found:
        click.echo(
            f"{p.category:24} {p.episodes:6} episodes  success {_fmt(p.success_rate, '.0%'):>5}  "
            f"reward {_fmt(p.avg_reward, '.2f'):>5}{'  WEAK' if p.weak else ''}"
        )


@cli.command()
@scoped
@click.option("--category")
@click.option("--window", type=click.IntRange(1, 1000))
@click.option("--limit", type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@_plot_options
@click.pass_context
def curve(ctx: click.Context, as_json: bool, plot: bool, out: Path | None, **options: Any) -> None:
    """The learning curve: per episode, rolling success rate and reward, cumulative reward (`--plot`:
    drawn)."""
    found = call(ctx, lambda c: c.learning_curve(**scope_of(**options)))
    if _shown("curve", found, found.window, as_json, plot, out):
        return
    for p in found:
        click.echo(
            f"{p.episode:5}  {p.outcome or '-':9} reward {_fmt(p.reward, '.2f'):>5}  "
            f"success {p.success_rate:.0%}  cumulative {p.cumulative_reward:.2f}  {p.episode_id}"
        )


@cli.command()
@click.option("--episode", "episode_id", help="Forget one episode.")
@click.option("--user", "user_id", help="Forget every episode of a user.")
@click.option("--agent", "agent_id", help="Forget every episode of an agent (a job).")
@click.option("--session", "session_id", help="Forget every episode of a session (a job).")
@click.option(
    "--wait",
    type=click.FloatRange(0, MAX_WAIT),
    help="Seconds to wait until it is erased from every read (--agent / --session: until the job is done).",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def forget(
    ctx: click.Context,
    episode_id: str | None,
    user_id: str | None,
    agent_id: str | None,
    session_id: str | None,
    wait: float | None,
    as_json: bool,
) -> None:
    """Forget one episode (--episode), a user (--user), an agent (--agent) or a session (--session)."""
    given = [v for v in (episode_id, user_id, agent_id, session_id) if v is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --episode, --user, --agent or --session")
    if episode_id is not None or user_id is not None:
        if episode_id is not None:
            done = call(ctx, lambda c: c.forget_episode(episode_id, wait=wait))
            what = f"episode {done.episode_id}"
        else:
            done = call(ctx, lambda c: c.forget_user(user_id, wait=wait))
            what = f"user {done.user_id}"
        if as_json:
            _emit(dataclasses.asdict(done))
        elif done.already_forgotten:
            click.echo(f"{what} was already forgotten: erased from every read")
        elif done.forgotten:
            click.echo(f"forgot {what} (event {done.event_id}): erased from every read")
        else:
            late = "; not yet erased after {wait:g}s" if done.forgotten is False else ""
            click.echo(f"forgetting {what} (event {done.event_id}){late.format(wait=wait or 0)}")
        return
    job = call(
        ctx, lambda c: c.forget_agent(agent_id) if agent_id is not None else c.forget_session(session_id)
    )
    if wait:
        job = call(ctx, lambda c: _job_done(c, job, wait))
    if as_json:
        _emit(job.raw)
    elif job.done and wait:
        click.echo(
            f"forgot {job.episodes} episodes of the {job.kind} (job {job.job_id}): erased from every read"
        )
    else:
        late = f"; not yet done after {wait:g}s" if wait else ""
        click.echo(
            f"forgetting {job.episodes} episodes of the {job.kind} "
            f"(job {job.job_id}: GET {job.raw['job']}){late}"
        )


JOB_POLL_SECONDS = 0.2
"""How often `engram forget --agent/--session --wait` reads the job's status."""


def _job_done(client: Any, job: Any, wait: float) -> Any:
    """The forget job's status once it is done, or its last status after `wait` seconds."""
    deadline = time.monotonic() + wait
    while not job.done and time.monotonic() < deadline:
        time.sleep(min(JOB_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        job = client.forget_job(job.job_id)
    return job


@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False
)
@click.pass_context
def mcp(ctx: click.Context) -> None:
    """An MCP server over stdio (default) or streamable HTTP; `engram mcp --help` lists its options."""
    from engram_episodic import mcp_server  # it says itself when the mcp extra is missing

    env = {
        "ENGRAM_URL": ctx.obj["url"],
        **({"ENGRAM_API_KEY": ctx.obj["api_key"]} if ctx.obj["api_key"] else {}),
    }
    os.environ.update(env)
    sys.exit(mcp_server.main(list(ctx.args)))


SERVER_COMMANDS = ("run", "replay", "reindex", "dead-letters", "redrive", "discard")
"""The operator's commands: the server's `engram-admin` has them, and `engram NAME` says so."""


def _moved(name: str) -> click.Command:
    """A hidden `engram NAME` that points at `engram-admin NAME` (one line on stderr, exit status 2)."""

    @click.command(
        name,
        hidden=True,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def moved() -> None:
        click.echo(
            f"engram {name}: an operator's command of Engram's server: run `engram-admin {name}` "
            f"(or `python -m services.admin {name}`), installed with the server (`make install`)",
            err=True,
        )
        sys.exit(2)

    return moved


for _name in SERVER_COMMANDS:
    cli.add_command(_moved(_name))
cli.add_command(export_command)
cli.add_command(import_command)
register_hooks(cli)  # `engram hooks ...`, `engram hook <cli> <event>`


def main() -> None:
    cli(prog_name="engram")


if __name__ == "__main__":
    main()
