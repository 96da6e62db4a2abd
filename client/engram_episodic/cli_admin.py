"""`engram run`, `replay`, `reindex`, `dead-letters`, `redrive`, `discard`: the commands that run the server's own
code (the stack, or a task on its Redis) rather than call the HTTP API.

The client distribution has no server code: these import it when they run (a checkout's `make install`,
or `pip install -e .` beside `./client`) and say so when it is absent. They read the server's
environment (`shared.settings.Settings`) with the defaults of `engram run`: `REDIS_URL` defaults to its
embedded Redis (`redis://127.0.0.1:$ENGRAM_REDIS_PORT/0`, port 6390; with `ENGRAM_REDIS_CLUSTER` = N its
embedded cluster, `redis+cluster://127.0.0.1:$ENGRAM_REDIS_PORT`) and, with no master key set, the
key it keeps in `$ENGRAM_DATA_DIR/master.key` (`.run/`, or `.run/redis-<port>/` for another
`ENGRAM_REDIS_PORT`: `services.run_lock.run_data_dir`) is used when it exists (without it sealed events
cannot be opened). Long work draws a progress bar (tqdm, on stderr, when it is a terminal or with
`--progress`) with its rate and ETA, then a summary.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from types import ModuleType
from typing import Any, NoReturn

import click

from engram_episodic.cli_progress import Bars, progress_option
from engram_episodic.errors import ConfigError, Conflict

NO_SERVER = (
    "`engram {command}` runs Engram's server code, which is not installed here ({error}). From an Engram "
    "checkout: `make install` (or `pip install -e .` beside `pip install -e ./client`)."
)
EMBEDDERS = ("hashing", "minilm", "mpnet", "openai")


def server_module(command: str, name: str) -> ModuleType:
    """Import the server module `name` for `command`, or a ClickException saying how to install it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise click.ClickException(NO_SERVER.format(command=command, error=exc)) from None


def server_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the admin commands read, with `engram run`'s defaults filled in."""
    env = dict(os.environ if environ is None else environ)
    port = env.get("ENGRAM_REDIS_PORT") or 6390
    if (env.get("ENGRAM_REDIS_CLUSTER") or "0").strip() not in ("", "0"):
        # `ENGRAM_REDIS_CLUSTER=N make run`'s embedded cluster: its first primary is on the port
        env.setdefault("REDIS_URL", f"redis+cluster://127.0.0.1:{port}")
    env.setdefault("REDIS_URL", f"redis://127.0.0.1:{port}/0")
    key = server_module("admin", "services.run_lock").run_data_dir(env) / "master.key"
    if not env.get("ENGRAM_MASTER_KEY") and not env.get("ENGRAM_MASTER_KEY_FILE") and key.is_file():
        env["ENGRAM_MASTER_KEY_FILE"] = str(key)
    return env


CLUSTER_HINT = (
    "REDIS_URL={url} is a Redis Cluster ({error}): use REDIS_URL=redis+cluster://host:port "
    "(next to `ENGRAM_REDIS_CLUSTER=N make run`, set ENGRAM_REDIS_CLUSTER=N here too)"
)


def refuse(command: str, message: str) -> NoReturn:
    """A configuration error, as `make run` reports one: one line on stderr, exit code 2 (a retry
    cannot fix it; docs/reliability.md)."""
    context = click.get_current_context(silent=True)
    program = context.find_root().info_name if context is not None else None
    click.echo(f"{program or 'engram'} {command}: {message}", err=True)
    sys.exit(2)


def _settings(command: str, **overrides: Any) -> Any:
    settings_mod = server_module(command, "shared.settings")
    try:
        settings = settings_mod.Settings.from_env(server_env())
    except ConfigError as exc:
        refuse(command, str(exc))
    return settings.with_(**{k: v for k, v in overrides.items() if v is not None})


def run_admin(command: str, coro: Any) -> Any:
    """Run an admin coroutine; Redis being away is a one-line error (exit 1), a configuration error
    (ConfigError: another partition count, a master key missing; a cluster addressed as one Redis, its
    MovedError; a Conflict such as a data key wrapped by another master key, which an operator trial's
    replay met as a traceback after a rotation) one line and exit 2, never a traceback."""
    redis_exc = server_module(command, "redis.exceptions")
    try:
        return asyncio.run(coro)
    except (ConfigError, Conflict) as exc:  # Conflict: e.g. a data key wrapped by another master key
        refuse(command, str(exc))
    except redis_exc.MovedError as exc:
        refuse(command, CLUSTER_HINT.format(url=server_env().get("REDIS_URL"), error=f"MOVED {exc}"))
    except (redis_exc.ConnectionError, redis_exc.TimeoutError) as exc:
        url = server_env().get("REDIS_URL")
        raise click.ClickException(f"cannot reach Redis at {url} ({exc}); is the stack running?") from None


json_option = click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")


@click.command()
@click.option("--workers", type=click.IntRange(1, 64), help="Consolidator processes (ENGRAM_WORKERS, 1).")
@click.option("--port", type=click.IntRange(1, 65535), help="The query service's port (ENGRAM_PORT, 8080).")
def run(workers: int | None, port: int | None) -> None:
    """Start the stack in the foreground, as `make run` does: the embedded Redis (unless REDIS_URL is
    set), the consolidator(s) and the query service; Ctrl-C stops everything."""
    stack = server_module("run", "services.run")
    if workers is not None:
        os.environ["ENGRAM_WORKERS"] = str(workers)
    if port is not None:
        os.environ["ENGRAM_PORT"] = str(port)
    for name, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
    ):
        os.environ.setdefault(name, value)  # as the Makefile exports them: models load from disk only
    sys.exit(stack.main())


