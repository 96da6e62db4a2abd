"""`python -m services.consolidator [run|dead-letters|redrive|discard|replay|reindex|rotate-master-key|erase-now]`.

`run` (the default) is the worker; the others are operator tasks, in their JSON-only form (the
operator's command line is `engram-admin`, services/admin.py: progress bars, human summaries;
`rotate-master-key` and `erase-now` are its commands, registered here too).

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

from engram_episodic.errors import ConfigError, Conflict
from services.admin import erase_now, refuse, rotate_master_key, run_admin
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
            embedder=embedder,
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
    """List dead letters as JSON lines (id, original stream id, reason). Also `engram-admin dead-letters`."""
    from services.consolidator import admin

    for row in run_admin("dead-letters", admin.dead_letters(_settings(), limit)):
        click.echo(json.dumps(row))


@cli.command()
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Re-drive every dead letter.")
def redrive(ids: tuple[str, ...], all_: bool) -> None:
    """Publish dead letters again (after a fix) and remove them from the dead-letter stream. Also
    `engram-admin redrive`, with a progress bar."""
    _on_dead_letters("redrive", "re-driven", ids, all_)


@cli.command()
@click.argument("ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Discard every dead letter.")
def discard(ids: tuple[str, ...], all_: bool) -> None:
    """Delete dead letters no fix will make projectable, with their original entries (nothing is
    published). Also `engram-admin discard`."""
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
    """Rebuild every projection from the stream into a new generation and swap it in. Also `engram-admin
    replay`, with a progress bar."""
    _replay("replay")


@cli.command()
@click.option("--embedder", type=click.Choice(["hashing", "minilm", "mpnet", "openai"]), required=True)
def reindex(embedder: str) -> None:
    """Re-embed everything with another embedder (a replay into a new index), swapping the alias."""
    _replay("reindex", embedder=embedder)


# the operator's key commands are `engram-admin`'s (services/admin.py), here under the same names
cli.add_command(rotate_master_key)
cli.add_command(erase_now)


if __name__ == "__main__":
    cli()
