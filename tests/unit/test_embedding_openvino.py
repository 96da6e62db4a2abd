"""The OpenVINO bfloat16 backend (shared/embedding_openvino.py) with the real MiniLM export: chosen only
where the CPU computes bfloat16, gated against the float graph on every load, rows independent of their
pass, safe across threads, and refused (falling back) when it misses the bar. No network, no Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from xml.etree import ElementTree

import numpy as np
import pytest

import shared.embedding_graphs as eg
import shared.embedding_onnx as eo
from shared import embedding_openvino as ov
from shared.embedding import MiniLMEmbedder
from shared.settings import Settings
from tests.unit.test_embedding_onnx import locomo_turns, minilm_dir


def _embedder(backend: str) -> MiniLMEmbedder:
    minilm_dir()
    pytest.importorskip("openvino")
    embedder = MiniLMEmbedder(backend=backend, cache_dir=Settings().model_cache, threads=1)
    embedder.load_sync()
    return embedder


@pytest.mark.slow
@pytest.mark.timeout(300)  # a first MiniLM export: 20-40 s idle, minutes on busy cores
def test_openvino_runs_where_the_cpu_has_bfloat16_and_agrees_with_the_float_graph(caplog):
    caplog.set_level(logging.INFO, "engram.embedding")
    embedder = _embedder(eo.OPENVINO)
    if ov._core() is None:  # this host: no native bfloat16; the named backend says why and runs torch
        assert embedder.runs_on == "torch" and ov.NOT_HERE in caplog.text
        return
    model = embedder._model
    assert isinstance(model, ov.OpenVinoSentenceModel) and embedder.runs_on == eo.OPENVINO
    assert "agreement with the float graph" in caplog.text
    turns = locomo_turns(120)
    vectors, _ = model.encode_counted(turns, 64)
    float_graph = _embedder("onnx")._model
    reference, _ = float_graph.encode_counted(turns, 64)
    cos = (vectors * reference).sum(axis=1)
    assert cos.mean() >= 0.999 and cos.min() >= 0.99, (cos.mean(), cos.min())
    # a row does not depend on the pass it is in (no per-pass scale, unlike the int8 graph)
    alone = np.concatenate([model.encode_counted([t], 1)[0] for t in turns[:30]])
    assert ((alone * vectors[:30]).sum(axis=1)).min() >= 0.9999
    # two threads at once get what one gets alone (an infer request per pass)
    got: dict[int, np.ndarray] = {}

    def work(k: int) -> None:
        got[k] = model.encode_counted(turns[k * 60 : (k + 1) * 60], 16)[0]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(2):  # the same texts in the same passes, one thread: the same vectors
        np.testing.assert_allclose(
            got[k], model.encode_counted(turns[k * 60 : (k + 1) * 60], 16)[0], atol=1e-6
        )
    asyncio.run(embedder.aclose())


@pytest.mark.slow
@pytest.mark.timeout(300)  # a first MiniLM export: 20-40 s idle, minutes on busy cores
def test_a_gate_it_misses_falls_back_to_the_float_graph_with_the_reason(monkeypatch, caplog):
    pytest.importorskip("openvino")
    if ov._core() is None:
        pytest.skip("this CPU has no native bfloat16: the gate never runs here")
    caplog.set_level(logging.INFO, "engram.embedding")
    monkeypatch.setitem(eo.MIN_MEAN, eo.OPENVINO, 1.000001)  # a bar no bfloat16 pass can reach
    target, source, manifest = _minilm_export()
    model, why = ov.load(target, source, manifest, threads=1, role="document")
    assert model is None and "needs 1.000001" in why


def _minilm_export() -> tuple[eo.Path, eo.Path, dict]:
    """MiniLM's export in the shared model cache (made if missing), its source and manifest."""
    source = eo.Path(minilm_dir())
    target, manifest = eo.ensure_export(
        source,
        eo.Path(Settings().model_cache or eo.Path.home() / ".cache" / "engram"),
        "minilm-l6-v2",
        threads=1,
    )
    return target, source, manifest


