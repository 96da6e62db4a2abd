"""The systems `bench.peer` runs side by side, each behind the same small interface: start its processes
on its own private Redis, take a conversation's turns over HTTP, say how many are searchable, answer a
question with ranked turn ids, stop.

- `EngramSystem`: `python -m services.consolidator run` + `python -m services.query`, with the
  embedder named by its environment (the default `auto` → mpnet in process, or `openai` → the bench's
  embedding server). Turns go to `POST /v1/episodes` (`{"episodes": [...]}`), questions to
  `POST /v1/recall`; one API key per conversation's namespace.
- `AgentMemoryServer`: Redis's agent-memory-server (`agent-memory api` + `agent-memory task-worker`,
  docket tasks) from its own virtual environment (`.venv-peer`, `install_peer`), embedding through the
  bench's embedding server via its OpenAI-compatible provider (LiteLLM). Turns go to
  `POST /v1/long-term-memory/` (indexed by the task worker), questions to
  `POST /v1/long-term-memory/search`. Every feature that calls an LLM is switched off
  (`PEER_ENV`): no network here, and the comparison is of memory services, not of LLMs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    ROOT,
    _log_file,
    _Proc,
    check_alive,
    service_env,
    spawn_query_service,
    spawn_workers,
    stop_processes,
    wait_http_ready,
)
from bench.locomo import Conversation, Question, turn_episode
from deploy.embedded_redis import free_port

PEER_VERSION = "0.15.2"
PEER_VENV = ROOT / ".venv-peer"
PEER_REQUIREMENTS = ROOT / "bench" / "peer-requirements.txt"
PEER_INDEX = "memory_records"  # agent-memory-server's REDISVL_INDEX_NAME default

# agent-memory-server's settings (its config.Settings, read from the environment) for a run with no
# LLM: no discrete-memory extraction, topics, entities, summarisation or semantic-duplicate merging (each
# calls a chat model), the generation models pointed at the local embedding server (which answers 404 to
# anything but embeddings) so that a missed switch fails fast instead of reaching for the internet.
PEER_ENV = {
    "ENABLE_DISCRETE_MEMORY_EXTRACTION": "false",
    "ENABLE_TOPIC_EXTRACTION": "false",
    "ENABLE_NER": "false",
    "ENABLE_WORKING_MEMORY_SUMMARIZATION": "false",
    "COMPACT_SEMANTIC_DUPLICATES": "false",
    "FORGETTING_ENABLED": "false",
    "GENERATION_MODEL": "openai/none",
    "FAST_MODEL": "openai/none",
    "SLOW_MODEL": "openai/none",
    "OPENAI_API_KEY": "bench-no-key",
    "DISABLE_AUTH": "true",
    "AUTH_MODE": "disabled",
    "LOG_LEVEL": "WARNING",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM would fetch its model price list at import
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}

BATCH = 100  # turns per ingest request, for every system


class PeerMissing(SystemExit):
    """The peer's virtual environment is absent or broken; the message says how to install it."""


