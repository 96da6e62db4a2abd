"""`make run`: the whole stack in the foreground — embedded Redis, the consolidator, the query service.

Ctrl-C (or SIGTERM) stops the services gracefully (SIGTERM, then a grace period), then Redis.
With `REDIS_URL` set, no embedded Redis is started and that server is used instead.

Environment (besides every `ENGRAM_*` setting): `ENGRAM_REDIS_PORT` (embedded Redis port, default
6390), `ENGRAM_DATA_DIR` (default `.run`), `ENGRAM_WORKERS` (consolidator processes, default 1;
with `ENGRAM_METRICS_PORT` set, worker i serves its metrics on that port + i).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from deploy.embedded_redis import EmbeddedRedis, EmbeddedRedisError
from engram_episodic.errors import ConfigError
from services.query.auth import check_bind
from shared.settings import Settings, env_int

GRACE_SECONDS = 15.0
MAX_REDIS_RESTARTS = 5
"""Restarts of a dead embedded Redis before the supervisor gives up and stops the stack."""


def _taken_port(host: str, port: int) -> str | None:
    """Why `host:port` cannot be bound now (e.g. "Address already in use"), or None when it can."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.create_server((host.strip("[]"), port), family=family):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def main() -> int:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:  # every process would refuse a bad variable; say it once, before starting any (new-user trial)
        settings = Settings.from_env(env)
        workers = env_int(env, "ENGRAM_WORKERS", 1, 1, 64)
        redis_port = env_int(env, "ENGRAM_REDIS_PORT", 6390, 1, 65535)
    except ConfigError as exc:
        print(f"engram: {exc}", file=sys.stderr)
        return 2
    try:
        check_bind(settings.host, settings.api_keys)
    except ValueError as exc:
        print(f"engram: {exc}", file=sys.stderr)
        return 2
    if not env.get("REDIS_URL") and settings.port == redis_port:
        print(f"engram: ENGRAM_PORT and ENGRAM_REDIS_PORT are both {redis_port}; choose two ports", file=sys.stderr)
        return 2
    metrics_port = settings.metrics_port
    taken = {settings.port: "ENGRAM_PORT", redis_port: "ENGRAM_REDIS_PORT"}
    for i in range(workers if metrics_port else 0):
        # say it now, instead of a traceback from whichever process binds second
        clash = taken.get(metrics_port + i) or ("beyond 65535" if metrics_port + i > 65535 else None)
        if clash:
            print(f"engram: worker {i} would serve metrics on ENGRAM_METRICS_PORT + {i} = {metrics_port + i}, "
                  f"which is {'also ' + clash if clash in taken.values() else clash}; with ENGRAM_WORKERS={workers} "
                  f"choose ENGRAM_METRICS_PORT so that {metrics_port}..{metrics_port + workers - 1} is free",
                  file=sys.stderr)
            return 2
    busy = _taken_port(settings.host, settings.port)
    if busy:  # the query service would find out after the model loaded, with a traceback (new-user trial)
        print(f"engram: ENGRAM_PORT={settings.port} on {settings.host} is not free ({busy}); choose another",
              file=sys.stderr)
        return 2
    redis_server = None
    if not env.get("REDIS_URL"):
        data_dir = Path(env.get("ENGRAM_DATA_DIR", ".run")) / "redis"
        redis_server = EmbeddedRedis(port=redis_port, data_dir=data_dir)
        try:
            redis_server.start()
        except (EmbeddedRedisError, OSError) as exc:  # OSError: e.g. ENGRAM_DATA_DIR under a file
            print(f"engram: cannot start the embedded Redis (ENGRAM_DATA_DIR={data_dir.parent}, "
                  f"ENGRAM_REDIS_PORT={redis_port}): {exc}", file=sys.stderr)
            return 1
        env["REDIS_URL"] = redis_server.url
        print(f"engram ◆ redis {redis_server.url} (data in {redis_server.data_dir})", flush=True)
    procs: list[tuple[str, subprocess.Popen]] = []
    for i in range(workers):
        # one Prometheus port per process: worker i serves ENGRAM_METRICS_PORT + i (two on one port
        # crashed the second, found by a new-user trial)
        worker_env = {**env, "ENGRAM_METRICS_PORT": str(metrics_port + i)} if metrics_port else env
        procs.append((f"consolidator-{i}", subprocess.Popen([sys.executable, "-m", "services.consolidator"],
                                                            env=worker_env)))
    procs.append(("query", subprocess.Popen([sys.executable, "-m", "services.query"], env=env)))
    host, port = settings.host, settings.port
    print(f"engram ◆ query service on http://{host}:{port} (try GET /readyz) ◆ Ctrl-C stops everything",
          flush=True)
    stopping = {"now": False}

    def _stop(*_):
        stopping["now"] = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    code = 0
    restarts = 0
    while not stopping["now"]:
        if redis_server is not None and redis_server.process is not None and redis_server.process.poll() is not None:
            # The workers and the query service reconnect on their own; the AOF brings the data back.
            print(f"engram ◆ redis exited with {redis_server.process.returncode}:\n{redis_server.log_tail(5)}",
                  file=sys.stderr, flush=True)
            restarts += 1
            if restarts > MAX_REDIS_RESTARTS:
                print(f"engram ◆ redis died {restarts} times; stopping the stack", file=sys.stderr, flush=True)
                stopping["now"] = True
                code = 1
                break
            if redis_server.process.stderr:
                redis_server.process.stderr.close()
            try:
                redis_server.start()
                print(f"engram ◆ redis restarted on {redis_server.url} (restart {restarts} of at most "
                      f"{MAX_REDIS_RESTARTS})", file=sys.stderr, flush=True)
            except EmbeddedRedisError as exc:
                print(f"engram ◆ cannot restart redis: {exc}; stopping the stack", file=sys.stderr, flush=True)
                stopping["now"] = True
                code = 1
                break
        for name, proc in procs:
            if proc.poll() is not None:
                print(f"engram ◆ {name} exited with {proc.returncode}; stopping the stack", file=sys.stderr)
                stopping["now"] = True
                code = proc.returncode or 1
        time.sleep(0.2)
    for _, proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    for name, proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"engram ◆ {name} did not stop in {GRACE_SECONDS:g}s; killing it", file=sys.stderr)
            proc.kill()
            proc.wait()
    if redis_server is not None:
        redis_server.stop()
    print("engram ◆ stopped", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
