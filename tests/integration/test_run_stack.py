"""`make run`'s supervisor: the whole stack comes up on the embedded Redis and Ctrl-C stops it all."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from pathlib import Path

import aiohttp
import pytest

from deploy.embedded_redis import free_port
from tests.helpers import ROOT, Stack, publish_and_recall, ready, run_module, wait_until

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it


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


def test_a_data_dir_held_by_an_orphan_names_the_orphans_pid_not_the_gone_make_runs(tmp_path):
    """A `make run` killed with -9 leaves its embedded Redis holding the inherited lock; the refusal
    named the dead supervisor's pid (from the lock file), which no `kill` can stop."""
    import subprocess
    import sys

    from services.run_lock import busy_message

    script = (
        "import os, subprocess, sys\n"
        "from services.run_lock import lock_data_dir\n"
        f"fd = lock_data_dir(__import__('pathlib').Path({str(tmp_path)!r}))\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'], pass_fds=(fd,),"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "os._exit(0)\n"  # gone, its child holding the lock, as a killed make run's Redis does
    )
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    orphan = int(parent.stdout.split()[0])
    try:
        gone = (tmp_path / "run.lock").read_text().strip()
        message = busy_message(tmp_path, gone)
        assert f"a process left by a `make run` that is gone (pid {gone}): pid {orphan} python" in message, (
            message
        )
    finally:
        os.kill(orphan, signal.SIGKILL)


# a whole `make run` stack (Redis, workers, query service) starts, and its readiness wait
# alone allows 60-90 s; 24 s measured (Redis is also restarted)
@pytest.mark.timeout(180)
async def test_run_starts_everything_and_ctrl_c_stops_cleanly(tmp_path):
    stack = Stack(tmp_path / "data", ENGRAM_WORKERS="2")
    metrics_port = _two_free_ports(avoid={stack.port, stack.redis_port})
    stack.env["ENGRAM_METRICS_PORT"] = str(metrics_port)
    stack.start()
    url = stack.url
    try:
        await wait_until(stack.ready, timeout=90, message="query service ready")
        async with aiohttp.ClientSession() as s:
            recalled = await publish_and_recall(
                s,
                url,
                {"task": "fix the flaky login test", "outcome": "success"},
                "flaky login test",
                message="episode projected by the consolidator",
            )
            for worker_port in (metrics_port, metrics_port + 1):  # two workers, a metrics port each
                async with s.get(f"http://127.0.0.1:{worker_port}/metrics") as r:
                    assert r.status == 200 and "engram_events_processed_total" in await r.text()
            # a dead embedded Redis is restarted from its AOF; the services reconnect by themselves
            import redis as sync_redis

            client = sync_redis.Redis(port=stack.redis_port)
            pid = int(client.info("server")["process_id"])
            client.close()
            os.kill(pid, signal.SIGKILL)
            await wait_until(recalled, timeout=60, message="recall answers again after a Redis restart")
        code = stack.stop()
    finally:
        stack.kill()
    output = stack.output()
    assert code == 0, output[-3000:]
    assert "engram ◆ stopped" in output
    assert "engram ◆ redis restarted" in output
    assert (tmp_path / "data" / "redis" / "appendonlydir").exists()  # AOF on by default
    assert not await ready(url)


