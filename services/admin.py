"""`engram-admin` (also `python -m services.admin`): the operator's commands, which run the server's
own code on a deployment's Redis rather than call the HTTP API.

    engram-admin run [--workers N] [--port P]          # the stack in the foreground, as `make run`
    engram-admin replay | reindex --embedder E         # rebuild the projections (progress bar, ETA)
    engram-admin dead-letters | redrive --all | discard ID...
    engram-admin rotate-master-key --new-key-file F | erase-now

They read the server's environment with `make run`'s defaults (`server_env`): its embedded Redis or
cluster, and its master key file when it exists. Long work draws a progress bar (tqdm, on stderr, on
a terminal or with `--progress`), then a summary; `--json` prints the summary as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn

import click
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engram_episodic.cli_progress import Bars, progress_option
from engram_episodic.errors import ConfigError, Conflict
from engram_episodic.timeutil import format_instant
from services.run_lock import run_data_dir
from shared.partitions import deployment_keys
from shared.redis_conn import connected
from shared.settings import Settings

EMBEDDERS = ("hashing", "minilm", "mpnet", "openai")


def server_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the admin commands read (`environ`, default os.environ), with `make run`'s
    defaults filled in: REDIS_URL, and ENGRAM_MASTER_KEY_FILE when its key file exists."""
    env = dict(os.environ if environ is None else environ)
    port = env.get("ENGRAM_REDIS_PORT") or 6390
    if (env.get("ENGRAM_REDIS_CLUSTER") or "0").strip() not in ("", "0"):
        # `ENGRAM_REDIS_CLUSTER=N make run`'s embedded cluster: its first primary is on the port
        env.setdefault("REDIS_URL", f"redis+cluster://127.0.0.1:{port}")
    env.setdefault("REDIS_URL", f"redis://127.0.0.1:{port}/0")
    key = run_data_dir(env) / "master.key"
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
    click.echo(f"engram-admin {command}: {message}", err=True)
    sys.exit(2)


def _settings(command: str, **overrides: Any) -> Settings:
    """The server's Settings from `server_env()` with `overrides` (those not None); a
    configuration error is `refuse`d."""
    try:
        settings = Settings.from_env(server_env())
    except ConfigError as exc:
        refuse(command, str(exc))
    return settings.with_(**{k: v for k, v in overrides.items() if v is not None})


def run_admin(command: str, coro: Any) -> Any:
    """Run an admin coroutine: Redis away is one line and exit 1; a ConfigError, Conflict or
    MovedError (a cluster addressed as one Redis) one line and exit 2, never a traceback. SIGTERM stops it
    as Ctrl-C does (a replay then drops the generation it was building)."""
    main = threading.current_thread() is threading.main_thread()  # only it may take signals
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
    try:
        return asyncio.run(coro)
    except (ConfigError, Conflict) as exc:  # Conflict: e.g. a data key wrapped by another master key
        refuse(command, str(exc))
    except MovedError as exc:
        refuse(command, CLUSTER_HINT.format(url=server_env().get("REDIS_URL"), error=f"MOVED {exc}"))
    except (RedisConnectionError, RedisTimeoutError) as exc:
        url = server_env().get("REDIS_URL")
        raise click.ClickException(f"cannot reach Redis at {url} ({exc}); is the stack running?") from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


async def _replay_task(
    settings: Settings, progress: Bars | None = None, *, keep_embedder: bool
) -> dict[str, int]:
    """Rebuild every projection into a new generation with `settings.embedder`; the replay's
    counts. `keep_embedder` (`replay`): ConfigError, before anything is written, when `settings.embedder`
    is not the current generation's; otherwise `embedder_changed` (1 or 0) says whether it is."""
    from services.consolidator.replay import replay as do_replay
    from shared.embedding import loaded_embedder
    from shared.index import current_generation, embedder_mismatch, embedder_setting

    async with contextlib.AsyncExitStack() as stack:
        redis = await stack.enter_async_context(connected(settings))
        embedder = await loaded_embedder(stack, settings)
        name, dim = embedder.name, embedder.dim
        gen = await current_generation(redis, settings.keys)
        other = await embedder_mismatch(redis, settings.keys, gen, name, dim)
        if keep_embedder and other is not None:
            # a plain `replay` with ENGRAM_EMBEDDER unset re-embedded a hashing deployment: every recall 409
            raise ConfigError(
                f"generation {gen} was built with embedder {other.index_embedder!r} (dim {other.index_dim}) "
                f"and this replay would embed with {name!r} (dim {dim}): replay keeps the index's embedder — "
                f"run it with {embedder_setting(other.index_embedder, other.index_dim)}; to change the "
                "embedder, `reindex --embedder`"
            )
        return {
            **await do_replay(settings, redis, embedder, progress),
            "embedder_changed": int(other is not None),
        }


