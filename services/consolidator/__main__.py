"""`python -m services.consolidator [run]`: the worker process (`make run` and compose start it).

The operator's tasks on a deployment (replay, reindex, dead letters, key rotation, erasure) are
`engram-admin`'s (services/admin.py).

Environment → Settings once, here; everything below receives it. SIGTERM/SIGINT stop the worker
gracefully (the batch in hand is projected and acked, then exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys

import uvloop

from engram_episodic.errors import ConfigError, Conflict
from shared import tracing
from shared.logs import configure, line
from shared.settings import Settings

LOGGER = "engram.consolidator"


async def _run(settings: Settings) -> int:
    from services.consolidator.facts import Consolidator
    from services.consolidator.health import Health, start_operations
    from services.consolidator.metrics import WorkerMetrics
    from services.consolidator.summarizer import Summarizer
    from services.consolidator.worker import Worker
    from shared.embedding import loaded_embedder
    from shared.redis_conn import connected

    log = logging.getLogger(LOGGER)
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
        redis = await stack.enter_async_context(connected(settings))
        embedder = await loaded_embedder(stack, settings, wait=True)
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
            backlogged=lambda: worker is not None and worker.backlogged,
        )
        stack.push_async_callback(facts.aclose)
        worker = Worker(settings, redis, embedder, metrics=metrics, on_batch=facts.on_batch)
        health.worker = worker
        # what is loaded lives as long as the process: frozen, the collector's full passes skip it
        # (40-75 ms each with the loop stopped, 3-5 ms frozen)
        gc.freeze()
        try:
            await worker.run(stop)
        except (Conflict, ConfigError) as exc:  # another embedder's index, another master key, no master key
            log.error("%s", exc)
            return 2
    return 0


def main(argv: list[str]) -> int:
    """Consume the stream until SIGTERM/SIGINT (scale out by running more copies); the exit code (2: a
    configuration error, said on stderr)."""
    fmt = configure(os.environ)
    try:
        if argv not in ([], ["run"]):
            raise ConfigError(
                f"unknown arguments {' '.join(argv)!r}: usage: python -m services.consolidator [run]"
            )
        settings = Settings.from_env(os.environ)
        if settings.redis_url is None:
            raise ConfigError(
                "REDIS_URL is not set: start the stack with `make run`, or point "
                "REDIS_URL at a Redis 8 with the Query Engine"
            )
    except ConfigError as exc:
        print(line(fmt, f"engram consolidator: {exc}", logger=LOGGER, level=logging.ERROR), file=sys.stderr)
        return 2
    tracing.configure(
        "engram-consolidator", os.environ
    )  # on with OTEL_EXPORTER_OTLP_ENDPOINT and the otel extra
    try:
        # uvloop: the worker is Python-bound per event; libuv's loop trims the I/O share (bench/perf.py)
        return uvloop.run(_run(settings))
    finally:
        tracing.shutdown()  # the spans still in the exporter's batch


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
