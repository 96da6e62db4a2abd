"""`make run`: the whole stack in the foreground — embedded Redis, the consolidator, the query service.

Ctrl-C (or SIGTERM) stops the services gracefully (SIGTERM, then a grace period), then Redis.
With `REDIS_URL` set, no embedded Redis is started and that server is used instead.

One `make run` per data directory: it holds an exclusive lock (`fcntl.flock`) on
`ENGRAM_DATA_DIR/run.lock` while it runs (the embedded Redis and every service inherit it, so what a
killed `make run` leaves behind keeps it, and is named), and a second one is refused with exit code 3
before it starts anything. The consolidators and the query service get SIGTERM when the supervisor
dies (shared/supervised.py); the embedded Redis stays up, holding the data until it is stopped.

A process that dies is restarted (see `Supervisor`): a worker or the query service after an exponential
backoff, the embedded Redis (or a node of the embedded cluster) at once, from its append-only file. The
stack stops only when one of them dies `ENGRAM_RESTART_LIMIT` times in a row, each within
`ENGRAM_RESTART_WINDOW` of its start (exit code 1: a crash loop, however slowly the process starts),
when a service exits with code 2 (a configuration error, e.g. an embedder other than the index's:
restarting cannot fix it; exit code 2 with the service's message), or when a service exits with code 0
on its own (stopped by hand; exit code 1). The exit codes are `python -m services.run`'s: `make` prints it
(`make: *** [Makefile:…: run] Error 3`) and then exits 2 itself, whatever the code was.

Environment (besides every `ENGRAM_*` setting): `ENGRAM_REDIS_PORT` (embedded Redis, 6390),
`ENGRAM_DATA_DIR` (`.run`, per Redis port: `services.run_lock.run_data_dir`), `ENGRAM_WORKERS` (default
1; worker i serves `/healthz` and `/metrics` on `ENGRAM_METRICS_PORT` + i), `ENGRAM_RESTART_LIMIT`
(default 5) and `ENGRAM_RESTART_WINDOW` (default `60s`). Every port is checked before anything starts.
"""

from __future__ import annotations

import signal

if __name__ == "__main__":  # not when imported (by the tests): the importer's Ctrl-C is its own
    # Ctrl-C while the imports below load (~0.6 s) ends the process quietly instead of with a
    # KeyboardInterrupt traceback: nothing is started yet; main() installs its own handlers
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from deploy.embedded_redis import EmbeddedCluster, EmbeddedRedis, EmbeddedRedisError
from engram_episodic.errors import ConfigError
from services.query.auth import check_bind
from services.run_lock import DataDirBusy, busy_message, lock_data_dir, run_data_dir
from shared import logs
from shared.settings import Settings, env_int, parse_duration
from shared.supervised import SUPERVISOR_PID

GRACE_SECONDS = 15.0
RESTART_LIMIT = 5
"""Deaths in a row of one process, each within `RESTART_WINDOW` of its start, that stop the stack
(`ENGRAM_RESTART_LIMIT`)."""
RESTART_WINDOW = 60.0
"""Seconds a process must stay up for its death not to count toward a crash loop
(`ENGRAM_RESTART_WINDOW`): one that stayed up that long has its whole budget again (the embedded Redis
too)."""
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 10.0
"""A dead worker or query service is restarted after BACKOFF_FIRST * 2^(deaths in a row - 1)
seconds, at most BACKOFF_MAX."""
EXIT_CONFIG = 2
"""The exit code of a configuration error (any process of the stack): never restarted."""
EXIT_LOCKED = 3
"""`make run`'s exit code when another `make run` holds the data directory."""
TAIL_BYTES = 8192


