"""`make run`: the whole stack in the foreground — embedded Redis, the consolidator, the query service
(docs/architecture.md, Processes: `make run`; variables: docs/configuration.md).

Exit codes: 1 when one process dies `ENGRAM_RESTART_LIMIT` times in a row (`CrashBudget`) or a service
exits 0 on its own; 2 on a configuration error (also a service's exit 2, never restarted); 3 when
another `make run` holds the data directory (services/run_lock.py).
"""

from __future__ import annotations

import signal

if __name__ == "__main__":  # Ctrl-C while the imports below load ends quietly, without a traceback
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
from typing import Any

from deploy.embedded_redis import EmbeddedCluster, EmbeddedRedis, EmbeddedRedisError, die_with_us
from engram_episodic.errors import ConfigError
from services.query.auth import check_bind
from services.run_lock import DataDirBusy, busy_message, lock_data_dir, run_data_dir
from shared import logs
from shared.embedding import first_start_work
from shared.settings import Settings, env_int, parse_duration

GRACE_SECONDS = 15.0
RESTART_LIMIT = 5
RESTART_WINDOW = 60.0
"""`ENGRAM_RESTART_LIMIT` deaths in a row, each within `ENGRAM_RESTART_WINDOW` seconds of its start,
stop the stack; a longer run makes the budget whole again."""
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 10.0
"""A dead service is restarted after BACKOFF_FIRST * 2^(deaths in a row - 1) seconds, at most BACKOFF_MAX."""
EXIT_CONFIG = 2
EXIT_LOCKED = 3
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
    `exhausted` at `limit`. Counted by run length: a process taking 13 s to load its model dies at most
    ~4 times a minute, which a per-minute count would not stop."""

    def __init__(self, limit: int, window: float):
        self.limit, self.window = limit, window
        self.deaths = 0
        self.last_run = 0.0  # seconds the process that died last was up

    def record(self, now: float, started: float) -> int:
        """Count the death at `now` (monotonic) of the run started at `started`; returns the deaths
        in a row (0 after a run of `window` or longer: the count starts over)."""
        self.last_run = now - started
        self.deaths = 0 if self.last_run >= self.window else self.deaths + 1
        return self.deaths

    @property
    def exhausted(self) -> bool:
        return self.deaths >= self.limit

    def backoff(self) -> float:
        """Seconds to wait before the next restart: BACKOFF_FIRST, doubled with each death in a row."""
        return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** max(0, self.deaths - 1))


class StderrRelay:
    """Copies a child's stderr to ours and keeps its last bytes, to repeat its last words when it
    exits. A thread always reads: a full pipe would freeze the child."""

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
                    sys.stderr.buffer.write(chunk)
                    sys.stderr.buffer.flush()
        except OSError:
            pass
        finally:
            self._pipe.close()

    def last_line(self) -> str:
        """The child's last non-blank stderr line (after it exited: waits up to 1 s for the rest)."""
        self._thread.join(1.0)
        return last_words(bytes(self._tail).decode(errors="replace"))


_FRAME = re.compile(r"[\s|+\-~^\d]*")
"""A line of a traceback's drawing only (ExceptionGroup frames, `~~~^^^` markers)."""


def last_words(text: str) -> str:
    """The last line of a child's stderr that says something (an ExceptionGroup's `| Error: ...`
    without its margin), at most 500 characters; "" when none does."""
    for line in reversed(text.splitlines()):
        if not _FRAME.fullmatch(line):
            return line.strip().lstrip("|").strip()[:500]
    return ""


def _in_a_row(budget: CrashBudget) -> str:
    """What a restart line says of the budget (deaths in a row, or a long run that reset it)."""
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
        popen: dict[str, Any],
    ):
        self.name, self.argv, self.env, self.budget = name, argv, env, budget
        self.popen = popen  # the data dir's lock (held until the stack's last process is gone), die_with_us
        self.proc: subprocess.Popen | None = None
        self.relay: StderrRelay | None = None
        self.restarts = 0
        self.restart_at: float | None = None  # set while it waits out its backoff
        self.started = 0.0  # time.monotonic() of the last start: a short run's death counts (CrashBudget)

    def start(self) -> subprocess.Popen:
        """Start (again); EmbeddedRedisError when a Redis does not come up."""
        # a session of its own: the terminal's Ctrl-C reaches the supervisor alone, which sends SIGTERM
        self.proc = proc = subprocess.Popen(
            self.argv, env=self.env, stderr=subprocess.PIPE, start_new_session=True, **self.popen
        )
        self.relay = StderrRelay(proc.stderr)
        self.restart_at = None
        self.started = time.monotonic()
        return proc

    def last_words(self) -> str:
        """Its last stderr line (after it exited by itself: one killed by a signal said nothing)."""
        return self.relay.last_line() if self.relay else ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.restart_at is None and self.proc.poll() is None


