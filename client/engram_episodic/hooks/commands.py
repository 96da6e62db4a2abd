"""`engram hooks install|uninstall|status` and `engram hook <cli> <event>` (what the CLIs' settings call)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from engram_episodic.client import Engram
from engram_episodic.hooks import runner, settings, state
from engram_episodic.hooks.payloads import CLIS

_cli_arg = click.argument("cli_name", metavar="CLI", type=click.Choice(CLIS))
_scope = click.option(
    "--project/--user", "project", default=True, help="The project's settings (default) or the user's."
)
_dir = click.option(
    "--dir",
    "project_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=".",
    show_default=True,
    help="The project's folder.",
)


def _engram_argv() -> list[str]:
    """How the CLIs run this installation's `engram`: the script next to this Python, else this Python
    with the module under `-P`. Never a bare `python -m` (the hooks run in the project's folder, whose
    `uuid.py` or `httpx/` would then shadow the real ones), never another `engram` found on PATH."""
    script = Path(sys.executable).with_name("engram.exe" if sys.platform == "win32" else "engram")
    return [str(script)] if script.is_file() else [sys.executable, "-P", "-m", "engram_episodic.cli"]


def _service(ctx: click.Context) -> tuple[str, str | None]:
    """The service's URL and key: `--url`/ENGRAM_URL and `--api-key`/ENGRAM_API_KEY, else those
    `engram hooks install` saved, else the default URL."""
    root = ctx.find_root()
    config = state.load_config()
    url = root.params["url"]
    if root.get_parameter_source("url") == ParameterSource.DEFAULT and config.get("url"):
        url = config["url"]
    return url, root.params["api_key"] or config.get("api_key")


def _answers(url: str, api_key: str | None) -> str | None:
    """None when the service answers `/readyz`, else why not (one line)."""
    try:
        with Engram(url, api_key=api_key, timeout=2.0, max_retries=0) as client:
            client.ready()
        return None
    except Exception as exc:  # any failure is the answer: said, not raised
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _down_hint(url: str, why: str) -> str:
    return (
        f"no Engram service answers at {url} ({why}).\n"
        "  Start one from an Engram checkout with `make run` (or `docker compose up`), or point the hooks\n"
        "  at one: engram hooks install CLI --url URL --api-key KEY. Until then each finished task waits\n"
        f"  in {state.state_dir() / 'spool'} and is sent by a later hook."
    )


@click.group("hooks")
def hooks_group() -> None:
    """Record coding agents' tasks as episodes, scored by the project's tests (Claude Code, Gemini CLI)."""


def _url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"must start with http:// or https://, not {value[:40]!r}")
    return value


@hooks_group.command("install")
@_cli_arg
@_scope
@_dir
@click.option(
    "--url",
    callback=_url,
    help="The service's URL, kept for the hooks (default: ENGRAM_URL or the local one).",
)
@click.option("--api-key", help="The service's API key, kept for the hooks (readable by you only).")
@click.option(
    "--test-command", "test_commands", multiple=True, help="A command that runs the tests (repeatable)."
)
@click.option("--hash-repo", is_flag=True, help="Record the repository as a digest, not its URL or path.")
@click.pass_context
def install_command(
    ctx: click.Context,
    cli_name: str,
    project: bool,
    project_dir: Path,
    url: str | None,
    api_key: str | None,
    test_commands: tuple[str, ...],
    hash_repo: bool,
) -> None:
    """Add Engram's hooks and MCP server to CLI's settings (`claude-code` or `gemini-cli`); idempotent."""
    # what install resolved (the flags, else ENGRAM_URL/ENGRAM_API_KEY, else what an earlier install
    # kept, else the local URL) is what the hooks and the MCP server use later, without the environment
    found_url, found_key = _service(ctx)
    service_url, service_key = url or found_url, api_key or found_key
    config = state.load_config()
    config.update({"url": service_url, "api_key": service_key})
    if test_commands:
        config["test_commands"] = list(test_commands)
    if hash_repo:
        config["hash_repo"] = True
    scope = "project" if project else "user"
    where = settings.target(cli_name, scope, project_dir.resolve(), Path.home())
    argv = _engram_argv()
    env = {"ENGRAM_URL": service_url}
    if service_key and scope == "user":  # a project's settings are often committed: no key there
        env["ENGRAM_API_KEY"] = service_key
    hooks = settings.hook_entries(cli_name, argv)
    mcp = settings.mcp_entry(argv, env)
    try:
        replaced = settings.their_mcp(where.mcp_file)
        for path, (with_hooks, with_mcp) in where.files().items():
            settings.install(path, hooks if with_hooks else None, mcp if with_mcp else None)
    except settings.SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    state.save_config(config)
    click.echo(f"{cli_name}: Engram's hooks ({', '.join(hooks)}) in {where.hooks_file}")
    click.echo(f"{cli_name}: Engram's MCP server `engram` in {where.mcp_file}")
    if replaced:
        click.echo(
            f"{cli_name}: warning: it replaces the MCP server `engram` {where.mcp_file} had "
            "(uninstall puts it back)"
        )
    if service_key and scope == "project":
        click.echo(
            f"{cli_name}: warning: the key is kept for the hooks only; the MCP server in {where.mcp_file} "
            "gets none (a project's settings are often committed): set ENGRAM_API_KEY where the CLI runs, "
            "or install with --user"
        )
    if cli_name == "gemini-cli":
        click.echo("gemini-cli: hooks run when its hooks system is enabled (/settings: Enable Hooks System)")
    why = _answers(service_url, service_key)
    click.echo(f"service: {service_url} answers" if why is None else _down_hint(service_url, why))


@hooks_group.command("uninstall")
@_cli_arg
@_scope
@_dir
def uninstall_command(cli_name: str, project: bool, project_dir: Path) -> None:
    """Remove exactly what `engram hooks install` added to CLI's settings."""
    where = settings.target(cli_name, "project" if project else "user", project_dir.resolve(), Path.home())
    try:
        changed = [path for path, parts in where.files().items() if settings.uninstall(path, *parts)]
    except settings.SettingsError as exc:
        raise click.ClickException(str(exc)) from None
    for path in changed:
        click.echo(f"{cli_name}: Engram's entries removed from {path}")
    if not changed:
        click.echo(f"{cli_name}: nothing of Engram's in {where.hooks_file}")