async def _dead_letter_rows(settings: Settings, limit: int) -> list[dict[str, Any]]:
    """The oldest `limit` dead letters: `{id, stream_id, reason, consumer, at (UTC epoch s), bytes,
    namespace, episode_id}` (the last two None when the payload names no episode)."""
    from services.consolidator.deadletters import list_dead_letters
    from shared.codec import peek_identity

    async with connected(settings) as redis:
        keys = await deployment_keys(redis, settings.keys, explicit=settings.stream_partitions is not None)
        rows = []
        for d in await list_dead_letters(redis, keys, limit=limit):
            ident = peek_identity(d.payload) if d.payload else None
            rows.append(
                {
                    "id": d.dead_id,
                    "stream_id": d.stream_id,
                    "reason": d.reason,
                    "consumer": d.consumer,
                    "at": d.at,
                    "bytes": len(d.payload),
                    "namespace": ident[0] if ident else None,
                    "episode_id": ident[1] if ident else None,
                }
            )
        return rows


async def _on_dead_letters(
    verb: str,
    settings: Settings,
    ids: list[str] | None,
    progress: Bars | None = None,
) -> tuple[int, list[str]]:
    """`deadletters.redrive` or `.discard`, by `verb`, on the dead letters `ids` (None: all) →
    (how many, the ids that name no dead letter)."""
    from services.consolidator import deadletters

    act = {"redrive": deadletters.redrive, "discard": deadletters.discard}[verb]
    async with connected(settings) as redis:
        keys = await deployment_keys(redis, settings.keys, explicit=settings.stream_partitions is not None)
        letters = await deadletters.list_dead_letters(redis, keys, limit=1_000_000)
        if ids is not None:
            letters = [d for d in letters if d.dead_id in ids]
        n = await act(redis, keys, letters, progress)
    return n, [i for i in ids or [] if i not in {d.dead_id for d in letters}]


json_option = click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")


@click.command()
@click.option("--workers", type=click.IntRange(1, 64), help="Consolidator processes (ENGRAM_WORKERS, 1).")
@click.option("--port", type=click.IntRange(1, 65535), help="The query service's port (ENGRAM_PORT, 8080).")
def run(workers: int | None, port: int | None) -> None:
    """Start the stack in the foreground, as `make run` does (`python -m services.run`): the embedded
    Redis (unless REDIS_URL is set), the consolidator(s) and the query service; Ctrl-C stops everything."""
    from services import run as stack  # the supervisor: only this command needs it

    if workers is not None:
        os.environ["ENGRAM_WORKERS"] = str(workers)
    if port is not None:
        os.environ["ENGRAM_PORT"] = str(port)
    sys.exit(stack.main())


def _replay(command: str, progress: bool | None, as_json: bool, **overrides: Any) -> None:
    settings = _settings(command, **overrides)
    bars = Bars(
        enabled=progress,
        units={"snapshot": "episode", "stream": "entry", "catch-up": "entry", "drop": "key"},
    )
    start = time.perf_counter()
    try:
        counts = run_admin(command, _replay_task(settings, bars, keep_embedder=command == "replay"))
    finally:
        bars.close()
    seconds = time.perf_counter() - start
    done = counts["snapshot_episodes"] + counts["entries"]
    if counts["embedder_changed"]:
        from shared.index import embedder_setting

        click.echo(
            "restart the consolidators and the query service with "
            f"{embedder_setting(settings.embedder, settings.embed_dim)} (`make run`: the same before it): "
            "until then they pause (/readyz says embedder: false)",
            err=True,
        )
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
    """What a replay did with the facts (carried over or re-embedded; any not indexed)."""
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
@click.option(
    "--limit", default=100, show_default=True, type=click.IntRange(1, 1_000_000), help="List the oldest N."
)
@click.option("--json", "as_json", is_flag=True, help="Print the dead letters as a JSON list.")
def dead_letters(limit: int, as_json: bool) -> None:
    """List dead letters, oldest first: the events the consolidator gave up on, with the reason."""
    rows = run_admin("dead-letters", _dead_letter_rows(_settings("dead-letters"), limit))
    if as_json:
        click.echo(json.dumps(rows, ensure_ascii=False, indent=2))
        return
    for row in rows:
        episode = row.get("episode_id") or "-"
        click.echo(
            f"{row['id']:22} {format_instant(row['at'])}  {row['bytes']:7} B  {episode[:40]:40}  {row['reason'][:100]}"
        )
    click.echo(f"{len(rows)} dead letter(s)", err=True)


