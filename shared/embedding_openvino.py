"""OpenVINO backend: the exported float graph (`<name>-onnx/model.onnx`) computed in bfloat16 on a CPU
that does bfloat16 natively (AVX512_BF16 on AMD Zen 4 and Intel Cooper Lake, AMX on Sapphire Rapids).

Why: issue 20's ingest with the default model (mpnet) is bound by its forward pass (docs/benchmarks.md,
"What the model physically allows"). bfloat16 keeps float32's exponent with an 8-bit mantissa and
accumulates in float32, so the vectors stay close to float (no per-tensor activation scale as in the
int8 graph, whose vectors moved with their batch and cost LoCoMo NDCG). Measured on this host (AMD
EPYC, avx512_bf16, 2 threads): 43-52 LoCoMo turns/s against ONNX Runtime's float graph at 20-29, cosine
to it 0.99993 mean / 0.994 least.

Gate, on every load (the CPU decides the arithmetic, so an export's figures would not carry over to
another host): the graph's vectors of `AGREEMENT_TEXTS` (and `QUERY_AGREEMENT_TEXTS` for queries) are
compared with ONNX Runtime's float graph — the same computation as torch (1.0000 at export) — against
the float graph's bars (`MIN_MEAN` / `MIN_ROW`). Where the CPU lacks bfloat16 (`NOT_HERE`) or
`openvino` is not installed, `auto` passes over it silently and runs the float graph.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shared.embedding_onnx import (
    AGREEMENT_TEXTS,
    FILES,
    OPENVINO,
    QUERY_AGREEMENT_TEXTS,
    OnnxSentenceModel,
    agreement,
)

NOT_HERE = "this CPU does not compute bfloat16 natively (no AVX512_BF16 or AMX), or openvino is not installed"


class OpenVinoSentenceModel(OnnxSentenceModel):
    """`OnnxSentenceModel` with OpenVINO's CPU plugin in bfloat16 instead of an ONNX Runtime session:
    texts → mean-pooled, L2-normalised float32[n, dim]. Thread-safe (one infer request per pass)."""

    def __init__(self, graph: Path, model_dir: Path, *, max_seq_length: int, threads: int, core: Any):
        config = {
            "INFERENCE_PRECISION_HINT": "bf16",
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
        }
        self.compiled = core.compile_model(core.read_model(str(graph)), "CPU", config)
        self.inputs = {i.get_any_name() for i in self.compiled.inputs}
        self.dim = int(self.compiled.outputs[0].get_partial_shape()[-1].get_length())
        self._tokenizer(model_dir, max_seq_length, OPENVINO)

    def _hidden(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        request = self.compiled.create_infer_request()  # a compiled model's own request is not thread-safe
        request.infer({k: v for k, v in feed.items() if k in self.inputs})
        return np.asarray(request.get_output_tensor(0).data, dtype=np.float32)


def _core() -> Any | None:
    """An OpenVINO Core when `openvino` is installed and the CPU has native bfloat16, else None."""
    try:
        import openvino
    except ImportError:
        return None
    core = openvino.Core()
    try:
        capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except RuntimeError:
        return None
    return core if "BF16" in capabilities else None


def _reference(
    target: Path, source: Path, window: int, threads: int, role: str, texts: list[str]
) -> np.ndarray:
    """The float graph's vectors of the gate's `texts`, float32[len(texts), dim]: computed once per export
    and kept beside it (`reference-<role>.npy`), since loading the float graph only for the gate kept
    ~300 MB in every later process (measured: 1.24 GB against 0.93 GB for the compiled graph alone).
    The file is named by a digest of the texts and goes with the export (a new export starts without)."""
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]  # other texts, another file
    path = target / f"reference-{role}-{digest}.npy"
    try:
        return np.load(path)
    except (OSError, ValueError):
        pass
    reference = OnnxSentenceModel(
        target / FILES["onnx"], source, max_seq_length=window, threads=threads, variant="onnx"
    )
    vectors = reference.encode_counted(texts, 16)[0]
    fd, tmp = tempfile.mkstemp(dir=target, suffix=".npy")  # written beside, renamed: never read half-written
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, vectors)
        os.replace(tmp, path)
    except OSError:  # a read-only cache: the gate runs from the float graph each start
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return vectors


def load(
    target: Path, source: Path, manifest: dict[str, Any], *, threads: int, role: str
) -> tuple[OnnxSentenceModel | None, str]:
    """(the OpenVINO model of the export at `target`, what its gate measured) or (None, why not):
    `NOT_HERE`, or its agreement with ONNX Runtime's float graph below the float graph's bars."""
    from shared.embedding_onnx import MIN_MEAN, MIN_QUERY_MEAN, MIN_QUERY_ROW, MIN_ROW

    core = _core()
    if core is None:
        return None, NOT_HERE
    window = int(manifest["max_seq_length"])
    graph = target / FILES["onnx"]
    texts = list(QUERY_AGREEMENT_TEXTS if role == "query" else AGREEMENT_TEXTS)
    expected = _reference(target, source, window, threads, role, texts)
    model = OpenVinoSentenceModel(graph, source, max_seq_length=window, threads=threads, core=core)
    agreed = agreement(expected, model.encode_counted(texts, 16)[0])
    least_mean, least_row = (
        (MIN_QUERY_MEAN, MIN_QUERY_ROW) if role == "query" else (MIN_MEAN[OPENVINO], MIN_ROW[OPENVINO])
    )
    figures = (
        f"agreement with the float graph {agreed.mean:.5f} mean / {agreed.min:.4f} least on {agreed.n} texts"
    )
    if agreed.mean < least_mean or agreed.min < least_row:
        return None, f"{figures} (needs {least_mean} / {least_row})"
    return model, f"{figures} ◆ {threads} threads"