def iso(ts: float) -> str:
    """UTC epoch seconds → RFC 3339 with a Z."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tag_escape(value: str) -> str:
    """A RediSearch TAG value with every punctuation character escaped (for `@field:{value}`)."""
    return re.sub(r"([^A-Za-z0-9_])", r"\\\1", value)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far, all its threads (`/proc/PID/stat` fields 14
    and 15, in clock ticks; proc(5)); 0.0 when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces; it ends at the last ')'
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class System:
    """One memory service under test. `pids` names its processes for CPU accounting (role → pid)."""

    label: str
    redis_url: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    base: str = ""
    redis_pid: int | None = None
    response_bytes: list[int] = field(default_factory=list)

    def pids(self) -> dict[str, int]:
        raise NotImplementedError

    async def start(self, convs: list[Conversation]) -> None:
        raise NotImplementedError

    def ingest_requests(self, conv: Conversation) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
        """(path, JSON body, headers) of the requests that submit `conv`'s turns, `BATCH` per request."""
        raise NotImplementedError

    async def searchable(self, conv: Conversation) -> int:
        """How many of `conv`'s turns a search can find now."""
        raise NotImplementedError

    def search_request(
        self, conv: Conversation, q: Question, k: int
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        """(path, JSON body, headers) of the request that asks `q`, for the `k` best turns."""
        raise NotImplementedError

    def ranked(self, conv: Conversation, payload: Any) -> list[str]:
        """A search response → the turn ids (`dia_id`) it ranks, best first."""
        raise NotImplementedError

    def stop(self) -> None:
        stop_processes(self.procs)
        self.procs = []


@dataclass
class EngramSystem(System):
    """Engram on `redis_url`: one consolidator and one query service with `env_extra` (ENGRAM_*), the
    query cache off so that a question asked again in a later round is embedded again, as the peer does."""

    env_extra: dict[str, str] = field(default_factory=dict)
    prefix: str = field(default_factory=lambda: f"peer{uuid.uuid4().hex[:6]}:")
    tokens: dict[str, str] = field(default_factory=dict)

    def pids(self) -> dict[str, int]:
        return {"consolidator": self.procs[0].pid, "service": self.procs[1].pid}

    async def start(self, convs: list[Conversation]) -> None:
        self.tokens = {c.namespace: f"bench{i}{uuid.uuid4().hex[:8]}" for i, c in enumerate(convs)}
        env = service_env(
            self.redis_url,
            self.prefix,
            self.env_extra.get("ENGRAM_EMBEDDER", "auto"),
            ENGRAM_QUERY_CACHE="0",
            ENGRAM_API_KEYS=",".join(f"{tok}={ns}" for ns, tok in self.tokens.items()),
            **self.env_extra,
        )
        self.procs = spawn_workers(1, env, name=self.label)
        port = free_port()
        self.procs.append(spawn_query_service(env, port))
        self.base = f"http://127.0.0.1:{port}"
        await wait_http_ready(self.base, self.procs[1], timeout=600.0)

    def _auth(self, conv: Conversation) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[conv.namespace]}"}

    def ingest_requests(self, conv: Conversation) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
        episodes = [turn_episode(t) for t in conv.turns]
        return [
            ("/v1/episodes", {"episodes": episodes[i : i + BATCH]}, self._auth(conv))
            for i in range(0, len(episodes), BATCH)
        ]

    async def searchable(self, conv: Conversation) -> int:
        from redis.exceptions import ResponseError

        from shared.index import Scope, count
        from shared.keys import Keys
        from shared.redis_conn import connect
        from shared.tags import BLAKE2B  # a namespace-only scope digests nothing

        check_alive(self.procs, f"{self.label} process")
        r = connect(self.redis_url)
        try:
            return await count(
                r, Keys(self.prefix).episode_index_alias, Scope(namespace=conv.namespace, tags=BLAKE2B)
            )
        except ResponseError:  # the worker has not created the index yet
            return 0
        finally:
            await r.aclose()

    def search_request(
        self, conv: Conversation, q: Question, k: int
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        return "/v1/recall", {"query": q.text, "top_k": k, "as_of": conv.as_of}, self._auth(conv)

    def ranked(self, conv: Conversation, payload: Any) -> list[str]:
        return [item["episode"]["episode_id"] for item in payload["results"]]


def peer_python(venv: Path) -> Path:
    """The peer venv's interpreter. Raises PeerMissing (with the install command) when it is absent or
    agent-memory-server is not importable there."""
    python = venv / "bin" / "python"
    hint = (
        f"agent-memory-server {PEER_VERSION} is not installed in {venv}: run `make peer-install` "
        "(or `python -m bench.peer install`; a separate Python 3.12 virtual environment, about 500 MB, "
        "never the main one: its dependencies clash with Engram's)"
    )
    if not python.exists():
        raise PeerMissing(hint)
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('agent-memory-server'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise PeerMissing(
            f"{hint} ({probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else 'no version'})"
        )
    return python


@dataclass
class AgentMemoryServer(System):
    """agent-memory-server from `venv` on `redis_url` (its keys are not prefixed: it gets a Redis of its
    own), embedding `embed_model` through the OpenAI-compatible server at `embed_url` (…/v1)."""

    venv: Path = PEER_VENV
    embed_url: str = ""
    embed_model: str = "all-minilm-l6-v2"
    dim: int = 384
    workdir: Path | None = None

    def pids(self) -> dict[str, int]:
        return {"api": self.procs[0].pid, "task worker": self.procs[1].pid}

    def env(self, port: int) -> dict[str, str]:
        """The environment of its API and task worker (see `PEER_ENV`)."""
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
        return {
            **keep,
            **PEER_ENV,
            "REDIS_URL": self.redis_url,
            "OPENAI_API_BASE": self.embed_url,
            "EMBEDDING_MODEL": f"openai/{self.embed_model}",  # LiteLLM's OpenAI provider, at OPENAI_API_BASE
            "REDISVL_VECTOR_DIMENSIONS": str(self.dim),
            "PORT": str(port),
        }

    async def start(self, convs: list[Conversation]) -> None:
        python = peer_python(self.venv)
        cli = [str(python), "-m", "agent_memory_server.cli"]
        port = free_port()
        env = self.env(port)
        # its settings also read a .env file in the working directory: give it an empty one of its own
        self.workdir = Path(tempfile.mkdtemp(prefix="engram-peer-"))
        common = {"cwd": self.workdir, "env": env, "stdout": subprocess.DEVNULL, "stderr": _log_file()}
        self.procs = [
            _Proc([*cli, "api", "--host", "127.0.0.1", "--port", str(port)], **common),
            _Proc([*cli, "task-worker"], **common),
        ]
        self.base = f"http://127.0.0.1:{port}"
        await _wait_peer(self.base, self.procs)

    def ingest_requests(self, conv: Conversation) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
        memories = [
            {
                "id": f"{conv.sample_id}:{t.dia_id}",  # ids are global in this server
                "text": t.text,
                "namespace": conv.namespace,
                "session_id": f"session_{t.session}",
                "memory_type": "episodic",
                "created_at": iso(t.ts),
                "event_date": iso(t.ts),
            }
            for t in conv.turns
        ]
        # deduplicate=false: its semantic de-duplication merges near duplicates with an LLM, and Engram
        # keeps every turn too
        return [
            ("/v1/long-term-memory/", {"memories": memories[i : i + BATCH], "deduplicate": False}, {})
            for i in range(0, len(memories), BATCH)
        ]

    async def searchable(self, conv: Conversation) -> int:
        import redis.asyncio as aredis
        from redis.commands.search.query import Query
        from redis.exceptions import ResponseError

        check_alive(self.procs, "agent-memory-server process")
        r = aredis.from_url(self.redis_url)
        try:
            query = Query(f"@namespace:{{{tag_escape(conv.namespace)}}}").paging(0, 0)
            return int((await r.ft(PEER_INDEX).search(query)).total)
        except ResponseError:  # no index before the first memory is written
            return 0
        finally:
            await r.aclose()

    def search_request(
        self, conv: Conversation, q: Question, k: int
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        return (
            "/v1/long-term-memory/search",
            {"text": q.text, "namespace": {"eq": conv.namespace}, "limit": k},
            {},
        )

    def ranked(self, conv: Conversation, payload: Any) -> list[str]:
        return [m["id"].split(":", 1)[1] for m in payload["memories"]]

    def stop(self) -> None:
        super().stop()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


async def _wait_peer(base: str, procs: list[subprocess.Popen], timeout: float = 120.0) -> None:
    """Until agent-memory-server's `GET /v1/health` answers 200 (RuntimeError with its log if a
    process dies; TimeoutError after `timeout` seconds)."""
    from bench.common import poll_until

    async with httpx.AsyncClient(timeout=5.0) as http:

        async def up() -> bool:
            check_alive(procs, "agent-memory-server process")
            try:
                return (await http.get(f"{base}/v1/health")).status_code == 200
            except httpx.HTTPError:
                return False

        await poll_until(up, timeout=timeout, what="agent-memory-server /v1/health")


# --- installing the peer ------------------------------------------------------------------------------
def find_python312(explicit: str | None = None) -> str:
    """A Python 3.12 interpreter (agent-memory-server 0.15 requires >=3.12,<3.13): `explicit`, else
    `python3.12` on PATH when it runs, else pyenv's 3.12.x. Raises SystemExit naming what to install."""
    candidates = [explicit] if explicit else []
    candidates.append("python3.12")
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [
        str(p / "bin" / "python") for p in sorted((pyenv_root / "versions").glob("3.12*"), reverse=True)
    ]
    for candidate in candidates:
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
                capture_output=True,
                text=True,
                check=False,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == "True":
            return candidate
    raise SystemExit(
        f"agent-memory-server {PEER_VERSION} needs Python 3.12 (none found: tried {', '.join(candidates)}); "
        "pass --python /path/to/python3.12"
    )


def install_peer(venv: Path = PEER_VENV, python: str | None = None) -> Path:
    """Create `venv` with agent-memory-server and the exact versions of `PEER_REQUIREMENTS`; returns its
    interpreter. The pins are a `pip freeze` of a working install (2026-12-01): the package asks for
    agent-memory-client>=0.14.1, which the registry here does not have (0.14.0 serves the one model it
    imports), and mcp 2 removed the FastMCP module it imports, so a plain `pip install` fails."""
    interpreter = find_python312(python)
    if not (venv / "bin" / "python").exists():
        print(f"creating {venv} with {interpreter}", flush=True)
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    print(
        f"installing agent-memory-server {PEER_VERSION} and {PEER_REQUIREMENTS.name} into {venv} (a few minutes)",
        flush=True,
    )
    subprocess.run([*pip, "--no-deps", "-r", str(PEER_REQUIREMENTS)], check=True)
    return peer_python(venv)


def main_install(argv: list[str]) -> int:
    """`python -m bench.peer install [--venv DIR] [--python PATH]`."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.peer install", description=install_peer.__doc__)
    p.add_argument("--venv", type=Path, default=PEER_VENV)
    p.add_argument("--python", default=None, help="a Python 3.12 interpreter (default: found)")
    args = p.parse_args(argv)
    python = install_peer(args.venv, args.python)
    print(f"agent-memory-server ready: {python}", file=sys.stderr)
    return 0
