"""`python -m services.query`: read the environment once, then serve the API."""

from __future__ import annotations

import logging
import os
import sys

import uvloop

from engram_episodic.errors import ConfigError, Conflict
from services.query.app import make_app
from services.query.appkeys import STARTUP
from services.query.auth import check_bind
from services.query.server import serve
from shared import tracing
from shared.logs import configure, line
from shared.settings import Settings

log = logging.getLogger("engram.query")


def main() -> int:
    fmt = configure(os.environ)
    try:
        settings = Settings.from_env(os.environ)
        if not settings.redis_url:
            raise ConfigError(
                "REDIS_URL is not set; start the whole stack with `make run`, "
                "or set REDIS_URL=redis://host:port/0"
            )
        check_bind(settings.host, settings.api_keys)
    except (ConfigError, ValueError) as exc:
        print(line(fmt, f"engram query: {exc}", logger=log.name, level=logging.ERROR), file=sys.stderr)
        return 2
    tracing.configure("engram-query", os.environ)  # on with OTEL_EXPORTER_OTLP_ENDPOINT and the otel extra
    try:
        # uvloop: libuv's loop cuts the per-request overhead of aiohttp and redis-py (bench/perf.py);
        # serve(), not web.run_app: its runner answers unparseable requests without quoting them
        app = make_app(settings, background_start=True)  # the port opens before the model loads
        serve(
            app,
            host=settings.host,
            port=settings.port,
            loop=uvloop.new_event_loop(),
            on_ready=lambda: print(
                line(
                    fmt,
                    f"engram query ◆ listening on http://{settings.host}:{settings.port}",
                    logger=log.name,
                ),
                flush=True,
            ),
            watch=app[STARTUP].wait,
        )
    # e.g. the index was built with another embedder, or the deployment has another number of stream
    # partitions (met once Redis answers, after the port opened): say so, no traceback, exit 2
    except (Conflict, ConfigError) as exc:
        print(line(fmt, f"engram query: {exc}", logger=log.name, level=logging.ERROR), file=sys.stderr)
        return 2
    finally:
        tracing.shutdown()  # the spans still in the exporter's batch
    return 0


if __name__ == "__main__":
    sys.exit(main())
