"""The runtime of the model embedders (MiniLM, MPNet): the model's transformer, converted once into an
OpenVINO graph, run by OpenVINO's CPU plugin in bfloat16 where the CPU computes it natively
(AVX512_BF16, AMX), else in float32 (cosine to the torch model >= 0.9997).

Export (`ensure_export`, torch): once per model and recipe into `<cache_dir>/<name>-openvino/`, by one
process while the others wait; later starts read it without importing torch. Inference
(`SentenceGraph`): the model's `tokenizer.json`, passes of texts of similar length (`length_batches`),
mean pooling over the attention mask, L2 normalisation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

log = logging.getLogger("engram.embedding")

RECIPE = "engram-openvino-1"  # bump when the export changes: caches export again
GRAPH = "model.xml"  # OpenVINO's form of the graph, its weights in float32 in model.bin


@contextlib.contextmanager
def held(path: str, waiting: str, *, timeout: float = -1) -> Iterator[None]:
    """Hold the file lock at `path` (`filelock.FileLock`) within the block; when another process holds
    it, log `waiting` (INFO) first, then wait up to `timeout` seconds (-1: for ever; filelock.Timeout
    past it), so that a long wait does not look like a hang (a model unpacked or exported once for all)."""
    from filelock import FileLock, Timeout

    lock = FileLock(path, timeout=timeout)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info(waiting)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


class SentenceGraph:
    """One exported transformer compiled by OpenVINO, with its tokenizer: texts → mean-pooled,
    L2-normalised float32[n, dim]. `precision` is "bf16" or "f32" (what this CPU computes natively)."""

    def __init__(self, graph: Path, model_dir: Path, *, max_seq_length: int, threads: int):
        import openvino
        from tokenizers import Tokenizer

        core = openvino.Core()
        native = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        self.precision = "bf16" if "BF16" in native else "f32"
        config = {
            "INFERENCE_PRECISION_HINT": self.precision,
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
        }
        self.compiled = core.compile_model(core.read_model(str(graph)), "CPU", config)
        self.dim = int(self.compiled.outputs[0].get_partial_shape()[-1].get_length())
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.enable_truncation(max_seq_length)
        tokenizer.no_padding()  # each pass pads to its own longest text
        pad_id = tokenizer.token_to_id(_pad_token(model_dir))
        if pad_id is None:
            raise ValueError(f"the tokenizer at {model_dir} has no id for its padding token")
        self.pad_id = int(pad_id)
        self.tokenizer = tokenizer

    def _hidden(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """The last hidden state, float32[rows, pieces, dim], of one padded pass."""
        request = self.compiled.create_infer_request()  # a compiled model's own request is not thread-safe
        return np.asarray(request.infer(feed)[0], dtype=np.float32)  # infer() returns copies

    def encode_counted(self, texts: list[str], batch_size: int) -> tuple[np.ndarray, list[bool]]:
        """Texts → (float32[len(texts), dim] unit rows in input order, [cut to the window?]).

        Passes of at most `batch_size` texts, sorted by word-piece count (`length_batches`). The
        attention mask keeps the padding out of every row, so a row does not depend on its neighbours
        beyond rounding."""
        n = len(texts)
        if not n:
            return np.zeros((0, self.dim), dtype=np.float32), []
        encodings = self.tokenizer.encode_batch(texts)
        order = sorted(range(n), key=lambda i: len(encodings[i].ids))
        lengths = [len(encodings[i].ids) for i in order]
        out = np.empty((n, self.dim), dtype=np.float32)
        for part in length_batches(lengths, batch_size):
            rows = order[part.start : part.stop]
            ids = np.full((len(rows), lengths[part.stop - 1]), self.pad_id, dtype=np.int64)
            mask = np.zeros_like(ids)
            for k, i in enumerate(rows):
                piece_ids = encodings[i].ids
                ids[k, : len(piece_ids)] = piece_ids
                mask[k, : len(piece_ids)] = 1
            hidden = self._hidden({"input_ids": ids, "attention_mask": mask})
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            out[rows] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out, [bool(e.overflowing) for e in encodings]


BATCH_OVERHEAD_TOKENS = 64
"""What one more pass costs, in padded word pieces, for `length_batches` (few short rows use the matrix
units less well)."""


def length_batches(lengths: list[int], cap: int, overhead: int = BATCH_OVERHEAD_TOKENS) -> list[range]:
    """Cut texts sorted by length (`lengths`: word pieces, ascending) into consecutive passes of at
    most `cap` texts, minimising the padded size Σ (texts × longest) + `overhead` per pass: an exact
    dynamic programme over the cut points, O(len(lengths) · cap). Returns ranges of positions that
    cover 0..len(lengths) in order."""
    n = len(lengths)
    best = [0] * (n + 1)  # best[j]: least cost of the first j texts
    cut = [0] * (n + 1)  # cut[j]: where the last pass of that best cut begins
    for end in range(1, n + 1):
        longest = lengths[end - 1]  # ascending: the last text of a pass is its longest
        start = max(0, end - cap)
        best[end] = best[start] + (end - start) * longest + overhead
        cut[end] = start
        for begin in range(start + 1, end):
            cost = best[begin] + (end - begin) * longest + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    parts = []
    end = n
    while end:
        parts.append(range(cut[end], end))
        end = cut[end]
    return parts[::-1]


def _pad_token(model_dir: Path) -> str:
    config = json.loads((model_dir / "special_tokens_map.json").read_text(encoding="utf-8"))
    pad = config.get("pad_token", "[PAD]")
    return str(pad["content"] if isinstance(pad, dict) else pad)


def fingerprint(model_dir: Path) -> str:
    """What the export depends on: the model files' names and sizes, and RECIPE."""
    digest = hashlib.blake2b(RECIPE.encode(), digest_size=12)
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(f"|{path.relative_to(model_dir)}:{path.stat().st_size}".encode())
    return digest.hexdigest()