def _dead_letter_command(verb: str, did: str, key: str, doc: str):
    """`engram-admin redrive` / `discard`: the dead letters named (or `--all`), with a progress bar."""

    @click.command(verb, help=doc)
    @click.argument("ids", nargs=-1)
    @click.option(
        "--all", "all_", is_flag=True, help=f"{verb.capitalize()} every dead letter (instead of naming IDS)."
    )
    @progress_option
    @json_option
    def command(ids: tuple[str, ...], all_: bool, progress: bool | None, as_json: bool) -> None:
        if not ids and not all_:
            raise click.UsageError("name dead-letter ids or pass --all")
        if ids and all_:
            raise click.UsageError("name dead-letter ids or pass --all, not both")
        bars = Bars(enabled=progress, units={verb: "letter"})
        start = time.perf_counter()
        try:
            n, unknown = run_admin(
                verb,
                _on_dead_letters(verb, _settings(verb), None if all_ else list(ids), bars),
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
                f"no dead letter has the id(s) {', '.join(unknown)} (see `engram-admin dead-letters` for the ids)"
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


@click.command("rotate-master-key")
@click.option(
    "--new-key-file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="File holding the new master key (base64 of 32 bytes).",
)
def rotate_master_key(new_key_file: str) -> None:
    """Re-wrap every data key (and the deployment secret) from the current master key
    (ENGRAM_MASTER_KEY or ENGRAM_MASTER_KEY_FILE) to the one in --new-key-file. Then restart every
    process with the new key and destroy the old one: backups taken before are unreadable from then on."""
    from shared.crypto import MasterKey, read_master_key_file
    from shared.keyring import KeyRing

    settings = _settings("rotate-master-key")
    if settings.master_key is None:
        raise click.ClickException(
            "set ENGRAM_MASTER_KEY or ENGRAM_MASTER_KEY_FILE to the current master key"
        )
    try:
        new = MasterKey(read_master_key_file(new_key_file, name="--new-key-file"))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    old = MasterKey(settings.master_key)
    if new.id == old.id:
        raise click.ClickException("--new-key-file holds the current master key")

    async def go():
        async with connected(settings) as redis:
            keys = await deployment_keys(redis, settings.keys)  # its data keys' names
            counts = await KeyRing(keys, old).rotate(redis, new)
        click.echo(json.dumps({"from_master_key": old.id, "to_master_key": new.id, **counts}))

    run_admin("rotate-master-key", go())  # a key wrapped by a third master key: Conflict, exit 2


@click.command("erase-now")
def erase_now() -> None:
    """Run the erasure housekeeping now (it runs by itself after forgets, at most every
    ENGRAM_ERASURE_INTERVAL): compact the stream, then rewrite the AOF, so that the bytes of forgotten
    entries leave Redis's memory and files. Prints what it did, with timings, as JSON."""
    from services.consolidator import erasure

    settings = _settings("erase-now")

    async def go():
        async with connected(settings) as redis:
            keys = await deployment_keys(redis, settings.keys)  # every partition it has
            click.echo(json.dumps(await erasure.run(redis, keys)))

    run_admin("erase-now", go())


@click.group()
def cli() -> None:
    """Engram's operator commands: the stack, and tasks on its Redis (REDIS_URL, default `make run`'s)."""


for _command in (run, replay, reindex, dead_letters, redrive, discard, rotate_master_key, erase_now):
    cli.add_command(_command)


def main() -> None:
    """The `engram-admin` console script."""
    cli(prog_name="engram-admin")


if __name__ == "__main__":
    main()