def test_run_refuses_a_metrics_port_that_collides_with_another_service(tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        "ENGRAM_PORT": "18080",
        "ENGRAM_WORKERS": "2",
        "ENGRAM_METRICS_PORT": "18079",
        "ENGRAM_DATA_DIR": str(tmp_path),
    }
    proc = run_module("services.run", env=env, timeout=60)
    assert proc.returncode == 2 and "ENGRAM_PORT and ENGRAM_METRICS_PORT + 1 are both 18080" in proc.stderr


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("ENGRAM_WORKERS", "abc", "ENGRAM_WORKERS='abc' is not an integer"),
        ("ENGRAM_WORKERS", "0", "ENGRAM_WORKERS='0' must be between 1 and 64"),
        ("ENGRAM_REDIS_PORT", "abc", "ENGRAM_REDIS_PORT='abc' is not an integer"),
        ("ENGRAM_METRICS_PORT", "x", "ENGRAM_METRICS_PORT='x' is not an integer"),
        ("ENGRAM_LOG_LEVEL", "bogus", "ENGRAM_LOG_LEVEL='bogus' must be one of"),
        ("ENGRAM_HOST", "0.0.0.0", "is not a loopback address and no API keys are configured"),
        ("ENGRAM_PORT", "REDIS", "ENGRAM_PORT and ENGRAM_REDIS_PORT are both 16599"),
        # port 0 listened on a random port the readiness probe never found
        ("ENGRAM_PORT", "0", "ENGRAM_PORT='0' must be between 1 and 65535"),
    ],
)
def test_run_refuses_a_bad_variable_by_name_before_starting_anything(tmp_path, name, value, said):
    """A bad variable is refused by name, not a traceback from int() or (workers 0) a stack that never
    projects."""
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("REDIS_URL", "ENGRAM_API_KEYS", "ENGRAM_API_KEYS_FILE")
        },
        "ENGRAM_DATA_DIR": str(tmp_path),
        "ENGRAM_REDIS_PORT": "16599",
        name: value,
    }
    if value == "REDIS":
        env[name] = env["ENGRAM_REDIS_PORT"]
    proc = run_module("services.run", env=env, timeout=60)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "redis").exists()  # nothing was started


def test_run_refuses_a_query_port_in_use_and_a_data_dir_it_cannot_create(tmp_path):
    """Refused at once: a taken ENGRAM_PORT failed only after the model loaded, and
    ENGRAM_DATA_DIR under a file was a NotADirectoryError traceback."""
    import socket

    base = {
        **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        "ENGRAM_DATA_DIR": str(tmp_path),
        "ENGRAM_REDIS_PORT": str(free_port()),
    }
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        proc = run_module("services.run", env={**base, "ENGRAM_PORT": str(port)}, timeout=60)
    assert proc.returncode == 2 and f"ENGRAM_PORT={port} on 127.0.0.1 is not free" in proc.stderr
    afile = tmp_path / "a-file"
    afile.write_text("x")
    proc = run_module(
        "services.run",
        env={**base, "ENGRAM_PORT": str(free_port()), "ENGRAM_DATA_DIR": str(afile / "x")},
        timeout=60,
    )
    assert (
        proc.returncode == 1 and f"cannot use ENGRAM_DATA_DIR={afile / 'x'}: Not a directory" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("which", ["ENGRAM_REDIS_PORT", "ENGRAM_METRICS_PORT"])
def test_run_refuses_a_taken_redis_or_metrics_port_before_starting_anything(tmp_path, which):
    """Refused at once: a taken ENGRAM_REDIS_PORT gave 50 lines of Redis log, then "redis died
    6 times"; a taken metrics port would stop a worker after its model loaded."""
    import socket

    env = {
        **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "ENGRAM_API_KEYS")},
        "ENGRAM_DATA_DIR": str(tmp_path),
        "ENGRAM_PORT": str(free_port()),
        "ENGRAM_REDIS_PORT": str(free_port()),
        "ENGRAM_METRICS_PORT": str(free_port()),
        "ENGRAM_EMBEDDER": "hashing",
    }
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        proc = run_module("services.run", env={**env, which: str(port)}, timeout=60)
    assert proc.returncode == 2 and f"{which}={port} on 127.0.0.1 is not free" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "redis").exists()  # nothing was started
    assert not (tmp_path / "master.key").exists()  # nor a key written for a stack that never ran


def test_run_writes_its_own_lines_as_json_with_engram_log_format_json(tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "ENGRAM_API_KEYS")},
        "ENGRAM_DATA_DIR": str(tmp_path),
        "ENGRAM_LOG_FORMAT": "json",
        "ENGRAM_WORKERS": "0",
    }
    proc = run_module("services.run", env=env, timeout=60)
    [record] = [json.loads(line) for line in proc.stderr.splitlines()]
    assert proc.returncode == 2 and (record["logger"], record["level"]) == ("engram.run", "ERROR")
    assert record["message"] == "ENGRAM_WORKERS='0' must be between 1 and 64", record