def _replay(command: str, progress: bool | None, as_json: bool, **overrides: Any) -> None:
    admin = server_module(command, "services.consolidator.admin")
    settings = _settings(command, **overrides)
    bars = Bars(
        enabled=progress,
        units={"snapshot": "episode", "stream": "entry", "catch-up": "entry", "drop": "key"},
    )
    start = time.perf_counter()
    try:
        counts = run_admin(command, admin.replay(settings, bars, keep_embedder=command == "replay"))
    finally:
        bars.close()
    seconds = time.perf_counter() - start
    done = counts["snapshot_episodes"] + counts["entries"]
    if as_json:
        click.echo(json.dumps({**counts, "embedder": settings.embedder, "seconds": round(seconds, 3)}))
        return
    click.echo(
        f"{command}: generation {counts['from_generation']} → {counts['generation']} "
        f"({settings.embedder}): {counts['snapshot_episodes']} episodes from the snapshot, "
        f"{counts['entries']} stream entries ({counts['caught_up']} caught up after the swap), "
        f"{_facts_summary(counts)}, {counts['dropped_keys']} old keys dropped, "
        f"in {seconds:.1f} s ({done / seconds if seconds > 0 else 0:.0f}/s)"
    )


def _facts_summary(counts: dict[str, Any]) -> str:
    """What a replay did with the facts: carried over, or re-embedded for another embedder; and any it
    could not index (searches miss them until their scope is consolidated again)."""
    n, scopes = counts["facts"], counts["fact_scopes"]
    what = "re-embedded" if counts["facts_reembedded"] else "carried over"
    text = f"{n} facts of {scopes} scope(s) {what}" if n else "no facts"
    missing = n - counts["facts_indexed"]
    if missing > 0:
        text += f" ({missing} not indexed: run POST /v1/consolidate)"
    return text


@click.command()
@progress_option
@json_option
def replay(progress: bool | None, as_json: bool) -> None:
    """Rebuild every projection from the stream into a new generation and swap it in (REDIS_URL)."""
    _replay("replay", progress, as_json)


@click.command()
@click.option("--embedder", type=click.Choice(EMBEDDERS), required=True)
@progress_option
@json_option
def reindex(embedder: str, progress: bool | None, as_json: bool) -> None:
    """Re-embed every episode, and the facts' centroids, with another embedder (a replay into a new index),
    then swap it in. Restart the stack with the same ENGRAM_EMBEDDER afterwards."""
    _replay("reindex", progress, as_json, embedder=embedder)


@click.command("dead-letters")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1_000_000))
@json_option
def dead_letters(limit: int, as_json: bool) -> None:
    """List dead letters, oldest first: the events the consolidator gave up on, with the reason."""
    admin = server_module("dead-letters", "services.consolidator.admin")
    rows = run_admin("dead-letters", admin.dead_letters(_settings("dead-letters"), limit))
    if as_json:
        click.echo(json.dumps(rows, ensure_ascii=False, indent=2))
        return
    from engram_episodic.timeutil import format_instant

    for row in rows:
        episode = row.get("episode_id") or "-"
        click.echo(
            f"{row['id']:22} {format_instant(row['at'])}  {row['bytes']:7} B  {episode[:40]:40}  {row['reason'][:100]}"
        )
    click.echo(f"{len(rows)} dead letter(s)", err=True)


def _dead_letter_command(verb: str, did: str, key: str, doc: str):
    """`engram redrive` / `engram discard`: the dead letters named (or `--all`), with a progress bar."""

    @click.command(verb, help=doc)
    @click.argument("ids", nargs=-1)
    @click.option("--all", "all_", is_flag=True, help=f"{did.capitalize()} every dead letter.")
    @progress_option
    @json_option
    def command(ids: tuple[str, ...], all_: bool, progress: bool | None, as_json: bool) -> None:
        if not ids and not all_:
            raise click.UsageError("name dead-letter ids or pass --all")
        if ids and all_:
            raise click.UsageError("name dead-letter ids or pass --all, not both")
        admin = server_module(verb, "services.consolidator.admin")
        bars = Bars(enabled=progress, units={verb: "letter"})
        start = time.perf_counter()
        try:
            n, unknown = run_admin(
                verb,
                getattr(admin, verb)(
                    _settings(verb),
                    None if all_ else list(ids),
                    on_start=lambda total: bars.phase(verb, total),
                    on_each=lambda: bars.advance(1),
                ),
            )
        finally:
            bars.close()
        seconds = time.perf_counter() - start
        if as_json:
            click.echo(json.dumps({key: n, "unknown": unknown, "seconds": round(seconds, 3)}))
        else:
            # a bare "0" beside "no dead letter has the id" read as a contradiction
            named = f" of the {len(ids)} named" if unknown else ""
            click.echo(f"{did} {n}{named} dead letter(s) in {seconds:.1f} s")
        if unknown:  # a typo must not look like success
            raise click.ClickException(
                f"no dead letter has the id(s) {', '.join(unknown)} (see `engram dead-letters` for the ids)"
            )

    return command


redrive = _dead_letter_command(
    "redrive",
    "re-driven",
    "redriven",
    "Publish dead letters again (after a fix) and remove them from the dead-letter stream.",
)
discard = _dead_letter_command(
    "discard",
    "discarded",
    "discarded",
    "Delete dead letters no fix will make projectable, and their original entries; nothing is "
    "published (the events are gone, as a forget leaves them).",
)


COMMANDS = (run, replay, reindex, dead_letters, redrive, discard)
