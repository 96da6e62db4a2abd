"""`python -m services.consolidator [run|dead-letters|redrive|discard|replay|reindex|rotate-master-key|erase-now]`.

Environment → Settings once, here; everything below receives it. SIGTERM/SIGINT stop the worker
gracefully (the batch in hand is projected and acked, then exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys

import click
import uvloop

from engram_episodic.cli_admin import refuse, run_admin
from engram_episodic.errors import ConfigError, Conflict
from shared import tracing
from shared.logs import configure
from shared.settings import Settings
from shared.supervised import follow_supervisor


def _settings(**overrides) -> Settings:
    try:
        settings = Settings.from_env(os.environ)
    except ConfigError as exc:
        refuse(click.get_current_context().info_name or "run", str(exc))
    if settings.redis_url is None:
        raise click.ClickException(
            "REDIS_URL is not set: start the stack with `make run`, or point "
            "REDIS_URL at a Redis 8 with the Query Engine"
        )
    return settings.with_(**{k: v for k, v in overrides.items() if v is not None})


def _redis(settings: Settings):
    from services.consolidator.admin import redis_of

    return redis_of(settings)


async def _open(stack: contextlib.AsyncExitStack, settings: Settings):
    from services.consolidator.admin import open_stack

    return await open_stack(stack, settings)


async def _run(settings: Settings) -> int:
    from services.consolidator.facts import Consolidator
    from services.consolidator.health import Health, start_operations
    from services.consolidator.metrics import WorkerMetrics
    from services.consolidator.summarizer import Summarizer
    from services.consolidator.worker import Worker

    log = logging.getLogger("engram.consolidator")
    # one exit stack owns every resource of the process, closed in reverse order however start-up ends
    async with contextlib.AsyncExitStack() as stack:
        metrics = WorkerMetrics()
        health = Health(stall=settings.health_stall)
        if settings.metrics_port:  # first: /healthz says "starting" while the model loads
            try:
                runner = await start_operations(
                    health, metrics.registry, host=settings.host, port=settings.metrics_port
                )
            except OSError as exc:
                log.error(
                    "ENGRAM_METRICS_PORT=%d on %s is not free (%s): give each consolidator process a port "
                    "of its own, or 0 for none",
                    settings.metrics_port,
                    settings.host,
                    exc.strerror or exc,
                )
                return 2
            stack.push_async_callback(runner.cleanup)
            log.info("health and metrics on http://%s:%d/healthz", settings.host, settings.metrics_port)
        redis, embedder = await _open(stack, settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        summarizer = Summarizer.from_settings(settings, failures_metric=metrics.summarizer_failures)
        if summarizer is not None:
            stack.push_async_callback(summarizer.aclose)
        worker: Worker | None = None
        facts = Consolidator(
            settings,
            redis,
            embedder.dim,
            summarizer=summarizer,
            background=True,
            backlogged=lambda: worker is not None and worker.backlogged,
        )
        stack.push_async_callback(facts.aclose)
        worker = Worker(settings, redis, embedder, metrics=metrics, on_batch=facts.on_batch)
        health.worker = worker
        # Everything loaded so far (modules, the model, clients) lives as long as the process: freezing it
        # keeps the collector's full passes off it. Those passes took 40-75 ms each on this worker's heap,
        # with the event loop stopped and Redis left idle (seen as gaps in `make bench`'s ingest); frozen,
        # 3-5 ms.
        gc.freeze()
        try:
            await worker.run(stop)
        except (Conflict, ConfigError) as exc:  # another embedder's index, another master key, no master key
            log.error("%s", exc)
            return 2
    return 0


@click.group(invoke_without_command=True)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Engram consolidator: projects the episode stream into RediSearch."""
    configure(os.environ)
    if ctx.invoked_subcommand is None:
        ctx.invoke(run)


@cli.command()
def run() -> None:
    """Consume the stream until SIGTERM/SIGINT (scale out by running more copies)."""
    # uvloop: the worker is Python-bound per event; libuv's loop trims the I/O share (bench/perf.py)
    settings = _settings()
    if not follow_supervisor(os.environ):  # started by a `make run` that is already gone
        raise click.ClickException("its `make run` is gone; exiting")
    tracing.configure(
        "engram-consolidator", os.environ
    )  # on with OTEL_EXPORTER_OTLP_ENDPOINT and the otel extra
    try:
        code = uvloop.run(_run(settings))
    finally:
        tracing.shutdown()  # the spans still in the exporter's batch
    sys.exit(code)


