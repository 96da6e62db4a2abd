"""A client generated from the OpenAPI document (`openapi-python-client`) type-checks under `mypy
--strict`, and its typed calls work against the running service: ingest, then recall and GET parse the
real answers into the generated models."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.consolidator.worker import Worker
from services.query.app import openapi_document
from shared.embedding import HashingEmbedder
from shared.redis_conn import connect
from shared.settings import Settings
from tests.helpers import drop_prefix
from tests.integration.test_schemathesis import LiveApp

pytestmark = pytest.mark.slow  # generates a package and runs mypy on it (~20 s)

KEY = "generated-client-key-000000000000"
PACKAGE = "engram_query_service_client"
USAGE = """
from engram_query_service_client import AuthenticatedClient
from engram_query_service_client.api.memory import get_episode, ingest, recall
from engram_query_service_client.models import (
    Episode, EpisodeAnswer, EpisodeOut, Feedback, IngestAnswer, RecallAnswer, RecallHit, RecallRequest, Task
)
from engram_query_service_client.models.episode_outcome import EpisodeOutcome


def run(base_url: str, key: str) -> tuple[list[str], float, str]:
    client = AuthenticatedClient(base_url=base_url, token=key)
    episode = Episode(
        task=Task(description="renew the tls certificate", category="ops"),
        outcome=EpisodeOutcome.SUCCESS,
        episode_id="gen-1",
        feedback=Feedback(reward=0.75),
        strategy_used="iterative",
    )
    accepted = ingest.sync(client=client, body=episode, wait=10.0)
    assert isinstance(accepted, IngestAnswer), accepted
    found = recall.sync(client=client, body=RecallRequest(query="renew the tls certificate", top_k=3))
    assert isinstance(found, RecallAnswer), found
    hits: list[RecallHit] = found.results
    got = get_episode.sync("gen-1", client=client)
    assert isinstance(got, EpisodeAnswer) and isinstance(got.episode, EpisodeOut), got
    return [h.episode.episode_id for h in hits], hits[0].priority, got.status
"""
MYPY_INI = """[mypy]
strict = True
ignore_missing_imports = True
# the generator's own template passes `*args: object` to httpx's typed __exit__: not the document's types
[mypy-engram_query_service_client.client]
disable_error_code = arg-type
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    spec = out / "openapi.json"
    spec.write_text(json.dumps(openapi_document()))
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("openapi-python-client")),
            "generate",
            "--path",
            str(spec),
            "--meta",
            "none",
        ],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / PACKAGE / "models" / "recall_answer.py").exists(), done.stdout
    (out / "usage.py").write_text(USAGE)
    return out


@pytest.fixture(scope="module")
def live_url(redis_url) -> Iterator[str]:
    prefix = f"gc{uuid.uuid4().hex[:8]}:"
    settings = Settings(
        redis_url=redis_url,
        prefix=prefix,
        embedder="hashing",
        embed_dim=64,
        vector_algorithm="FLAT",
        api_keys={KEY: "ns-generated"},
    )
    app = LiveApp(settings)
    app.start()
    stop = asyncio.Event()

    async def consolidate() -> None:  # a consolidator on the app's loop, as the stack runs one beside it
        r = connect(redis_url)
        worker = Worker(settings, r, HashingEmbedder(settings.embed_dim), name="generated")
        await worker.setup()
        while not stop.is_set():
            await worker.turn()
        await r.aclose()

    running = asyncio.run_coroutine_threadsafe(consolidate(), app.loop)
    try:
        yield app.url
    finally:
        app.loop.call_soon_threadsafe(stop.set)
        running.result(timeout=30)
        app.stop()
        drop_prefix(redis_url, prefix)


def test_the_generated_client_type_checks(generated):
    (generated / "mypy.ini").write_text(MYPY_INI)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-incremental", PACKAGE, "usage.py"],
        cwd=generated,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # a wrong type in a caller's code is caught (the types are not all Any)
    (generated / "wrong.py").write_text(USAGE.replace("top_k=3", 'top_k="3"'))
    wrong = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "wrong.py"],
        cwd=generated,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wrong.returncode == 1 and "top_k" in wrong.stdout, wrong.stdout


def test_the_generated_client_reads_the_services_answers(generated, live_url, monkeypatch):
    monkeypatch.syspath_prepend(str(generated))
    import usage  # type: ignore[import-not-found]

    ids, priority, status = usage.run(live_url, KEY)
    assert ids == ["gen-1"] and 0 < priority <= 1 and status == "completed"