def export(model_dir: Path, target: Path, *, threads: int) -> dict[str, Any]:
    """Export the transformer of the sentence-transformers model at `model_dir` into `target` (a
    directory created here, atomically) → its manifest. The caller holds the export lock. Needs torch,
    sentence-transformers and openvino; raises what they raise (ImportError, OSError, RuntimeError)."""
    started = time.monotonic()  # importing torch is half a first export (11 of 22 s): counted
    import openvino
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    with _quiet_libraries():
        model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    window = int(model.max_seq_length or model.tokenizer.model_max_length)
    inner = cast(Any, model[0]).auto_model.eval()

    class Hidden(torch.nn.Module):  # by keyword: models differ in the order of their arguments
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    sample = model.tokenizer(["a b", "a longer sample text"], padding=True, return_tensors="pt")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    work.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every process and user
    try:
        with warnings.catch_warnings(), torch.no_grad(), _quiet_libraries():
            warnings.simplefilter("ignore")  # the tracer's notes on the model's Python branches
            graph = openvino.convert_model(
                Hidden(),
                example_input=(sample["input_ids"], sample["attention_mask"]),
                input=[(name, [-1, -1], openvino.Type.i64) for name in ("input_ids", "attention_mask")],
            )
        openvino.save_model(graph, str(work / GRAPH), compress_to_fp16=False)  # and its .bin beside
        manifest = {
            "fingerprint": fingerprint(model_dir),
            "max_seq_length": window,
            "export_seconds": round(time.monotonic() - started, 1),
        }
        (work / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    """Within the block, transformers draws no progress bar ("Loading weights") and says only errors,
    and sentence-transformers only warnings: the export's own lines ("exporting …", "export done")
    say what happens, and their notes (an unused `loss_type`) are not ours to act on."""
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    st_log = logging.getLogger("sentence_transformers")
    st_level = st_log.level
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    st_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        st_log.setLevel(st_level)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def ensure_export(model_dir: Path, cache_dir: Path, name: str, *, threads: int) -> tuple[Path, int]:
    """(the export directory of `name`, the model's window in word pieces), exporting first when it is
    missing or stale. A current export is read without the lock (a read-only cache, exported at build,
    works); else one process exports (file lock, waits up to 15 minutes) and the others read its result.
    Raises what `export` raises, filelock.Timeout, and OSError for an unwritable cache."""
    target = cache_dir / f"{name}-openvino"
    want = fingerprint(model_dir)
    if (window := _current_window(target, want)) is not None:
        return target, window
    cache_dir.mkdir(parents=True, exist_ok=True)
    waiting = f"{name} ◆ another process is exporting the model; waiting for it"
    with held(str(cache_dir / f"{name}-openvino.lock"), waiting, timeout=900):
        if (window := _current_window(target, want)) is not None:  # exported while we waited
            return target, window
        log.info("%s ◆ exporting the model once for every process (torch → OpenVINO) ◆ %s", name, target)
        manifest = export(model_dir, target, threads=threads)
        log.info("%s ◆ export done in %.0fs", name, manifest["export_seconds"])
        return target, int(manifest["max_seq_length"])


def is_exported(model_dir: Path, cache_dir: Path, name: str) -> bool:
    """Whether `cache_dir` holds a current export of the model at `model_dir` (`ensure_export` would
    read it, not export). Reads names and sizes only: no torch, no lock."""
    return _current_window(cache_dir / f"{name}-openvino", fingerprint(model_dir)) is not None


def _current_window(target: Path, fingerprint: str) -> int | None:
    """The window recorded by a current export at `target`, or None (none, stale or damaged)."""
    try:
        manifest = json.loads((target / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != fingerprint:
        return None
    window = manifest.get("max_seq_length")  # damaged by hand: export again rather than fail every start
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None


def load_graph(
    model_dir: str | os.PathLike[str], cache_dir: str | os.PathLike[str], name: str, threads: int
) -> SentenceGraph:
    """The `SentenceGraph` of the model at `model_dir`, exported into `cache_dir` first if needed.
    Raises ImportError without openvino/tokenizers (or torch/sentence-transformers for an export)."""
    source = Path(model_dir)
    target, window = ensure_export(source, Path(cache_dir), name, threads=threads)
    return SentenceGraph(target / GRAPH, source, max_seq_length=window, threads=threads)