class RedisNode(Service):
    """The embedded Redis, or one node of the embedded cluster, supervised as a service is; restarted
    from its append-only file (and `nodes.conf`). Already started: it starts before the services."""

    def __init__(self, name: str, server: EmbeddedRedis, budget: CrashBudget):
        super().__init__(name, [], {}, budget, {})
        self.server, self.proc, self.started = server, server.process, time.monotonic()

    def start(self) -> subprocess.Popen:
        self.restart_at, self.started = None, time.monotonic()
        try:
            self.server.start()
        finally:  # also one that died while starting: its death is counted at the next check
            self.proc = self.server.process
        assert self.proc is not None
        return self.proc

    def last_words(self) -> str:
        return last_words(self.server.log_tail(5))


LOG = {"format": "text"}
"""`ENGRAM_LOG_FORMAT` of this process, set once by `main()`."""


def _say(message: str, *, err: bool = True, level: int = logging.INFO, mark: str = "engram ◆ ") -> None:
    """One line of the supervisor's own: `engram ◆ message` (a refusal: `engram: message`), or with
    ENGRAM_LOG_FORMAT=json the JSON object a logger `engram.run` would write."""
    text = (
        mark + message
        if LOG["format"] == "text"
        else logs.line("json", message, logger="engram.run", level=level)
    )
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def _refuse(message: str) -> None:
    """Why the stack does not start (`engram: message`, on stderr)."""
    _say(message, level=logging.ERROR, mark="engram: ")


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
    """Says when each service first answers, what it still loads (again every STILL seconds) and
    when it is ready, in seconds since `started` (monotonic); then that the stack is. `probes`: name →
    readiness URL. Only the first start is followed."""

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
                if was is None:  # it answers once; what it loads next is said as loading
                    line = f"answering at {elapsed:.1f}s; loading {what}"
                else:
                    line = f"{'still ' if was == pending else ''}loading {what} at {elapsed:.0f}s"
                _say(f"{name} {line}", err=False)
            self.done.wait(0.25)
        if not waiting and not self.done.is_set():
            _say(
                f"stack ready in {time.monotonic() - self.started:.1f}s ◆ Ctrl-C stops everything",
                err=False,
            )


class Supervisor:
    """Watches the embedded Redis (or every cluster node) and the services until `stop()`; returns
    the stack's exit code. A dead process is restarted after `CrashBudget.backoff()`."""

    def __init__(self, services: list[Service], redis: list[RedisNode]):
        self.services, self.redis = services, redis
        self.stopping = False

    def stop(self, *_) -> None:
        self.stopping = True

    def run(self) -> int:
        while not self.stopping:
            for child in [*self.redis, *self.services]:
                code = None if self.stopping else self._check(child)
                if code is not None:
                    return code
            time.sleep(0.2)
        return 0

    def _check(self, child: Service) -> int | None:
        now = time.monotonic()
        if child.restart_at is not None:
            return self._restart(child) if now >= child.restart_at else None
        proc = child.proc
        code = None if proc is None else proc.poll()  # None: running, or never started (a stop came first)
        if proc is None or code is None:
            return None
        # a process that exited by itself usually said why last; one killed by a signal did not
        last = child.last_words() if code > 0 else ""
        said = f": {last}" if last else ""
        if code == EXIT_CONFIG and child not in self.redis:
            _say(
                f"{child.name} exited with code 2, a configuration error{said} — not restarting it; "
                f"stopping the stack"
            )
            return EXIT_CONFIG
        if code == 0 and child not in self.redis:
            _say(f"{child.name} (pid {proc.pid}) exited with code 0 (stopped by hand?); stopping the stack")
            return 1
        deaths = child.budget.record(now, child.started)
        if child.budget.exhausted:
            _say(
                f"{child.name} died {deaths} times in a row, each within {child.budget.window:g}s of "
                f"its start (last: {describe_exit(code)}{said}); stopping the stack"
            )
            return 1
        delay = child.budget.backoff()
        child.restart_at = now + delay
        _say(
            f"{child.name} (pid {proc.pid}) died, {describe_exit(code)}{said} — restart {child.restarts + 1} "
            f"in {delay:g}s ({_in_a_row(child.budget)})"
        )
        return None

    def _restart(self, child: Service) -> int | None:
        child.restarts += 1
        try:
            proc = child.start()
        except EmbeddedRedisError as exc:
            if child.proc is not None and child.proc.poll() is None:  # alive yet not ours to use
                _say(f"cannot restart {child.name}: {exc}; stopping the stack")
                return 1
            _say(f"{child.name} died while restarting (restart {child.restarts}); trying again")
            return None
        _say(f"{child.name} restarted (pid {proc.pid}, restart {child.restarts})")
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
                service.relay.last_line()  # let the last words through before ours
        for node in self.redis:
            node.server.stop()


