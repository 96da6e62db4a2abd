"""The embedded Redis (deploy/embedded_redis.py) is sure the server it talks to is its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as sync_redis

from deploy.embedded_redis import EmbeddedRedis, EmbeddedRedisError, free_port
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # spawns servers: `make test-fast` skips it


def test_a_server_that_cannot_bind_does_not_take_anothers_for_its_own(tmp_path):
    """Two `make run`s started at once on one ENGRAM_REDIS_PORT (other data dirs): both found the
    port free, the second server could not bind, yet its start returned ("ready in 0.0s") on the first
    one's PING; its services ran on the other stack's Redis, and its stop SHUTDOWN that Redis."""
    port = free_port()
    first = EmbeddedRedis(port=port, data_dir=tmp_path / "a").start()
    try:
        second = EmbeddedRedis(port=port, data_dir=tmp_path / "b")
        with pytest.raises(EmbeddedRedisError, match="exited with"):
            second.start()
        assert "Address already in use" in second.log_tail()
        second.stop()  # stops nothing of the first's
        client = sync_redis.Redis(port=port, socket_timeout=5)
        assert client.ping() and int(client.info("server")["process_id"]) == first.process.pid
        client.close()
    finally:
        first.stop()
    assert first.process.returncode == 0  # SIGTERM: Redis shut down cleanly


def test_a_stopped_server_keeps_what_it_was_told_when_started_again(tmp_path):
    """`stop()` is a SIGTERM to its own process: Redis flushes its append-only file as on SHUTDOWN."""
    server = EmbeddedRedis(port=free_port(), data_dir=tmp_path).start()
    try:
        client = sync_redis.Redis(port=server.port, socket_timeout=5)
        client.set("kept", "yes")
        client.close()
        server.stop()
        server.start()
        client = sync_redis.Redis(port=server.port, socket_timeout=5)
        assert client.get("kept") == b"yes"
        client.close()
    finally:
        server.stop()


def test_a_cluster_of_other_ports_or_size_in_the_data_dir_is_refused_before_starting(tmp_path):
    """A cluster is started again from its nodes' nodes.conf; a data dir holding one only for some of
    the ports (ENGRAM_REDIS_CLUSTER or ENGRAM_REDIS_PORT changed) would form a second cluster beside
    nodes that remember the first: refused, naming the way out, and nothing is started."""
    from deploy.embedded_redis import EmbeddedCluster, free_cluster_ports

    ports = free_cluster_ports(3)
    (tmp_path / str(ports[0])).mkdir()
    (tmp_path / str(ports[0]) / "nodes.conf").write_text("")
    cluster = EmbeddedCluster(data_dir=tmp_path, primaries=3, ports=ports)
    with pytest.raises(EmbeddedRedisError, match=f"nodes.conf only under {ports[0]}.*remove"):
        cluster.start()
    assert cluster.nodes == []


def _running_after(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether `proc` is still running `seconds` from now (False as soon as it exits)."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return True
    return False


@contextlib.contextmanager
def _standalone(data_dir: Path) -> Iterator[tuple[subprocess.Popen, sync_redis.Redis, int]]:
    """`python -m deploy.embedded_redis` on a free port, once ready: (its process, a client of its server,
    the server's pid). Whatever is still running on leaving is killed."""
    port = free_port()
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "deploy.embedded_redis", "--port", str(port), "--dir", str(data_dir)],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = sync_redis.Redis(port=port, socket_timeout=5)
    pid = None
    try:
        assert "embedded redis ready" in wrapper.stdout.readline(), wrapper.stderr.read()
        pid = int(client.info("server")["process_id"])
        yield wrapper, client, pid
    finally:
        client.close()
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        if pid is not None:  # its own session: not killed with the wrapper
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_paused_server_is_not_taken_for_one_that_exited(tmp_path):
    """`python -m deploy.embedded_redis` stops when its server exits, told by SIGCHLD; SIGCHLD also comes
    when the server is paused (`kill -STOP`) or continued, and a pause SIGTERMed the server, which shut
    down once continued ("embedded redis stopped"). A paused server now stays, and answers when continued."""
    with _standalone(tmp_path) as (wrapper, client, pid):
        os.kill(pid, signal.SIGSTOP)
        try:
            assert _running_after(wrapper, 2)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert _running_after(wrapper, 2), wrapper.stdout.read()  # a SIGTERM sent while paused lands now
        assert client.ping() and int(client.info("server")["process_id"]) == pid
        wrapper.terminate()
        assert wrapper.wait(timeout=30) == 0
        assert "embedded redis stopped" in wrapper.stdout.read()
        with pytest.raises(ProcessLookupError):  # the server went with it
            os.kill(pid, 0)


def test_a_server_that_exits_ends_its_wrapper(tmp_path):
    """A server killed under `python -m deploy.embedded_redis` is not left for dead: the wrapper exits."""
    with _standalone(tmp_path) as (wrapper, _, pid):
        os.kill(pid, signal.SIGKILL)
        assert wrapper.wait(timeout=30) == 0
        assert "embedded redis stopped" in wrapper.stdout.read()


async def test_a_server_goes_with_the_process_that_started_it(tmp_path):
    """A process killed with -9 (a test run, a script) left its embedded Redis running, holding its port
    and data directory; the server now gets SIGTERM when its starter dies, and exits."""
    with _standalone(tmp_path) as (wrapper, _, pid):
        wrapper.kill()
        wrapper.wait()
        await wait_until(lambda: not _alive(pid), timeout=30, message="the server stopped with its starter")


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie of a reaped parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