def _minilm_export_copy(tmp_path: eo.Path) -> tuple[eo.Path, eo.Path, dict]:
    """A private copy of MiniLM's export (without an int8-weight copy), its source and manifest."""
    import shutil

    target, source, manifest = _minilm_export()
    copy = tmp_path / "minilm-l6-v2-onnx"
    shutil.copytree(target, copy, ignore=shutil.ignore_patterns("openvino-int8w.*"))
    return copy, source, manifest


@pytest.mark.slow
@pytest.mark.timeout(300)  # a first MiniLM export: 20-40 s idle, minutes on busy cores
def test_openvino_int8_agrees_keeps_rows_independent_of_their_pass_and_compresses_once(
    tmp_path, monkeypatch, caplog
):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    if ov._core() is None:
        pytest.skip("this CPU has no native bfloat16: OpenVINO is not used here")
    target, source, manifest = _minilm_export_copy(tmp_path)
    caplog.set_level(logging.INFO, "engram.embedding")
    model, why = ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)
    assert isinstance(model, ov.OpenVinoSentenceModel) and model.variant == eo.OPENVINO_INT8, why
    assert "making the int8-weight copy" in caplog.text  # a first start says what it is doing
    assert "agreement with the float graph" in why
    assert (target / ov.COMPRESSED).exists() and (target / ov.COMPRESSED).with_suffix(".bin").exists()
    assert not list(target.glob(".int8w-*"))  # the work directory is gone
    turns = locomo_turns(120)
    vectors, _ = model.encode_counted(turns, 64)
    reference, _ = eo.OnnxSentenceModel(
        target / eo.FILES["onnx"],
        source,
        max_seq_length=int(manifest["max_seq_length"]),
        threads=1,
        variant="onnx",
    ).encode_counted(turns, 64)
    cos = (vectors * reference).sum(axis=1)
    assert cos.mean() >= 0.995 and cos.min() >= 0.98, (cos.mean(), cos.min())
    # every scale is a weight channel's or a word piece's: a row is the same alone as in any pass, up to
    # bfloat16 rounding (bit-for-bit on a VNNI host; 1 - cos <= 7e-6 on an AMX one, whose kernels follow
    # the pass's shape). A scale per pass (ONNX Runtime's int8 graph) moved rows by 1 - cos 5e-3-9e-3.
    alone = np.concatenate([model.encode_counted([t], 1)[0] for t in turns[:30]])
    assert (1.0 - (alone * vectors[:30]).sum(axis=1)).max() <= 1e-4
    eight = model.encode_counted(turns[:30], 8)[0]  # what a copy that reads back gives, pass for pass
    # a later load reads the saved copy: it works without NNCF, and says nothing of making one
    monkeypatch.setitem(__import__("sys").modules, "nncf", None)
    caplog.clear()
    again, _ = ov.load(target, source, manifest, threads=1, role="query", variant=eo.OPENVINO_INT8)
    assert again is not None and "making the int8-weight copy" not in caplog.text
    np.testing.assert_allclose(again.encode_counted(turns[:30], 8)[0], eight, atol=1e-5)
    # a damaged copy (cut short) is made again, not a failed start
    monkeypatch.delitem(__import__("sys").modules, "nncf")
    weights = (target / ov.COMPRESSED).with_suffix(".bin")
    weights.write_bytes(weights.read_bytes()[:1000])
    caplog.clear()
    remade, _ = ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)
    assert remade is not None and "could not be read, making it again" in caplog.text
    np.testing.assert_allclose(remade.encode_counted(turns[:30], 8)[0], eight, atol=1e-5)
    monkeypatch.setitem(__import__("sys").modules, "nncf", None)
    # without the copy and without NNCF: refused with the reason, nothing half-written left behind
    for path in (target / ov.COMPRESSED, (target / ov.COMPRESSED).with_suffix(".bin")):
        path.unlink()
    none, why = ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)
    assert none is None and "nncf is not installed" in why
    assert not (target / ov.COMPRESSED).exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_openvino_int8_misses_its_own_bar_with_the_reason(tmp_path, monkeypatch):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    if ov._core() is None:
        pytest.skip("this CPU has no native bfloat16: the gate never runs here")
    monkeypatch.setitem(eo.MIN_MEAN, eo.OPENVINO_INT8, 0.99999)  # above what int8 products reach
    target, source, manifest = _minilm_export_copy(tmp_path)
    model, why = ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)
    assert model is None and "needs 0.99999" in why
    # the bfloat16 graph's own bar is untouched by the int8 one's
    assert ov.load(target, source, manifest, threads=1, role="document")[0] is not None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_openvino_int8_remakes_a_copy_damaged_in_place_and_works_where_no_lock_can_be_made(tmp_path, caplog):
    """A copy whose weights were overwritten in place (same size, so it still reads) disagrees with the
    float graph: it is made again once, not left to send every start to bfloat16. A cache where no lock
    file can be made (read-only: a container's image) still gets the int8 graph, made in memory."""
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    if ov._core() is None:
        pytest.skip("this CPU has no native bfloat16: OpenVINO is not used here")
    caplog.set_level(logging.INFO, "engram.embedding")
    target, source, manifest = _minilm_export_copy(tmp_path)
    first, _ = ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)
    turns = locomo_turns(20)
    expected = first.encode_counted(turns, 8)[0]
    weights = (target / ov.COMPRESSED).with_suffix(".bin")
    size = weights.stat().st_size
    with open(weights, "r+b") as f:  # 2 MB of one byte in the first half's weights, the size kept
        f.seek(size // 4)
        f.write(b"\x11" * 2_000_000)
    caplog.clear()
    again, why = ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)
    assert again is not None, why
    assert "agrees with the float graph at" in caplog.text and "making it again" in caplog.text
    np.testing.assert_allclose(again.encode_counted(turns, 8)[0], expected, atol=1e-5)
    assert weights.stat().st_size == size and not list(target.glob(".int8w-*"))
    # a killed process's work directory is swept by the next one that makes a copy
    (target / ".int8w-killed").mkdir()
    (target / ".int8w-killed" / "half.bin").write_bytes(b"x" * 100)
    for path in (target / ov.COMPRESSED, weights):
        path.unlink()
    assert (
        ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)[0] is not None
    )
    assert not list(target.glob(".int8w-*"))
    # no lock can be made (the lock path is taken by a directory): made in memory, nothing saved
    for path in (target / ov.COMPRESSED, weights):
        path.unlink()
    lock = target.parent / f"{target.name}.lock"
    lock.unlink(missing_ok=True)
    lock.mkdir()
    caplog.clear()
    in_memory, why = ov.load(target, source, manifest, threads=1, role="query", variant=eo.OPENVINO_INT8)
    assert in_memory is not None, why
    assert "not writable: the int8-weight copy is made in memory" in caplog.text
    assert not (target / ov.COMPRESSED).exists()
    np.testing.assert_allclose(in_memory.encode_counted(turns, 8)[0], expected, atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_openvino_int8_a_copy_whose_vectors_are_nan_fails_the_gate_and_is_made_again(tmp_path, caplog):
    """Weights overwritten with 0xff (the size kept) give NaN scales, so NaN vectors. NaN compares False
    with everything: a gate written as `mean < bar` let such a copy through and every recall answered
    500. The gate passes a copy only when its agreement is a number at or above the bars."""
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    if ov._core() is None:
        pytest.skip("this CPU has no native bfloat16: OpenVINO is not used here")
    caplog.set_level(logging.INFO, "engram.embedding")
    target, source, manifest = _minilm_export_copy(tmp_path)
    first, _ = ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)
    turns = locomo_turns(20)
    expected = first.encode_counted(turns, 8)[0]
    weights = (target / ov.COMPRESSED).with_suffix(".bin")
    size = weights.stat().st_size
    with open(weights, "r+b") as f:  # every dense layer's float32 bias becomes 0xffffffff, a NaN
        for layer in ElementTree.parse(target / ov.COMPRESSED).iter("layer"):
            data = layer.find("data")
            if layer.get("type") == "Const" and layer.get("name", "").endswith("dense.bias"):
                assert data.get("element_type") == "f32"
                f.seek(int(data.get("offset")))
                f.write(b"\xff" * int(data.get("size")))
    assert weights.stat().st_size == size
    damaged = ov.OpenVinoSentenceModel(
        ov._read(ov._core(), target / ov.COMPRESSED),
        source,
        max_seq_length=int(manifest["max_seq_length"]),
        threads=1,
        core=ov._core(),
        variant=eo.OPENVINO_INT8,
    )
    assert np.isnan(damaged.encode_counted(turns[:4], 4)[0]).any()  # the damage this test is about
    caplog.clear()
    again, why = ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)
    assert again is not None, why
    assert "agrees with the float graph at nan mean: making it again" in caplog.text
    vectors = again.encode_counted(turns, 8)[0]
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(vectors, expected, atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_openvino_starts_from_a_read_only_cache_without_the_gates_reference_files(tmp_path, monkeypatch):
    """The gate's reference vectors are saved beside the export once; a read-only cache made before they
    existed cannot save them. mkstemp's OSError there crashed every start: now the reference is computed
    from the float graph each start and nothing is written."""
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    if ov._core() is None:
        pytest.skip("this CPU has no native bfloat16: OpenVINO is not used here")
    target, source, manifest = _minilm_export_copy(tmp_path)
    assert ov.load(target, source, manifest, threads=1, role="document", variant=eo.OPENVINO_INT8)[0]
    for reference in target.glob("reference-*.npy"):
        reference.unlink()
    before = sorted(p.name for p in target.iterdir())

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Read-only file system", kwargs.get("dir"))

    monkeypatch.setattr(ov.tempfile, "mkstemp", read_only)
    for variant in (eo.OPENVINO_INT8, eo.OPENVINO):
        for role in ("document", "query"):
            model, why = ov.load(target, source, manifest, threads=1, role=role, variant=variant)
            assert model is not None, (variant, role, why)
            assert "agreement with the float graph" in why
    assert sorted(p.name for p in target.iterdir()) == before  # nothing saved, nothing half-written


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_faster_variant_is_measured_on_this_cpu_once_and_recorded(tmp_path, monkeypatch):
    """`load_fastest`: the first load gates and times both OpenVINO variants, keeps the faster and
    records it per kind of CPU; a later load takes the record without timing, and the other variant
    only if the recorded one fails its gate."""
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    if ov._core() is None:
        pytest.skip("this CPU has no native bfloat16: OpenVINO is not used here")
    target, source, manifest = _minilm_export_copy(tmp_path)
    timed: list[dict[str, float]] = []
    real = ov._pass_seconds

    def spy(models, texts, batch):
        timed.append(real(models, texts, batch))
        return timed[-1]

    monkeypatch.setattr(ov, "_pass_seconds", spy)
    model, why, variant = ov.load_fastest(target, source, manifest, threads=1, role="query")
    assert len(timed) == 1 and set(timed[0]) == {eo.OPENVINO_INT8, eo.OPENVINO}
    assert variant == min(timed[0], key=timed[0].get) and model.variant == variant
    assert "faster here:" in why and f"{variant} " in why
    record = ov.speed_record(target, "query", 1)
    assert json.loads(record.read_text())["faster"] == variant
    assert not ov.speed_record(target, "document", 1).exists()  # each role measures its own passes

    for recorded in (eo.OPENVINO, eo.OPENVINO_INT8):  # the record decides, nothing is timed again
        record.write_text(json.dumps({"faster": recorded}))
        model, why, variant = ov.load_fastest(target, source, manifest, threads=1, role="query")
        assert variant == recorded == model.variant and record.name in why
    assert len(timed) == 1
    monkeypatch.setattr(eo, "MIN_QUERY_MEAN", 1.000001)  # no variant passes the queries' gate now
    none, why, variant = ov.load_fastest(target, source, manifest, threads=1, role="query")
    assert none is None and variant is None and "openvino-int8:" in why and "openvino-bf16:" in why


def test_a_cpu_signature_names_this_kind_of_cpu():
    assert ov.cpu_signature() == ov.cpu_signature()
    assert len(ov.cpu_signature()) == 12 and int(ov.cpu_signature(), 16) >= 0


def test_auto_tries_the_openvino_variants_as_one_choice_where_the_first_stood():
    assert eg._groups(("onnx-int8", eo.OPENVINO_INT8, eo.OPENVINO, "onnx")) == [
        ("onnx-int8",),
        (eo.OPENVINO_INT8, eo.OPENVINO),
        ("onnx",),
    ]
    assert eg._groups((eo.OPENVINO, "onnx-int8")) == [(eo.OPENVINO,), ("onnx-int8",)]