def _listeners(settings: Settings, env: Mapping[str, str], redis_port: int, workers: int) -> list[tuple]:
    """(variable, host, port, what else to do) of every port the stack is about to listen on."""
    found = [("ENGRAM_PORT", settings.host, settings.port, "")]
    if not env.get("REDIS_URL"):
        redis_hint = ", or set REDIS_URL to use a Redis that is already running"
        found.append(("ENGRAM_REDIS_PORT", "127.0.0.1", redis_port, redis_hint))
    for i in range(workers if settings.metrics_port else 0):
        name = "ENGRAM_METRICS_PORT" + (f" + {i}" if i else "")
        hint = f" (consolidator-{i}'s /healthz and /metrics), or 0 for none"
        found.append((name, settings.host, settings.metrics_port + i, hint))
    return found


def _port_problem(listeners: list[tuple]) -> str | None:
    """Why the stack cannot listen on `listeners` (the message), or None: said up front instead of a
    traceback after a model loaded."""
    seen: dict[int, str] = {}
    for name, _, port, hint in listeners:
        if port in seen or port > 65535:
            which = f"{seen[port]} and {name} are both {port}" if port in seen else f"{name} = {port} > 65535"
            return f"{which}; choose another{hint}"
        seen[port] = name
    for name, host, port, hint in listeners:
        busy = _taken_port(host, port)
        if busy:
            return f"{name}={port} on {host} is not free ({busy}); choose another{hint}"
    return None


def _ensure_master_key(env: dict[str, str], data_root: Path) -> None:
    """Without a master key set, ENGRAM_MASTER_KEY_FILE becomes the data dir's (0600, created once)."""
    if not env.get("ENGRAM_MASTER_KEY") and not env.get("ENGRAM_MASTER_KEY_FILE"):
        from shared.crypto import generate_master_key_file  # 0600, created once, never overwritten

        env["ENGRAM_MASTER_KEY_FILE"] = str(generate_master_key_file(data_root / "master.key").resolve())
        _say(f"master key {env['ENGRAM_MASTER_KEY_FILE']} (without it the stream is unreadable)", err=False)


def _start_redis(
    env: dict[str, str], data_root: Path, cluster_size: int, redis_port: int, popen: dict[str, Any]
) -> list[tuple[str, EmbeddedRedis]] | None:
    """Start the embedded Redis, or with `cluster_size` N (`ENGRAM_REDIS_CLUSTER`) a cluster of N
    primaries on ports `redis_port`... (data in `ENGRAM_DATA_DIR/cluster`), unless REDIS_URL is set, and
    set it: [(name, server)] to supervise; None when it did not start (said on stderr)."""
    if env.get("REDIS_URL"):
        return []
    server: EmbeddedRedis | EmbeddedCluster
    if cluster_size:
        ports = list(range(redis_port, redis_port + cluster_size))
        server = EmbeddedCluster(data_root / "cluster", cluster_size, ports=ports, popen=popen)
        what = f"the embedded cluster (ENGRAM_REDIS_PORT={redis_port})"
    else:
        server = EmbeddedRedis(port=redis_port, data_dir=data_root / "redis", popen=popen)
        what = f"the embedded Redis (ENGRAM_DATA_DIR={data_root}, ENGRAM_REDIS_PORT={redis_port})"
        _say(f"starting redis on port {redis_port} (data in {server.data_dir})", err=False)
    started = time.monotonic()
    try:
        server.start()
    except (EmbeddedRedisError, OSError) as exc:
        server.stop()  # one that did not answer in time is still running
        _refuse(f"cannot start {what}: {exc}")
        return None
    env["REDIS_URL"] = server.url
    if isinstance(server, EmbeddedCluster):
        _say(f"redis cluster {server.url} ({cluster_size} primaries, data in {server.data_dir})", err=False)
        return [(f"redis node {node.port}", node) for node in server.nodes]
    _say(f"redis {server.url} ready in {time.monotonic() - started:.1f}s", err=False)
    return [("redis", server)]


