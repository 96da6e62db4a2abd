"""`engram-admin replay`, `reindex`, `dead-letters`, `redrive` on a real Redis: the server's tasks on its
own command line (services/admin.py), with a progress bar (rate, ETA) and a summary; and the client's
`engram` pointing at it for the commands it no longer has."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from click.testing import CliRunner

from engram_episodic import cli as client_cli
from services.admin import cli, server_env
from shared.index import current_generation
from shared.keys import Keys
from tests.integration.test_consolidator import drain, make_worker
from tests.integration.test_facts import publish
from tests.integration.test_query_support import episode

ROOT = Path(__file__).resolve().parents[2]

# tqdm's bar: "stream: 100%|███| 12/12 [00:00<00:00, 480.1ep/s]" (elapsed<remaining, rate)
BAR = re.compile(r"(\d+)/(\d+) \[[0-9:]+<[0-9:?]+, +[0-9.?]+ ?\w*/s\]")


def env_for(monkeypatch, settings) -> None:
    monkeypatch.setenv("REDIS_URL", settings.redis_url)
    monkeypatch.setenv("ENGRAM_PREFIX", settings.prefix)
    monkeypatch.setenv("ENGRAM_EMBEDDER", "hashing")
    monkeypatch.setenv("ENGRAM_EMBED_DIM", str(settings.embed_dim))
    monkeypatch.setenv("ENGRAM_VECTOR_ALGORITHM", "FLAT")


async def invoke(*args: str):
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), catch_exceptions=False)


async def test_replay_and_reindex_draw_progress_and_summarize(settings, redis, monkeypatch):
    await publish(settings, redis, [episode(f"r{i}", task=f"rotate key {i}") for i in range(12)])
    await drain(make_worker(settings, redis))
    env_for(monkeypatch, settings)
    keys = Keys(settings.prefix)
    before = await current_generation(redis, keys)

    out = await invoke("replay", "--progress", "--json")
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout)
    assert summary["from_generation"] == before and summary["generation"] == before + 1
    assert summary["snapshot_episodes"] == 12 and summary["entries"] == 12 and summary["seconds"] > 0
    bars = {m.group(0) for m in BAR.finditer(out.stderr)}
    assert any(m.group(1) == m.group(2) == "12" for m in BAR.finditer(out.stderr)), out.stderr
    assert "snapshot" in out.stderr and "stream" in out.stderr and bars

    out = await invoke("reindex", "--embedder", "hashing", "--no-progress")
    assert out.exit_code == 0, out.output
    assert re.search(r"reindex: generation \d+ → \d+ \(hashing\): 12 episodes from the snapshot", out.stdout)
    assert not BAR.search(out.stderr)  # --no-progress: no bar (log lines may be there)
    assert "restart the consolidators" not in out.stderr  # the same embedder: nothing to restart
    assert await current_generation(redis, keys) == before + 2

    # a replay keeps the index's embedder: another one (here another dimension) is refused before
    # anything is written (a plain replay must not re-embed a hashing deployment with mpnet)
    monkeypatch.setenv("ENGRAM_EMBED_DIM", str(settings.embed_dim * 2))
    out = await invoke("replay", "--no-progress")
    assert out.exit_code == 2, out.output
    assert "replay keeps the index's embedder" in out.output
    assert f"ENGRAM_EMBEDDER=hashing ENGRAM_EMBED_DIM={settings.embed_dim}" in out.output
    assert await current_generation(redis, keys) == before + 2

    # a reindex to another embedder says what the running stack needs (it pauses until then)
    out = await invoke("reindex", "--embedder", "hashing", "--no-progress", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["embedder_changed"] == 1
    assert (
        f"restart the consolidators and the query service with ENGRAM_EMBEDDER=hashing "
        f"ENGRAM_EMBED_DIM={settings.embed_dim * 2}" in out.stderr
    )


async def test_dead_letters_and_redrive(settings, redis, monkeypatch):
    await publish(settings, redis, [{**episode("bad-vector"), "vector": [0.5, 0.25, 1.0]}])  # 3 dims, not 256
    await drain(make_worker(settings, redis))
    env_for(monkeypatch, settings)

    out = await invoke("dead-letters", "--json")
    assert out.exit_code == 0, out.output
    (letter,) = json.loads(out.stdout)
    assert "dimension" in letter["reason"] or "dim" in letter["reason"], letter
    assert (letter["namespace"], letter["episode_id"]) == ("ns", "bad-vector")  # which episode it was
    human = await invoke("dead-letters")
    assert letter["id"] in human.stdout and "1 dead letter(s)" in human.stderr
    assert "bad-vector" in human.stdout

    out = await invoke("redrive", "nope-0", "--json")
    assert out.exit_code == 1 and "no dead letter has the id(s) nope-0" in out.output
    out = await invoke("redrive", "--all", "--progress", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["redriven"] == 1
    assert any(m.group(1) == m.group(2) == "1" for m in BAR.finditer(out.stderr)), out.stderr
    assert json.loads((await invoke("dead-letters", "--json")).stdout) == []
    out = await invoke("redrive")
    assert out.exit_code == 2  # neither ids nor --all


async def test_discard_deletes_a_dead_letter_its_entry_and_links(settings, redis, monkeypatch):
    """A dead letter no fix makes projectable is deleted, with its original entry in the stream and
    the episode's and user's links to it; nothing is published. Another dead letter stays."""
    bad = [{**episode(f"bad-{i}", user_id="u1"), "vector": [0.5, 0.25, 1.0]} for i in range(2)]
    await publish(settings, redis, bad)
    await drain(make_worker(settings, redis))
    env_for(monkeypatch, settings)
    keys = Keys(settings.prefix)
    letters = json.loads((await invoke("dead-letters", "--json")).stdout)
    assert len(letters) == 2
    gone = next(d for d in letters if d["stream_id"])
    stream_len = await redis.xlen(keys.stream_of("ns"))

    out = await invoke("discard", "nope-0")
    assert out.exit_code == 1 and "discarded 0 of the 1 named dead letter(s)" in out.stdout, out.output
    assert "no dead letter has the id(s) nope-0" in out.output
    out = await invoke("discard", gone["id"], "nope-0", "--json")
    assert out.exit_code == 1 and "no dead letter has the id(s) nope-0" in out.output
    assert json.loads(out.stdout.splitlines()[0])["discarded"] == 1
    left = json.loads((await invoke("dead-letters", "--json")).stdout)
    assert [d["id"] for d in left] == [d["id"] for d in letters if d["id"] != gone["id"]]
    assert await redis.xlen(keys.stream_of("ns")) == stream_len - 1  # its entry too, nothing new
    assert not await redis.xrange(keys.stream_of("ns"), gone["stream_id"], gone["stream_id"])
    links = [await redis.exists(keys.dead_letter_refs("ns", f"bad-{i}")) for i in range(2)]
    assert sorted(links) == [0, 1]  # the discarded letter's episode links to nothing, the other still does
    assert len(await redis.smembers(keys.user_dead_letters("ns", "u1"))) == 1

    out = await invoke("discard", "--all")
    assert out.exit_code == 0 and "discarded 1 dead letter(s)" in out.stdout, out.output
    assert json.loads((await invoke("dead-letters", "--json")).stdout) == []
    assert not await redis.exists(keys.user_dead_letters("ns", "u1"))
    assert (await invoke("discard")).exit_code == 2  # neither ids nor --all


def test_the_client_cli_points_at_the_server_commands():
    runner = CliRunner()
    for args in (["replay", "--progress"], ["dead-letters"], ["run", "--workers", "2"], ["redrive", "--all"]):
        out = runner.invoke(client_cli.cli, args)
        assert out.exit_code == 2, out.output
        (line,) = out.stderr.splitlines()
        assert f"engram-admin {args[0]}" in line and "python -m services.admin" in line, line
    helped = runner.invoke(client_cli.cli, ["--help"]).stdout
    assert "record" in helped and not {"replay", "dead-letters", "redrive"} & set(helped.split())


def test_python_m_services_admin_and_engram_admin_are_one_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "services.admin", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert {"run", "replay", "reindex", "dead-letters", "redrive", "discard", "rotate-master-key"} <= set(
        done.stdout.split()
    )
    assert "engram-admin" in done.stdout
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"] == {"engram-admin": "services.admin:main"}


def test_the_dead_letter_commands_help_says_what_each_option_does():
    """`redrive --help` described --all as "Re-driven every dead letter." (the summary's past participle),
    `discard --help` as "Discarded …", and `dead-letters --json` as printing a summary."""
    runner = CliRunner()

    def options(*args: str) -> str:
        out = runner.invoke(cli, [*args, "--help"], terminal_width=200)
        assert out.exit_code == 0, out.output
        return " ".join(out.stdout.split("Options:")[1].split())

    assert "--all Redrive every dead letter (instead of naming IDS)." in options("redrive")
    assert "--all Discard every dead letter (instead of naming IDS)." in options("discard")
    listing = options("dead-letters")
    assert "--json Print the dead letters as a JSON list." in listing and "--limit" in listing


def test_the_admin_defaults_follow_make_run(tmp_path):
    env = server_env({"ENGRAM_REDIS_PORT": "6400", "ENGRAM_DATA_DIR": str(tmp_path)})
    assert env["REDIS_URL"] == "redis://127.0.0.1:6400/0" and "ENGRAM_MASTER_KEY_FILE" not in env
    (tmp_path / "master.key").write_text("x")
    assert server_env({"ENGRAM_DATA_DIR": str(tmp_path)})["ENGRAM_MASTER_KEY_FILE"] == str(
        tmp_path / "master.key"
    )
    given = {"REDIS_URL": "redis://elsewhere:1/0", "ENGRAM_MASTER_KEY": "k", "ENGRAM_DATA_DIR": str(tmp_path)}
    assert server_env(given) == given  # what is set wins


async def test_run_starts_the_stack_as_make_run_does(monkeypatch):
    import services.run

    seen: dict[str, str | None] = {}

    def fake_main() -> int:  # the supervisor itself is tested in test_run_stack.py
        seen.update({k: os.environ.get(k) for k in ("ENGRAM_WORKERS", "ENGRAM_PORT")})
        return 3

    monkeypatch.setattr(services.run, "main", fake_main)
    for name in ("ENGRAM_WORKERS", "ENGRAM_PORT"):
        # set first, so that monkeypatch restores the variable's absence after the test: `run`
        # writes these into os.environ, and later tests' stacks would inherit ENGRAM_WORKERS=2
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    out = await invoke("run", "--workers", "2", "--port", "8099")
    assert out.exit_code == 3  # the stack's exit status is the command's
    assert seen == {"ENGRAM_WORKERS": "2", "ENGRAM_PORT": "8099"}  # the offline defaults are main()'s


def test_no_test_reads_the_checkouts_run_directory(monkeypatch, tmp_path):
    """A `make run` leaves `.run/master.key` in the checkout; the admin commands read
    `$ENGRAM_DATA_DIR/master.key`, and the suite points ENGRAM_DATA_DIR at a directory of its own."""
    data_dir = Path(os.environ["ENGRAM_DATA_DIR"])
    assert not data_dir.resolve().is_relative_to(Path(__file__).resolve().parents[2])
    monkeypatch.chdir(tmp_path)  # a checkout where `make run` ran first
    (tmp_path / ".run").mkdir()
    (tmp_path / ".run" / "master.key").write_text("the user's key")
    assert "ENGRAM_MASTER_KEY_FILE" not in server_env()


def test_a_stack_on_another_redis_port_has_a_data_dir_of_its_own(monkeypatch, tmp_path):
    from services.run_lock import run_data_dir

    assert run_data_dir({}) == Path(".run") == run_data_dir({"ENGRAM_REDIS_PORT": "6390"})
    assert run_data_dir({"ENGRAM_REDIS_PORT": "16379"}) == Path(".run/redis-16379")
    assert run_data_dir({"ENGRAM_REDIS_PORT": "16379", "ENGRAM_DATA_DIR": "/d"}) == Path("/d")
    monkeypatch.chdir(tmp_path)  # the admin commands of that stack read its key
    (tmp_path / ".run" / "redis-16379").mkdir(parents=True)
    (tmp_path / ".run" / "redis-16379" / "master.key").write_text("x")
    env = server_env({"ENGRAM_REDIS_PORT": "16379"})
    assert env["ENGRAM_MASTER_KEY_FILE"] == str(Path(".run/redis-16379/master.key"))
    assert "ENGRAM_MASTER_KEY_FILE" not in server_env({})


async def test_a_replay_stopped_by_sigterm_drops_the_generation_it_was_building(settings, redis):
    """SIGTERM (a service manager stopping the command) stops a replay as Ctrl-C does: the generation
    it was building is dropped before it exits, not left for the workers' sweep."""
    import signal

    from tests.helpers import wait_until

    await publish(settings, redis, [episode(f"s{i}", task=f"rotate key {i}") for i in range(3000)])
    keys = Keys(settings.prefix)
    env = {
        **os.environ,
        "REDIS_URL": settings.redis_url,
        "ENGRAM_PREFIX": settings.prefix,
        "ENGRAM_EMBEDDER": "hashing",
        "ENGRAM_EMBED_DIM": str(settings.embed_dim),
        "ENGRAM_VECTOR_ALGORITHM": "FLAT",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.admin", "replay", "--no-progress"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        async def building() -> bool:
            return bool(await redis.hget(keys.meta, "building")) or proc.poll() is not None

        await wait_until(building, timeout=60, message="the replay started building")
        assert proc.poll() is None, "the replay ended before it could be stopped"
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode != 0
    assert not await redis.hget(keys.meta, "building")
    gen = await current_generation(redis, keys)
    assert [k async for k in redis.scan_iter(match=f"{settings.prefix}g{gen + 1}:*")] == []