# --- `make run` survives one crashed process -------------------------------------------------------
async def _one_new_pid(stack: Stack, module: str, old: set[int]) -> int:
    async def new() -> int | None:
        pids = set(stack.children(module)) - old
        return next(iter(pids)) if len(pids) == 1 and not set(stack.children(module)) & old else None

    return await wait_until(new, timeout=20, interval=0.05, message=f"a new {module} process")


# a whole `make run` stack (Redis, workers, query service) starts, and its readiness wait
# alone allows 60-90 s; 22 s measured (two processes are killed and restarted)
@pytest.mark.timeout(180)
async def test_the_start_says_a_line_per_step_with_its_time(tmp_path):
    """A first start says each step as it goes, not minutes of near silence."""
    stack = Stack(tmp_path / "data", ENGRAM_WORKERS="2")
    # Stack turns them off; here the two workers are probed on two free ports in a row
    stack.env["ENGRAM_METRICS_PORT"] = str(_two_free_ports(avoid={stack.port, stack.redis_port}))
    stack.start()
    try:
        await stack.said("engram ◆ stack ready in", timeout=90)
        output = stack.output()
    finally:
        code = stack.stop()
    assert code == 0, output[-3000:]
    # each with the seconds since `make run` began
    for step in (
        "redis redis://127.0.0.1:\\d+/0",
        "consolidator-0",
        "consolidator-1",
        "query service",
        "stack",
    ):
        assert re.search(f"engram ◆ {step} ready in \\d+\\.\\ds", output), (step, output[-3000:])
    assert output.index("engram ◆ redis redis://") < output.index("engram ◆ stack ready in")
    # the API's URL and the console's, once; no model to unpack or export, so no word of it
    api = f"http://127.0.0.1:{stack.port}"
    assert output.count(f"API {api}, console {api}/console") == 1, output[-3000:]
    assert "unpack" not in output and "export" not in output, output[-3000:]
    for name in ("query service", "consolidator-0", "consolidator-1"):
        assert output.count(f"engram ◆ {name} answering at") <= 1, output[-3000:]


async def test_a_killed_worker_or_query_service_is_restarted_and_the_api_keeps_answering(tmp_path):
    stack = Stack(tmp_path / "data").start()
    try:
        await wait_until(stack.ready, timeout=60, message="query service ready")
        # a second `make run` of the same data directory is refused before it starts anything
        second = Stack(tmp_path / "data")
        refused = run_module("services.run", env=second.env, timeout=60)
        assert refused.returncode == 3, refused.stderr
        assert f"is in use by another `make run` (pid {stack.proc.pid})" in refused.stderr
        assert not await ready(second.url)

        [worker] = stack.children("services.consolidator")
        os.kill(worker, signal.SIGKILL)
        assert await ready(stack.url)  # the API does not notice
        new_worker = await _one_new_pid(stack, "services.consolidator", {worker})
        await stack.said(f"consolidator-0 (pid {worker}) died, killed by SIGKILL — restart 1 in 0.5s")
        await stack.said(f"consolidator-0 restarted (pid {new_worker}, restart 1)")
        assert await ready(stack.url)
        async with aiohttp.ClientSession() as s:  # the new worker projects
            await publish_and_recall(
                s,
                stack.url,
                {"task": "rotate the api keys", "outcome": "success"},
                "rotate api keys",
                message="episode projected by the restarted worker",
            )

        [query] = stack.children("services.query")
        os.kill(query, signal.SIGKILL)
        await _one_new_pid(stack, "services.query", {query})
        await wait_until(stack.ready, timeout=30, message="query service ready again")
        assert stack.proc.poll() is None
        assert stack.stop() == 0
    finally:
        stack.kill()
    output = stack.output()
    assert "engram ◆ query (pid" in output and "died, killed by SIGKILL" in output
    assert output.rstrip().endswith("engram ◆ stopped")