def _services(
    env: dict[str, str],
    workers: int,
    metrics_port: int,
    restart_limit: int,
    restart_window: float,
    popen: dict[str, Any],
) -> list[Service]:
    """The consolidators, then the query service, each with its crash budget and `popen` (Service)."""
    base = env.get("ENGRAM_CONSUMER_NAME") or socket.gethostname()

    def service(name: str, module: str, service_env: dict[str, str]) -> Service:
        argv = [sys.executable, "-m", module]
        return Service(name, argv, service_env, CrashBudget(restart_limit, restart_window), popen)

    services = []
    for i in range(workers):
        # worker i: ENGRAM_METRICS_PORT + i, and a consumer name kept across restarts, so a restarted
        # worker reads its predecessor's unacked entries at once instead of after the lease
        worker_env = {**env, "ENGRAM_CONSUMER_NAME": f"{base}-consolidator-{i}"}
        if metrics_port:
            worker_env["ENGRAM_METRICS_PORT"] = str(metrics_port + i)
        services.append(service(f"consolidator-{i}", "services.consolidator", worker_env))
    return [*services, service("query", "services.query", env)]


def _probes(settings: Settings, workers: int) -> dict[str, str]:
    """What `Progress` polls: the query service's /readyz, each worker's /healthz (when it has a port)."""
    probes = {"query service": _probe_url(settings.host, settings.port, "/readyz")}
    for i in range(workers if settings.metrics_port else 0):
        probes[f"consolidator-{i}"] = _probe_url(settings.host, settings.metrics_port + i, "/healthz")
    return probes


def main() -> int:
    started = time.monotonic()
    # as the Makefile exports them: models load from disk only
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **os.environ,
    }
    LOG["format"] = logs.log_format(env)
    try:  # every process would refuse a bad variable; say it once, before starting any
        settings = Settings.from_env(env)
        workers = env_int(env, "ENGRAM_WORKERS", 1, 1, 64)
        redis_port = env_int(env, "ENGRAM_REDIS_PORT", 6390, 1, 65535)
        restart_limit = env_int(env, "ENGRAM_RESTART_LIMIT", RESTART_LIMIT, 1, 1000)
        window = env.get("ENGRAM_RESTART_WINDOW")
        restart_window = parse_duration(window, name="ENGRAM_RESTART_WINDOW") if window else RESTART_WINDOW
        cluster_size = env_int(env, "ENGRAM_REDIS_CLUSTER", 0, 0, 16)
        check_bind(settings.host, settings.api_keys)  # ValueError
    except (ConfigError, ValueError) as exc:
        _refuse(str(exc))
        return 2
    data_root = run_data_dir(env)
    try:  # before the port checks: a second `make run` of this checkout is told so, not "port not free"
        lock_fd = lock_data_dir(data_root)
    except DataDirBusy as exc:
        _refuse(busy_message(data_root, str(exc)))
        return EXIT_LOCKED
    except OSError as exc:  # e.g. ENGRAM_DATA_DIR under a file
        _refuse(f"cannot use ENGRAM_DATA_DIR={data_root}: {exc.strerror or exc}")
        return 1
    taken = _port_problem(_listeners(settings, env, redis_port, workers))
    if taken:
        _refuse(taken)
        return 2
    _ensure_master_key(env, data_root)  # after the refusals: a refused start leaves no key behind
    # Ctrl-C from here on stops cleanly (raised during the embedded Redis's start, it left it running)
    supervisor = Supervisor([], [])
    signal.signal(signal.SIGINT, supervisor.stop)
    signal.signal(signal.SIGTERM, supervisor.stop)
    popen = {"pass_fds": (lock_fd,), "preexec_fn": die_with_us()}
    servers = _start_redis(env, data_root, cluster_size, redis_port, popen)
    if servers is None:
        return 1
    supervisor.services = _services(env, workers, settings.metrics_port, restart_limit, restart_window, popen)
    supervisor.redis = [RedisNode(name, s, CrashBudget(restart_limit, restart_window)) for name, s in servers]
    progress = Progress(started, _probes(settings, workers))
    work = first_start_work(settings)  # before the services start filling the cache
    try:
        for service in supervisor.services:
            if not supervisor.stopping:
                service.start()
        if not supervisor.stopping:
            api = f"http://{settings.host}:{settings.port}"
            _say(
                f"started {workers} consolidator(s) and the query service: API {api}, console {api}/console "
                f"(GET /readyz says what is still loading); Ctrl-C stops everything",
                err=False,
            )
            if work:
                _say(f"this start {work}, once (about a minute); later starts load it in seconds", err=False)
            progress.start()
        code = supervisor.run()
    finally:
        progress.done.set()
        supervisor.shutdown()
    _say("stopped", err=False)
    return code


if __name__ == "__main__":
    sys.exit(main())