def _taken_port(host: str, port: int) -> str | None:
    """Why `host:port` cannot be bound now (e.g. "Address already in use"), or None when it can."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.create_server((host.strip("[]"), port), family=family):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def describe_exit(code: int) -> str:
    """`exit code 1`, `killed by SIGKILL`."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class CrashBudget:
    """The deaths in a row of one process that each came within `window` seconds of its start;
    `exhausted` at `limit` of them. Counted by the run's length, not by deaths per window of wall time:
    a process that needs 13 s to load its model and then crashes dies at most ~4 times a minute with
    the backoff, so a count over the last `window` seconds never reached 5 and a crash loop ran for 11
    minutes. A death after a run of `window` or longer is not counted and makes the budget whole
    again: that process was up, not crash-looping."""

    def __init__(self, limit: int, window: float):
        self.limit, self.window = limit, window
        self.deaths = 0
        self.last_run = 0.0  # seconds the process that died last was up

    def record(self, now: float, started: float) -> int:
        """Count the death at `now` (time.monotonic()) of the run started at `started`; returns the
        deaths in a row so far: this one included when the run was shorter than `window`, 0 after a
        longer run (the count starts over)."""
        self.last_run = now - started
        self.deaths = 0 if self.last_run >= self.window else self.deaths + 1
        return self.deaths

    @property
    def exhausted(self) -> bool:
        return self.deaths >= self.limit

    def backoff(self) -> float:
        """Seconds to wait before the next restart: BACKOFF_FIRST, doubled with each death in a row."""
        return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** max(0, self.deaths - 1))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class StderrRelay:
    """Copies a child's stderr to ours as it comes and keeps its last bytes, so the supervisor can repeat
    the child's last words when it exits. A thread always reads: a pipe nobody reads freezes the child
    once it fills (docs/reliability.md)."""

    def __init__(self, pipe):
        self._pipe = pipe
        self._tail = bytearray()
        self._thread = threading.Thread(target=self._run, name="stderr-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fd = self._pipe.fileno()
        try:
            while chunk := os.read(fd, 65536):
                self._tail += chunk
                del self._tail[:-TAIL_BYTES]
                with contextlib.suppress(OSError):  # our stderr closed: keep draining the child's
                    _write_all(2, chunk)
        except OSError:
            pass
        finally:
            self._pipe.close()

    def last_line(self, timeout: float = 1.0) -> str:
        """The child's last non-blank stderr line (after it exited: waits up to `timeout` for the rest)."""
        self._thread.join(timeout)
        return last_words(bytes(self._tail).decode(errors="replace"))


_FRAME = re.compile(r"[\s|+\-~^\d]*")
"""A line of a traceback's drawing only: an ExceptionGroup's `+-+---- 1 ----` and `+-----` frames, the
`~~~^^^` markers under a failing expression."""


def last_words(text: str) -> str:
    """The last line of `text` (a child's stderr) that says something: the exception's message at the
    end of a traceback, an ExceptionGroup's `| RuntimeError: ...` without its `|` margin, skipping the
    lines that only draw the frame (else a death reads `died, exit code 1: +-----------`). At
    most 500 characters; "" when no line says anything."""
    for line in reversed(text.splitlines()):
        if not _FRAME.fullmatch(line):
            return line.strip().lstrip("|").strip()[:500]
    return ""


def _in_a_row(budget: CrashBudget) -> str:
    """What a restart line says of the budget: "2 death(s) in a row within 60s of starting; the stack
    stops at 5", or after a long run "up 75s, longer than 60s: not a crash loop, the count starts over"."""
    if budget.deaths == 0:
        return f"up {budget.last_run:.0f}s, longer than {budget.window:g}s: not a crash loop, the count starts over"
    return (
        f"{budget.deaths} death(s) in a row within {budget.window:g}s of starting; the stack stops at "
        f"{budget.limit}"
    )


class Service:
    """A worker or the query service: its command, environment, process and crash budget."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        budget: CrashBudget,
        pass_fds: tuple[int, ...] = (),
    ):
        self.name, self.argv, self.env, self.budget = name, argv, env, budget
        # the data dir's lock: held by every process of the stack, so a supervisor killed with SIGKILL
        # leaves the lock held (and named: services/run_lock.py) until its last child is gone
        self.pass_fds = pass_fds
        self.proc: subprocess.Popen | None = None
        self.relay: StderrRelay | None = None
        self.restarts = 0
        self.restart_at: float | None = None  # set while it waits out its backoff
        self.started = 0.0  # time.monotonic() of the last start: a short run's death counts (CrashBudget)

    def start(self) -> subprocess.Popen:
        # a session of its own: the terminal's Ctrl-C reaches the supervisor alone, which stops the
        # services with SIGTERM (a Ctrl-C sent to them all hit them mid-import: KeyboardInterrupt tracebacks)
        self.proc = proc = subprocess.Popen(
            self.argv, env=self.env, stderr=subprocess.PIPE, pass_fds=self.pass_fds, start_new_session=True
        )
        self.relay = StderrRelay(proc.stderr)
        self.restart_at = None
        self.started = time.monotonic()
        return proc

    @property
    def running(self) -> bool:
        return self.proc is not None and self.restart_at is None and self.proc.poll() is None


LOG = {"format": "text"}
"""`ENGRAM_LOG_FORMAT` of this process, set once by `main()`: how `_say` and `_refuse` write."""


def _say(message: str, *, err: bool = True, level: int = logging.INFO) -> None:
    """One line of the supervisor's own: `engram ◆ message`, or with ENGRAM_LOG_FORMAT=json the JSON
    object a logger `engram.run` would write (so a log pipeline reads every line of the stack)."""
    text = (
        f"engram ◆ {message}"
        if LOG["format"] == "text"
        else logs.line("json", message, logger="engram.run", level=level)
    )
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def _refuse(message: str) -> None:
    """Why the stack does not start (`engram: ...`, on stderr), in the same format as `_say`."""
    if LOG["format"] == "json":
        message = logs.line(
            "json", message.removeprefix("engram: "), logger="engram.run", level=logging.ERROR
        )
    print(message, file=sys.stderr, flush=True)


def _probe_url(host: str, port: int, path: str) -> str:
    """The URL to probe a local service bound to `host` (a wildcard bind is probed on loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


def _probe(url: str) -> tuple[int, dict] | None:
    """(status, JSON body) of GET `url`, or None when nothing answers yet."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:  # 503 while loading: its body says what is pending
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except (OSError, ValueError):
        return None


class Progress(threading.Thread):
    """Says, a line per step, when each service first answers, what it still loads, and when it is
    ready, in seconds since `make run` started (`started`, time.monotonic()); then that the stack is.

    `probes` maps a service's name to its readiness URL (the query service's `/readyz`, a worker's
    `/healthz`). Only the first start is followed: restarts say so themselves (`Supervisor`). A service
    still loading is said again every STILL seconds (a first start unpacks and exports the model for
    tens of seconds: silence that long looks hung)."""

    STILL = 15.0

    def __init__(self, started: float, probes: dict[str, str]):
        super().__init__(name="progress", daemon=True)
        self.started, self.probes = started, dict(probes)
        self.done = threading.Event()

    def run(self) -> None:
        waiting, said = dict(self.probes), dict[str, tuple[list, float]]()
        while waiting and not self.done.is_set():
            for name, url in list(waiting.items()):
                got = _probe(url)
                if got is None:
                    continue
                status, body = got
                elapsed = time.monotonic() - self.started
                if status == 200:
                    _say(f"{name} ready in {elapsed:.1f}s", err=False)
                    del waiting[name]
                    continue
                pending = body.get("pending") or [body.get("status", f"HTTP {status}")]
                what, (was, at) = ", ".join(map(str, pending)), said.get(name, (None, 0.0))
                if was == pending and elapsed - at < self.STILL:
                    continue
                said[name] = (pending, elapsed)
                line = f"answering at {elapsed:.1f}s; loading {what}" if was != pending else "still loading"
                _say(f"{name} {line}" + (f" {what} at {elapsed:.0f}s" if was == pending else ""), err=False)
            self.done.wait(0.25)
        if not waiting and not self.done.is_set():
            _say(
                f"stack ready in {time.monotonic() - self.started:.1f}s ◆ Ctrl-C stops everything",
                err=False,
            )


class RedisProcess:
    """One embedded redis-server the supervisor watches (the Redis, or a node of the embedded
    cluster, named `redis node <port>`): its crash budget, restarts and last start."""

    def __init__(self, server: EmbeddedRedis, budget: CrashBudget, name: str = "redis"):
        self.server, self.budget, self.name = server, budget, name
        self.restarts = 0
        self.started = time.monotonic()  # started just before the supervisor (CrashBudget)


class Supervisor:
    """Watches the embedded Redis (or every node of the embedded cluster) and the services until
    `stop()`; returns the stack's exit code.

    A worker or the query service that dies is restarted after `CrashBudget.backoff()`; an embedded
    Redis process is restarted at once. Each death is logged with its cause (exit code or signal), the
    restart number and the short-lived deaths in a row. See the module docstring for what stops the stack.
    """

    def __init__(self, services: list[Service], redis: list[RedisProcess]):
        self.services, self.redis = services, redis
        self.stopping = False

    def stop(self, *_) -> None:
        self.stopping = True

    def run(self) -> int:
        while not self.stopping:
            code = None
            for node in self.redis:
                code = code if code is not None else self._check_redis(node)
            for service in self.services:
                if code is None and not self.stopping:
                    code = self._check(service)
            if code is not None:
                return code
            time.sleep(0.2)
        return 0

    def _check_redis(self, node: RedisProcess) -> int | None:
        server, name = node.server, node.name
        if server.process is None or server.process.poll() is None:
            return None
        # The workers and the query service reconnect on their own; the AOF brings the data back (a
        # cluster node its slots and peers too, from its nodes.conf).
        _say(f"{name} {describe_exit(server.process.returncode)}:\n{server.log_tail(5)}")
        deaths = node.budget.record(time.monotonic(), node.started)
        if node.budget.exhausted:
            _say(
                f"{name} died {deaths} times in a row, each within {node.budget.window:g}s of its "
                f"start; stopping the stack"
            )
            return 1
        if server.process.stderr:
            server.process.stderr.close()
        node.restarts += 1
        try:
            server.start()
        except EmbeddedRedisError as exc:
            if server.process is None or server.process.poll() is None:  # alive yet not ours to use
                _say(f"cannot restart {name}: {exc}; stopping the stack")
                return 1
            # it died again while starting (a request in flight can crash each new one at once):
            # a death like the others, counted by the next check, not the end of the stack
            node.started = time.monotonic()
            _say(f"{name} died while restarting (restart {node.restarts}); trying again")
            return None
        node.started = time.monotonic()
        _say(f"{name} restarted on {server.url} (restart {node.restarts}; {_in_a_row(node.budget)})")
        return None

    def _check(self, service: Service) -> int | None:
        now = time.monotonic()
        if service.restart_at is not None:
            if now >= service.restart_at:
                restarted = service.start()
                service.restarts += 1
                _say(f"{service.name} restarted (pid {restarted.pid}, restart {service.restarts})")
            return None
        proc = service.proc
        if proc is None:  # never started (a stop came first): nothing to watch
            return None
        code = proc.poll()
        if code is None:
            return None
        # a process that exited by itself usually said why last (a traceback's last line, a message);
        # one killed by a signal did not
        last = service.relay.last_line() if service.relay and code > 0 else ""
        said = f": {last}" if last else ""
        if code == EXIT_CONFIG:
            _say(
                f"{service.name} exited with code 2, a configuration error{said} — not restarting it; "
                f"stopping the stack"
            )
            return EXIT_CONFIG
        if code == 0:
            _say(f"{service.name} (pid {proc.pid}) exited with code 0 (stopped by hand?); stopping the stack")
            return 1
        deaths = service.budget.record(now, service.started)
        if service.budget.exhausted:
            _say(
                f"{service.name} died {deaths} times in a row, each within {service.budget.window:g}s of "
                f"its start (last: {describe_exit(code)}{said}); stopping the stack"
            )
            return 1
        delay = service.budget.backoff()
        service.restart_at = now + delay
        _say(
            f"{service.name} (pid {proc.pid}) died, {describe_exit(code)}{said} — restart {service.restarts + 1} "
            f"in {delay:g}s ({_in_a_row(service.budget)})"
        )
        return None

    def shutdown(self) -> None:
        """SIGTERM every running service, wait up to GRACE_SECONDS, then SIGKILL; then stop Redis."""
        running = [(s, s.proc) for s in self.services if s.proc is not None and s.running]
        for _, proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        for service, proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _say(f"{service.name} did not stop in {GRACE_SECONDS:g}s; killing it")
                proc.kill()
                proc.wait()
        for service in self.services:
            if service.relay is not None:
                service.relay.last_line(timeout=1.0)  # let the last words through before ours
        for node in self.redis:
            node.server.stop()


def _bind_problem(settings: Settings, env: Mapping[str, str], redis_port: int, workers: int) -> str | None:
    """Why the stack cannot listen where it is configured to (the message), or None."""
    try:
        check_bind(settings.host, settings.api_keys)
    except ValueError as exc:
        return f"engram: {exc}"
    if not env.get("REDIS_URL") and settings.port == redis_port:
        return f"engram: ENGRAM_PORT and ENGRAM_REDIS_PORT are both {redis_port}; choose two ports"
    return _metrics_port_clash(settings, redis_port, workers)


def _metrics_port_clash(settings: Settings, redis_port: int, workers: int) -> str | None:
    """Why a worker cannot serve metrics on ENGRAM_METRICS_PORT + its index (the message), or None."""
    metrics_port = settings.metrics_port
    taken = {settings.port: "ENGRAM_PORT", redis_port: "ENGRAM_REDIS_PORT"}
    for i in range(workers if metrics_port else 0):
        # say it now, instead of a traceback from whichever process binds second
        clash = taken.get(metrics_port + i) or ("beyond 65535" if metrics_port + i > 65535 else None)
        if clash:
            return (
                f"engram: worker {i} would serve metrics on ENGRAM_METRICS_PORT + {i} = {metrics_port + i}, "
                f"which is {'also ' + clash if clash in taken.values() else clash}; with ENGRAM_WORKERS={workers} "
                f"choose ENGRAM_METRICS_PORT so that {metrics_port}..{metrics_port + workers - 1} is free"
            )
    return None


def _taken_ports(settings: Settings, env: Mapping[str, str], redis_port: int, workers: int) -> str | None:
    """Why a port the stack is about to listen on is not free (the message), or None.

    Said up front: otherwise the query service found out after its model loaded (a traceback), the
    embedded Redis after 50 lines of its own log and six restarts, a worker after its model loaded."""
    busy = _taken_port(settings.host, settings.port)
    if busy:
        return f"engram: ENGRAM_PORT={settings.port} on {settings.host} is not free ({busy}); choose another"
    if not env.get("REDIS_URL"):
        busy = _taken_port("127.0.0.1", redis_port)
        if busy:
            return (
                f"engram: ENGRAM_REDIS_PORT={redis_port} on 127.0.0.1 is not free ({busy}); choose another, "
                f"or set REDIS_URL to use a Redis that is already running"
            )
    for i in range(workers if settings.metrics_port else 0):
        port = settings.metrics_port + i
        busy = _taken_port(settings.host, port)
        if busy:
            which = "ENGRAM_METRICS_PORT" + (f" + {i}" if i else "")
            return (
                f"engram: {which}={port} on {settings.host} is not free ({busy}); it is consolidator-{i}'s "
                f"/healthz and /metrics: choose another, or 0 for none"
            )
    return None


def _ensure_master_key(env: dict[str, str], data_root: Path) -> None:
    """Without a master key set, ENGRAM_MASTER_KEY_FILE becomes the data dir's (the stream is always
    sealed, on an embedded cluster too: its publish checks live in each stream partition's slot)."""
    if not env.get("ENGRAM_MASTER_KEY") and not env.get("ENGRAM_MASTER_KEY_FILE"):
        from shared.crypto import generate_master_key_file  # 0600, created once, never overwritten

        env["ENGRAM_MASTER_KEY_FILE"] = str(generate_master_key_file(data_root / "master.key").resolve())
        _say(f"master key {env['ENGRAM_MASTER_KEY_FILE']} (without it the stream is unreadable)", err=False)


def _restart_window(env: Mapping[str, str]) -> float:
    raw_window = env.get("ENGRAM_RESTART_WINDOW")
    return parse_duration(raw_window, name="ENGRAM_RESTART_WINDOW") if raw_window else RESTART_WINDOW


def _start_cluster(data_root: Path, size: int, port: int, lock_fd: int) -> EmbeddedCluster | None:
    """`ENGRAM_REDIS_CLUSTER=N`: an embedded cluster of N primaries on ports `port`..., for development,
    its data (AOF, nodes.conf) kept in `ENGRAM_DATA_DIR/cluster/<port>` across starts. None when it
    did not start (said on stderr)."""
    cluster = EmbeddedCluster(
        data_dir=data_root / "cluster",
        primaries=size,
        ports=list(range(port, port + size)),
        pass_fds=(lock_fd,),
    )
    try:
        cluster.start()
    except (EmbeddedRedisError, OSError) as exc:
        cluster.stop()
        _refuse(f"engram: cannot start the embedded cluster (ENGRAM_REDIS_PORT={port}): {exc}")
        return None
    _say(f"redis cluster {cluster.url} ({size} primaries, data in {cluster.data_dir})", err=False)
    return cluster


def _start_redis(
    env: dict[str, str], data_root: Path, cluster_size: int, redis_port: int, lock_fd: int
) -> list[tuple[str, EmbeddedRedis]] | None:
    """The embedded Redis (or, with `cluster_size`, cluster) unless REDIS_URL is set, which it then
    sets: [(name, server)] of each redis-server started, to supervise; None when it did not start
    (said on stderr)."""
    if env.get("REDIS_URL"):
        return []
    if cluster_size:
        cluster = _start_cluster(data_root, cluster_size, redis_port, lock_fd)
        if cluster is None:
            return None
        env["REDIS_URL"] = cluster.url
        return [(f"redis node {node.port}", node) for node in cluster.nodes]
    data_dir = data_root / "redis"
    redis_server = EmbeddedRedis(port=redis_port, data_dir=data_dir, pass_fds=(lock_fd,))
    _say(f"starting redis on port {redis_port} (data in {data_dir})", err=False)
    started = time.monotonic()
    try:
        redis_server.start()
    except (EmbeddedRedisError, OSError) as exc:
        redis_server.stop()  # one that did not answer in time is still running
        _refuse(
            f"engram: cannot start the embedded Redis (ENGRAM_DATA_DIR={data_root}, "
            f"ENGRAM_REDIS_PORT={redis_port}): {exc}"
        )
        return None
    env["REDIS_URL"] = redis_server.url
    _say(f"redis {redis_server.url} ready in {time.monotonic() - started:.1f}s", err=False)
    return [("redis", redis_server)]


def _services(
    env: dict[str, str],
    workers: int,
    metrics_port: int,
    restart_limit: int,
    restart_window: float,
    lock_fd: int,
) -> list[Service]:
    """The consolidators, then the query service, each with a crash budget of its own, the data dir's
    lock (`lock_fd`) and this process's pid as their supervisor (they go when it goes:
    shared/supervised.py)."""
    env = {**env, SUPERVISOR_PID: str(os.getpid())}
    services: list[Service] = []
    for i in range(workers):
        # one operations port per process: worker i serves ENGRAM_METRICS_PORT + i (two on one port
        # stop the second)
        worker_env = {**env, "ENGRAM_METRICS_PORT": str(metrics_port + i)} if metrics_port else dict(env)
        # one consumer name per slot, kept across restarts: a worker restarted after a crash reads its
        # predecessor's unacked entries at once (`Worker`'s own-pending pass) instead of after the lease
        base = env.get("ENGRAM_CONSUMER_NAME") or socket.gethostname()
        worker_env["ENGRAM_CONSUMER_NAME"] = f"{base}-consolidator-{i}"
        services.append(
            Service(
                f"consolidator-{i}",
                [sys.executable, "-m", "services.consolidator"],
                worker_env,
                CrashBudget(restart_limit, restart_window),
                pass_fds=(lock_fd,),
            )
        )
    services.append(
        Service(
            "query",
            [sys.executable, "-m", "services.query"],
            env,
            CrashBudget(restart_limit, restart_window),
            pass_fds=(lock_fd,),
        )
    )
    return services


def _probes(settings: Settings, workers: int) -> dict[str, str]:
    """What `Progress` polls: the query service's /readyz, each worker's /healthz (when it has a port)."""
    probes = {"query service": _probe_url(settings.host, settings.port, "/readyz")}
    for i in range(workers if settings.metrics_port else 0):
        probes[f"consolidator-{i}"] = _probe_url(settings.host, settings.metrics_port + i, "/healthz")
    return probes


def main() -> int:
    started = time.monotonic()
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    LOG["format"] = logs.log_format(env)
    try:  # every process would refuse a bad variable; say it once, before starting any
        settings = Settings.from_env(env)
        workers = env_int(env, "ENGRAM_WORKERS", 1, 1, 64)
        redis_port = env_int(env, "ENGRAM_REDIS_PORT", 6390, 1, 65535)
        restart_limit = env_int(env, "ENGRAM_RESTART_LIMIT", RESTART_LIMIT, 1, 1000)
        restart_window = _restart_window(env)
        cluster_size = env_int(env, "ENGRAM_REDIS_CLUSTER", 0, 0, 16)
    except ConfigError as exc:
        _refuse(f"engram: {exc}")
        return 2
    problem = _bind_problem(settings, env, redis_port, workers)
    if problem:
        _refuse(problem)
        return 2
    metrics_port = settings.metrics_port
    data_root = run_data_dir(env)
    try:  # before the port checks: a second `make run` of this checkout is told so, not "port not free"
        lock_fd = lock_data_dir(data_root)
    except DataDirBusy as exc:
        _refuse(busy_message(data_root, str(exc)))
        return EXIT_LOCKED
    except OSError as exc:  # e.g. ENGRAM_DATA_DIR under a file
        _refuse(f"engram: cannot use ENGRAM_DATA_DIR={data_root}: {exc.strerror or exc}")
        return 1
    taken = _taken_ports(settings, env, redis_port, workers)
    if taken:
        _refuse(taken)
        return 2
    _ensure_master_key(env, data_root)  # after the refusals: a refused start leaves no key behind
    # Ctrl-C from here on stops cleanly: during the embedded Redis's start the default handler would
    # raise and leave the server running (it has a session of its own, so the terminal's SIGINT does
    # not reach it)
    stop_requested = {"now": False}

    def _early_stop(*_):
        stop_requested["now"] = True

    signal.signal(signal.SIGINT, _early_stop)
    signal.signal(signal.SIGTERM, _early_stop)
    servers = _start_redis(env, data_root, cluster_size, redis_port, lock_fd)
    if servers is None:
        return 1
    services = _services(env, workers, metrics_port, restart_limit, restart_window, lock_fd)
    budgets = [CrashBudget(restart_limit, restart_window) for _ in servers]
    redis = [RedisProcess(s, b, name) for (name, s), b in zip(servers, budgets, strict=True)]
    supervisor = Supervisor(services, redis)
    supervisor.stopping = stop_requested["now"]
    signal.signal(signal.SIGINT, supervisor.stop)
    signal.signal(signal.SIGTERM, supervisor.stop)
    progress = Progress(started, _probes(settings, workers))
    code = 0
    try:
        for service in services:
            if not supervisor.stopping:
                service.start()
        if not supervisor.stopping:
            _say(
                f"started {workers} consolidator(s) and the query service on "
                f"http://{settings.host}:{settings.port} (GET /readyz says what is still loading; the first "
                f"start unpacks the embedding model), its console on "
                f"http://{settings.host}:{settings.port}/console; Ctrl-C stops everything",
                err=False,
            )
            progress.start()
        code = supervisor.run()
    finally:
        progress.done.set()
        supervisor.shutdown()
    _say("stopped", err=False)
    return code


if __name__ == "__main__":
    sys.exit(main())