def _gone(pid: int) -> bool:
    """`pid` exited (reaped, or a zombie nobody reaped yet: in a container pid 1 may not reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def test_a_killed_make_run_takes_its_whole_stack_with_it_and_the_next_keeps_the_data(tmp_path):
    """A `make run` killed with -9 left its embedded Redis running with the data dir's lock (the next
    `make run` was refused until it was found and killed by hand), and before that its consolidator and
    query service too (they would have consumed the stream of any Redis started next on the port). Each
    now gets SIGTERM when the supervisor dies: Redis flushes its append-only file and exits."""
    import redis as sync_redis

    from services.run_lock import LOCK_FILE, holders

    stack, orphans = Stack(tmp_path / "data").start(), []
    try:
        await wait_until(stack.ready, timeout=60, message="query service ready")
        [worker] = stack.children("services.consolidator")
        [query] = stack.children("services.query")
        [server] = stack.children("redis-server")
        orphans += [worker, query, server]  # killed in `finally` should they outlive the supervisor
        held = {pid for pid, _ in holders(tmp_path / "data" / LOCK_FILE)}
        assert {worker, query, server, stack.proc.pid} <= held, held  # every process of the stack holds it
        sync_redis.Redis(port=stack.redis_port, socket_timeout=2).set("kept", "yes")

        os.kill(stack.proc.pid, signal.SIGKILL)
        stack.proc.wait(timeout=30)
        await wait_until(
            lambda: _gone(worker) and _gone(query) and _gone(server),
            timeout=60,
            message="Redis, the consolidator and the query service stopped with their supervisor",
        )
        second = Stack(tmp_path / "data", redis_port=stack.redis_port).start()
        try:
            await wait_until(second.ready, timeout=60, message="the next make run ready")
            assert sync_redis.Redis(port=second.redis_port, socket_timeout=2).get("kept") == b"yes"
            assert second.stop() == 0
        finally:
            second.kill()
    finally:
        stack.kill()
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_a_crash_loop_stops_the_stack_with_a_message(tmp_path):
    stack = Stack(tmp_path / "data", ENGRAM_RESTART_LIMIT="3").start()
    try:
        await wait_until(stack.ready, timeout=60, message="query service ready")
        seen: set[int] = set()
        for _ in range(3):  # three deaths in a row, each within ENGRAM_RESTART_WINDOW (60 s) of its start
            pid = await _one_new_pid(stack, "services.consolidator", seen)
            seen.add(pid)
            os.kill(pid, signal.SIGKILL)
        code = stack.proc.wait(timeout=60)
    finally:
        stack.kill()
    output = stack.output()
    assert code == 1, output[-3000:]
    assert "restart 2 in 1s (2 death(s) in a row within 60s of starting; the stack stops at 3)" in output
    assert (
        "consolidator-0 died 3 times in a row, each within 60s of its start (last: killed by SIGKILL); "
        "stopping the stack" in output
    )
    assert output.rstrip().endswith("engram ◆ stopped")
    assert not await ready(stack.url)  # the query service was stopped with it
    assert not stack.children("services.")


async def test_ctrl_c_while_the_embedded_redis_starts_stops_cleanly(tmp_path):
    """It was a KeyboardInterrupt traceback that left the server running (in a session of its own)."""
    import redis as sync_redis

    stack = Stack(tmp_path / "data").start()
    try:
        await wait_until(lambda: stack.children("redis-server"), timeout=30, message="redis-server started")
        code = stack.stop()
    finally:
        stack.kill()
    output = stack.output()
    assert code == 0 and "Traceback" not in output, output[-3000:]
    assert output.rstrip().endswith("engram ◆ stopped")
    with pytest.raises(sync_redis.exceptions.ConnectionError):
        sync_redis.Redis(port=stack.redis_port, socket_connect_timeout=1).ping()


def test_a_second_run_of_a_locked_data_dir_is_refused_before_starting_anything(tmp_path):
    from services.run_lock import lock_data_dir

    fd = lock_data_dir(tmp_path)  # as a running `make run` holds it
    try:
        stack = Stack(tmp_path)
        proc = run_module("services.run", env=stack.env, timeout=60)
    finally:
        os.close(fd)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert f"ENGRAM_DATA_DIR={tmp_path} is in use by another `make run` (pid {os.getpid()})" in proc.stderr
    assert not (tmp_path / "redis").exists()  # nothing was started


# a whole `make run` stack (Redis, workers, query service) starts, and its readiness wait
# alone allows 60-90 s; 36 s measured (the stack is started twice, with a reindex between)
@pytest.mark.timeout(180)
async def test_a_reindex_to_another_embedder_pauses_the_running_worker_and_keeps_the_stack_up(tmp_path):
    """docs/architecture.md, replay: running workers never exit the stack on a reindex; they pause, keep the entries,
    and say which setting to restart with. Hashing at 64 vs 128 dimensions makes the mismatch quickly."""
    import redis as sync_redis

    data = tmp_path / "data"
    stack = Stack(data, ENGRAM_EMBED_DIM="64").start()
    try:
        await wait_until(stack.ready, timeout=60, message="query service ready")
        async with aiohttp.ClientSession() as s:

            async def recall(text: str, mode: str = "vector") -> tuple[int, dict]:
                async with s.post(f"{stack.url}/v1/recall", json={"query": text, "mode": mode}) as r:
                    return r.status, await r.json()

            async def publish(task: str) -> None:
                async with s.post(f"{stack.url}/v1/episodes", json={"task": task, "outcome": "success"}) as r:
                    assert r.status == 202

            await publish("fix the flaky login test")
            await wait_until(lambda: _found(recall("flaky login test")), timeout=30, message="first episode")

            env = {
                **stack.env,
                "REDIS_URL": f"redis://127.0.0.1:{stack.redis_port}/0",
                "ENGRAM_EMBED_DIM": "128",
            }
            if (data / "master.key").exists():  # the key `make run` generated for its stream, if any
                env["ENGRAM_MASTER_KEY_FILE"] = str(data / "master.key")
            reindex = run_module("services.admin", "reindex", "--embedder", "hashing", env=env, timeout=60)
            assert reindex.returncode == 0, reindex.stderr[-3000:]
            advice = "restarted with ENGRAM_EMBEDDER=hashing ENGRAM_EMBED_DIM=128"
            await stack.said(
                f"paused: index generation 2 now uses embedder 'hashing-v1' (dim 128), this worker "
                f"'hashing-v1' (dim 64); nothing is projected until it is {advice}"
            )
            await publish("rotate the api keys")  # accepted, and left in the stream by the paused worker
            client = sync_redis.Redis(port=stack.redis_port)
            try:

                def unprojected() -> int:  # never read (lag), or read by a lane and left pending
                    group = client.xinfo_groups("engram:stream:episodes")[0]
                    return group["lag"] + group["pending"]

                await wait_until(
                    lambda: unprojected() == 1, timeout=10, message="the new entry left in the stream"
                )
            finally:
                client.close()
            assert (
                stack.proc.poll() is None
            )  # the stack is up, and its query service says why it is not ready

            async def says_embedder() -> bool:  # 200 until it sees the new generation (LiveTags), then this
                async with s.get(f"{stack.url}/readyz") as r:
                    body = await r.json()
                    return (
                        r.status == 503 and body["checks"]["embedder"] is False and "embedder" in body["why"]
                    )

            await wait_until(says_embedder, timeout=30, message="/readyz names the embedder mismatch")
            status, body = await recall(
                "flaky login test"
            )  # a query vector of 64 dimensions, an index of 128
            detail = body["detail"]  # the live generation's embedder, and what to start this one with
            assert status == 409 and "was built with embedder 'hashing-v1' (dim 128)" in detail, body
            assert "ENGRAM_EMBED_DIM=128" in detail, body
            status, body = await recall("flaky login test", mode="keyword")  # words alone: no cosines
            assert status == 200 and body["similarity_unavailable"] is True, body
            assert [r["similarity"] for r in body["results"]] == [None], body
            async with s.get(f"{stack.url}/v1/episodes") as r:  # reads that embed nothing go on
                listed = await r.json()
                assert r.status == 200 and [e["task"]["description"] for e in listed["results"]] == [
                    "fix the flaky login test"
                ]

        # a worker started now with the old embedder is a configuration error: not restarted in a loop
        [worker] = stack.children("services.consolidator")
        os.kill(worker, signal.SIGKILL)
        code = stack.proc.wait(timeout=60)
    finally:
        stack.kill()
    output = stack.output()
    assert code == 2, output[-3000:]
    assert output.count("consolidator-0 restarted") == 1
    assert "consolidator-0 exited with code 2, a configuration error: " in output
    assert (
        "start it with ENGRAM_EMBEDDER=hashing ENGRAM_EMBED_DIM=128" in output.split("exited with code 2")[1]
    )

    # restarted as advised, the stack projects what waited in the stream
    stack = Stack(data, ENGRAM_EMBED_DIM="128").start()
    try:
        await wait_until(stack.ready, timeout=60, message="query service ready with the new embedder")
        async with aiohttp.ClientSession() as s:

            async def found() -> bool:
                async with s.post(
                    f"{stack.url}/v1/recall", json={"query": "rotate api keys", "mode": "vector", "top_k": 5}
                ) as r:
                    body = await r.json()
                    return r.status == 200 and len(body["results"]) == 2

            await wait_until(found, timeout=30, message="both episodes recalled with the new embedder")
        assert stack.stop() == 0
    finally:
        stack.kill()


async def _found(response) -> bool:
    status, body = await response
    return status == 200 and len(body["results"]) == 1


# a 3-primary cluster starts and stops inside (~25 s measured) besides the stack
@pytest.mark.timeout(240)
async def test_run_on_an_embedded_cluster_publishes_recalls_and_forgets(tmp_path):
    """`ENGRAM_REDIS_CLUSTER=3 make run`, black-box: publish, recall, forget a user, Ctrl-C."""
    stack = Stack(tmp_path / "data", redis_port=_cluster_base_port(3), ENGRAM_REDIS_CLUSTER="3").start()
    url = stack.url
    try:
        await wait_until(stack.ready, timeout=120, message="query service ready on the cluster")
        async with aiohttp.ClientSession() as s:
            body = {"task": "fix the flaky login test", "outcome": "success", "user_id": "alice"}
            async with s.post(f"{url}/v1/episodes", json=body) as r:
                assert r.status == 202

            async def hits() -> int:
                async with s.post(f"{url}/v1/recall", json={"query": "flaky login test"}) as r:
                    return len((await r.json())["results"]) if r.status == 200 else -1

            await wait_until(lambda: _is(hits(), 1), timeout=30, message="episode projected on the cluster")
            async with s.delete(f"{url}/v1/users/alice") as r:
                assert r.status == 202
            await wait_until(lambda: _is(hits(), 0), timeout=30, message="user forgotten on the cluster")
        code = stack.stop(timeout=90)
    finally:
        stack.kill()
    output = stack.output()
    assert code == 0, output[-3000:]
    assert "engram ◆ redis cluster redis+cluster://" in output and "engram ◆ stopped" in output


async def _is(value, want) -> bool:
    return await value == want


def _cluster_base_port(n: int) -> int:
    """A port p <= 55535 with p .. p + n - 1 and their cluster bus ports (+ 10000) free."""
    import socket

    from deploy.embedded_redis import MAX_CLUSTER_PORT

    while True:
        p = free_port()
        if p + n - 1 > MAX_CLUSTER_PORT:
            continue
        try:
            for q in [*range(p, p + n), *range(p + 10000, p + n + 10000)]:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", q))
        except OSError:
            continue
        return p


def _owner(base: int, n: int, namespace: str) -> tuple[int, int]:
    """(port, pid) of the node among `base`..`base + n - 1` owning `namespace`'s slot."""
    import redis as sync_redis

    from shared.keys import ns_tag

    for port in range(base, base + n):
        client = sync_redis.Redis(port=port, socket_timeout=5)
        try:
            slot = client.execute_command("CLUSTER", "KEYSLOT", ns_tag(namespace))
            if any(lo <= slot <= hi for lo, hi in _own_slots(client)):
                return port, int(client.info("server")["process_id"])
        finally:
            client.close()
    raise AssertionError(f"no node owns {namespace}")