@cli.command("dead-letters")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1_000_000))
def dead_letters(limit: int) -> None:
    """List dead letters as JSON lines (id, original stream id, reason). Also `engram dead-letters`."""
    from services.consolidator import admin

    for row in run_admin("dead-letters", admin.dead_letters(_settings(), limit)):
        click.echo(json.dumps(row))


@cli.command()
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Re-drive every dead letter.")
def redrive(ids: tuple[str, ...], all_: bool) -> None:
    """Publish dead letters again (after a fix) and remove them from the dead-letter stream. Also
    `engram redrive`, with a progress bar."""
    _on_dead_letters("redrive", "re-driven", ids, all_)


@cli.command()
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Discard every dead letter.")
def discard(ids: tuple[str, ...], all_: bool) -> None:
    """Delete dead letters no fix will make projectable, with their original entries (nothing is
    published). Also `engram discard`."""
    _on_dead_letters("discard", "discarded", ids, all_)


def _on_dead_letters(verb: str, did: str, ids: tuple[str, ...], all_: bool) -> None:
    """`admin.<verb>` on the dead letters `ids` or `--all` (exactly one of them), said in one line."""
    from services.consolidator import admin

    if not ids and not all_:
        raise click.UsageError("name dead-letter ids or pass --all")
    if ids and all_:  # which one was meant? (--all re-drove everything and ignored the ids)
        raise click.UsageError("name dead-letter ids or pass --all, not both")
    n, unknown = run_admin(verb, getattr(admin, verb)(_settings(), None if all_ else list(ids)))
    # a bare "0" beside "no dead letter has the id" read as a contradiction
    named = f" of the {len(ids)} named" if unknown else ""
    click.echo(f"{did} {n}{named} dead letter(s)")
    if unknown:  # a typo must not look like success
        raise click.ClickException(
            f"no dead letter has the id(s) {', '.join(unknown)} (see `dead-letters` for the ids)"
        )


def _replay(command: str, **overrides) -> None:
    from services.consolidator import admin

    coro = admin.replay(_settings(**overrides), keep_embedder=command == "replay")
    click.echo(json.dumps(run_admin(command, coro)))


@cli.command()
def replay() -> None:
    """Rebuild every projection from the stream into a new generation and swap it in. Also `engram
    replay`, with a progress bar."""
    _replay("replay")


@cli.command()
@click.option("--embedder", type=click.Choice(["hashing", "minilm", "mpnet", "openai"]), required=True)
def reindex(embedder: str) -> None:
    """Re-embed everything with another embedder (a replay into a new index), swapping the alias."""
    _replay("reindex", embedder=embedder)


@cli.command("rotate-master-key")
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
    from shared.partitions import deployment_keys

    settings = _settings()
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
        async with _redis(settings) as redis:
            keys = await deployment_keys(redis, settings.keys)  # its data keys' names
            counts = await KeyRing(keys, old).rotate(redis, new)
        click.echo(json.dumps({"from_master_key": old.id, "to_master_key": new.id, **counts}))

    try:
        run_admin("rotate-master-key", go())
    except Conflict as exc:  # a key wrapped by a third master key
        raise click.ClickException(str(exc)) from None


@cli.command("erase-now")
def erase_now() -> None:
    """Run the erasure housekeeping now (it runs by itself after forgets, at most every
    ENGRAM_ERASURE_INTERVAL): compact the stream, then rewrite the AOF, so that the bytes of forgotten
    entries leave Redis's memory and files; with the master key, entries written before encryption are
    sealed on the way. Prints what it did, with timings, as JSON."""
    from services.consolidator import erasure
    from shared.crypto import MasterKey
    from shared.keyring import KeyRing
    from shared.partitions import deployment_keys

    async def go():
        settings = _settings()
        async with _redis(settings) as redis:
            keys = await deployment_keys(redis, settings.keys)  # every partition it has
            ring = KeyRing(keys, MasterKey(settings.master_key)) if settings.master_key else None
            click.echo(json.dumps(await erasure.run(redis, keys, ring)))

    run_admin("erase-now", go())


if __name__ == "__main__":
    cli()
