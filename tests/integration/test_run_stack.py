"""`make run`'s supervisor: the whole stack comes up on the embedded Redis and Ctrl-C stops it all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from deploy.embedded_redis import free_port
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]


async def _ready(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


def _two_free_ports(avoid: set[int]) -> int:
    """A port p with p and p + 1 free and not in `avoid` (workers 0 and 1 serve metrics on them): ports
    handed out one after another are often adjacent, and a clash makes `make run` refuse to start."""
    import socket

    while True:
        p = free_port()
        if p + 1 in avoid or p in avoid or p + 1 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p


async def test_run_starts_everything_and_ctrl_c_stops_cleanly(tmp_path):
    port, redis_port = free_port(), free_port()
    metrics_port = _two_free_ports(avoid={port, redis_port})
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(ENGRAM_PORT=str(port), ENGRAM_REDIS_PORT=str(redis_port), ENGRAM_DATA_DIR=str(tmp_path),
               ENGRAM_EMBEDDER="hashing", ENGRAM_LOG_LEVEL="WARNING", ENGRAM_WORKERS="2",
               ENGRAM_METRICS_PORT=str(metrics_port))
    proc = subprocess.Popen([sys.executable, "-m", "services.run"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        async def up() -> bool:
            if proc.poll() is not None:  # the stack exited: say why now, not after the timeout
                raise AssertionError(f"make run exited with {proc.returncode}:\n{proc.stdout.read().decode()[-3000:]}")
            return await _ready(url)

        await wait_until(up, timeout=90, message="query service ready")
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/v1/episodes", json={"task": "fix the flaky login test", "outcome": "success"}) as r:
                assert r.status == 202

            async def recalled() -> bool:
                async with s.post(f"{url}/v1/recall", json={"query": "flaky login test"}) as r:
                    return r.status == 200 and len((await r.json())["results"]) == 1

            await wait_until(recalled, timeout=30, message="episode projected by the consolidator")
            for worker_port in (metrics_port, metrics_port + 1):  # two workers, a metrics port each
                async with s.get(f"http://127.0.0.1:{worker_port}/metrics") as r:
                    assert r.status == 200 and "engram_events_processed_total" in await r.text()
            # a dead embedded Redis is restarted from its AOF; the services reconnect by themselves
            import redis as sync_redis
            client = sync_redis.Redis(port=redis_port)
            pid = int(client.info("server")["process_id"])
            client.close()
            os.kill(pid, signal.SIGKILL)
            await wait_until(recalled, timeout=60, message="recall answers again after a Redis restart")
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output[-3000:]
    assert "engram ◆ stopped" in output
    assert "engram ◆ redis restarted" in output
    assert (tmp_path / "redis" / "appendonlydir").exists()  # AOF on by default
    assert not await _ready(url)


def test_run_refuses_a_metrics_port_that_collides_with_another_service(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k != "REDIS_URL"}, "ENGRAM_PORT": "18080",
           "ENGRAM_WORKERS": "2", "ENGRAM_METRICS_PORT": "18079", "ENGRAM_DATA_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "services.run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "18080, which is also ENGRAM_PORT" in proc.stderr


@pytest.mark.parametrize(("name", "value", "said"), [
    ("ENGRAM_WORKERS", "abc", "ENGRAM_WORKERS='abc' is not an integer"),
    ("ENGRAM_WORKERS", "0", "ENGRAM_WORKERS='0' must be between 1 and 64"),
    ("ENGRAM_REDIS_PORT", "abc", "ENGRAM_REDIS_PORT='abc' is not an integer"),
    ("ENGRAM_METRICS_PORT", "x", "ENGRAM_METRICS_PORT='x' is not an integer"),
    ("ENGRAM_LOG_LEVEL", "bogus", "ENGRAM_LOG_LEVEL='bogus' must be one of"),
    ("ENGRAM_HOST", "0.0.0.0", "is not a loopback address and no API keys are configured"),
    ("ENGRAM_PORT", "REDIS", "ENGRAM_PORT and ENGRAM_REDIS_PORT are both 16599"),
])
def test_run_refuses_a_bad_variable_by_name_before_starting_anything(tmp_path, name, value, said):
    """Found by a new-user trial: a traceback from int(), or (workers 0) a stack that never projects."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "ENGRAM_API_KEYS", "ENGRAM_API_KEYS_FILE")},
           "ENGRAM_DATA_DIR": str(tmp_path), "ENGRAM_REDIS_PORT": "16599", name: value}
    if value == "REDIS":
        env[name] = env["ENGRAM_REDIS_PORT"]
    proc = subprocess.run([sys.executable, "-m", "services.run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "redis").exists()  # nothing was started


def test_run_refuses_a_query_port_in_use_and_a_data_dir_it_cannot_create(tmp_path):
    """Found by a new-user trial: a taken ENGRAM_PORT failed only after the model loaded, and
    ENGRAM_DATA_DIR under a file was a NotADirectoryError traceback."""
    import socket

    base = {**{k: v for k, v in os.environ.items() if k != "REDIS_URL"}, "ENGRAM_DATA_DIR": str(tmp_path),
            "ENGRAM_REDIS_PORT": str(free_port())}
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "services.run"], cwd=ROOT, env={**base, "ENGRAM_PORT": str(port)},
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"ENGRAM_PORT={port} on 127.0.0.1 is not free" in proc.stderr
    afile = tmp_path / "a-file"
    afile.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "services.run"], cwd=ROOT,
                          env={**base, "ENGRAM_PORT": str(free_port()), "ENGRAM_DATA_DIR": str(afile / "x")},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot start the embedded Redis" in proc.stderr
    assert "Traceback" not in proc.stderr