def _own_slots(client) -> list[tuple[int, int]]:
    myself = next(
        line for line in client.execute_command("CLUSTER", "NODES").decode().splitlines() if "myself" in line
    )
    return [
        (int(r.split("-")[0]), int(r.split("-")[-1])) for r in myself.split()[8:] if not r.startswith("[")
    ]


# two cluster stacks start and stop inside, besides a node's restart
@pytest.mark.timeout(300)
async def test_a_killed_cluster_node_is_restarted_and_the_cluster_keeps_its_data_across_runs(tmp_path):
    """`ENGRAM_REDIS_CLUSTER=3 make run`: a node killed with -9 went unnoticed (every namespace it
    held answered 503 for good), and the next `make run` started an empty cluster. A node is now
    supervised as the single Redis is (restarted from its AOF and nodes.conf, logged), and the
    cluster's data stays in ENGRAM_DATA_DIR/cluster across runs."""
    base = _cluster_base_port(3)
    stacks = [Stack(tmp_path / "data", redis_port=base, ENGRAM_REDIS_CLUSTER="3") for _ in range(2)]
    try:
        async with aiohttp.ClientSession() as s:

            def recalled(stack: Stack):
                async def check() -> bool:
                    async with s.post(f"{stack.url}/v1/recall", json={"query": "rotate signing keys"}) as r:
                        return r.status == 200 and len((await r.json())["results"]) == 1

                return check

            first, second = stacks
            first.start()
            await wait_until(first.ready, timeout=120, message="query service ready on the cluster")
            await publish_and_recall(
                s,
                first.url,
                {"task": "rotate the signing keys", "outcome": "success"},
                "rotate signing keys",
                message="episode projected on the cluster",
            )
            port, pid = _owner(base, 3, "default")
            os.kill(pid, signal.SIGKILL)
            await first.said(f"redis node {port} (pid {pid}) died, killed by SIGKILL — restart 1 in 0.5s")
            await first.said(f"redis node {port} restarted (pid ")
            await wait_until(first.ready, timeout=60, message="query service ready after the node's restart")
            await wait_until(recalled(first), timeout=30, message="the episode on the restarted node")
            assert first.stop(timeout=90) == 0, first.output()[-3000:]

            second.start()
            await wait_until(second.ready, timeout=120, message="query service ready on the cluster again")
            await wait_until(recalled(second), timeout=30, message="the episode after make run restarted")
            assert second.stop(timeout=90) == 0, second.output()[-3000:]
    finally:
        for stack in stacks:
            if stack.proc is not None:
                stack.kill()
        for port in range(base, base + 3):  # the nodes a killed stack left behind
            with contextlib.suppress(Exception):
                import redis as sync_redis

                sync_redis.Redis(port=port, socket_timeout=2).shutdown(nosave=True)


@pytest.mark.timeout(180)
async def test_the_readmes_second_stack_runs_beside_the_first_in_the_same_checkout(tmp_path):
    """README: `ENGRAM_PORT=18080 ENGRAM_REDIS_PORT=16379 ENGRAM_METRICS_PORT=19191 make run` beside a
    running `make run`, as written (no ENGRAM_DATA_DIR), was refused: both wanted the checkout's `.run`.
    Another Redis port now has its own data directory, `.run/redis-<port>`."""
    from services.run_lock import lock_data_dir

    first = lock_data_dir(tmp_path / ".run")  # the first stack of this checkout, on the default ports
    stack = Stack(tmp_path / "second")
    del stack.env["ENGRAM_DATA_DIR"]
    stack.env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (ROOT, ROOT / "client"))
    stack.cwd = tmp_path  # the checkout: `.run` is relative to where `make run` runs
    try:
        stack.start()
        await wait_until(stack.ready, timeout=90, message="the second stack ready")
        assert (tmp_path / ".run" / f"redis-{stack.redis_port}" / "redis").is_dir()
        assert (tmp_path / ".run" / f"redis-{stack.redis_port}" / "master.key").is_file()
        assert stack.stop() == 0
    finally:
        stack.kill()
        os.close(first)