@hooks_group.command("status")
@_dir
@click.pass_context
def status_command(ctx: click.Context, project_dir: Path) -> None:
    """Where Engram's hooks are installed, whether the service answers, what waits in the spool."""
    for cli_name in CLIS:
        for scope in ("project", "user"):
            where = settings.target(cli_name, scope, project_dir.resolve(), Path.home())
            hooks, mcp = settings.installed(where.hooks_file), settings.installed(where.mcp_file)
            what = f"hooks {', '.join(hooks['hooks'])}" if hooks["hooks"] else "no hooks"
            server = "yes" if mcp["mcp"] else "no"
            click.echo(
                f"{cli_name:12} {scope:8} {what if hooks['json'] else 'settings not JSON'}; "
                f"MCP server {server if mcp['json'] else 'unknown: not JSON'}  ({where.hooks_file})"
            )
    hashed = bool(state.load_config().get("hash_repo"))
    click.echo(
        f"repository: {project_dir.resolve()} is recorded as agent_id {runner.repo_identity(str(project_dir), hashed=hashed)!r}"
    )
    url, api_key = _service(ctx)
    why = _answers(url, api_key)
    click.echo(f"service: {url} answers" if why is None else f"service: {_down_hint(url, why)}")
    click.echo(f"spool: {len(state.spooled())} episodes waiting; log: {state.state_dir() / 'hooks.log'}")


@click.command("hook")
@_cli_arg
@click.argument("event")
@click.pass_context
def hook_command(ctx: click.Context, cli_name: str, event: str) -> None:
    """Handle one hook EVENT of CLI, its JSON on stdin (what the settings `engram hooks install` wrote
    call). Always exits 0; what went wrong is in the hooks' log."""
    url, api_key = _service(ctx)
    try:
        raw = sys.stdin.read()
    except (OSError, ValueError):
        raw = ""
    out = runner.main(cli_name, event, raw, url=url, api_key=api_key)
    if out:
        click.echo(out)


def register(group: Any) -> None:
    """Add `hooks` and `hook` to the `engram` command group."""
    group.add_command(hooks_group)
    group.add_command(hook_command)
