"""OpenVINO backend: the exported float graph (`<name>-onnx/model.onnx`) computed in bfloat16 on a CPU
that does bfloat16 natively (AVX512_BF16 on AMD Zen 4 and Intel Cooper Lake, AMX on Sapphire Rapids).

Why: ingest with the default model (mpnet) is bound by its forward pass (the worker spends 0.84 of its
time in it: docs/benchmarks.md, Ingest). bfloat16 keeps float32's exponent with an 8-bit mantissa and
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
import io
import json
import logging
import math
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shared.embedding_onnx import (
    AGREEMENT_TEXTS,
    FILES,
    OPENVINO,
    OPENVINO_INT8,
    QUERY_AGREEMENT_TEXTS,
    OnnxSentenceModel,
    agreement,
)

log = logging.getLogger("engram.embedding")

NOT_HERE = "this CPU does not compute bfloat16 natively (no AVX512_BF16 or AMX), or openvino is not installed"


class OpenVinoSentenceModel(OnnxSentenceModel):
    """`OnnxSentenceModel` with OpenVINO's CPU plugin instead of an ONNX Runtime session: texts →
    mean-pooled, L2-normalised float32[n, dim]. Thread-safe (one infer request per pass).

    `variant` OPENVINO: the float graph in bfloat16. OPENVINO_INT8: the same graph with its
    matrices' weights stored as int8, one scale per output channel (`compressed`), and each row's
    activations quantised on the fly in groups of DYNAMIC_GROUP features (the CPU plugin's dynamic
    quantisation), so the products run on the cores' int8 dot-product (VNNI) units; what is not a
    matrix product stays bfloat16. Every scale belongs to one weight channel or one word piece, never
    to a pass, so a row does not depend on what shares its pass (unlike ONNX Runtime's int8 graph)
    beyond bfloat16 rounding: bit-for-bit on a VNNI host, 1 - cos <= 7e-6 on an AMX host, whose
    kernels follow the pass's shape (a scale per pass moved rows by 5e-3-9e-3)."""

    def __init__(
        self,
        graph: Path | Any,
        model_dir: Path,
        *,
        max_seq_length: int,
        threads: int,
        core: Any,
        variant: str = OPENVINO,
    ):
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": "bf16",
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
        }
        if variant == OPENVINO_INT8:
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = DYNAMIC_GROUP
        model = core.read_model(str(graph)) if isinstance(graph, Path) else graph
        self.compiled = core.compile_model(model, "CPU", config)
        self.inputs = {i.get_any_name() for i in self.compiled.inputs}
        self.dim = int(self.compiled.outputs[0].get_partial_shape()[-1].get_length())
        self._tokenizer(model_dir, max_seq_length, variant)

    def _hidden(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        request = self.compiled.create_infer_request()  # a compiled model's own request is not thread-safe
        request.infer({k: v for k, v in feed.items() if k in self.inputs})
        return np.asarray(request.get_output_tensor(0).data, dtype=np.float32)


DYNAMIC_GROUP = 64
"""Features per activation scale in OPENVINO_INT8 (`DYNAMIC_QUANTIZATION_GROUP_SIZE`). mpnet on LoCoMo
turns, cosine to the float graph (mean / least) and turns/s on 2 cores: 32 → 0.99890 / 0.9973, 58-59;
64 → 0.99877 / 0.9966, 65-73; 128 → 0.99844 / 0.9964, 72-74; a whole row (768) → 0.9955 / 0.989;
bfloat16 0.99994 / 0.9992, 52-53."""

COMPRESSED = "openvino-int8w.xml"
"""The int8-weight copy of the float graph in the export directory (with its `.bin`), made once."""


def compressed(core: Any, target: Path, *, again: bool = False) -> tuple[Any, bool]:
    """(the float graph of the export at `target` with its matrices' weights as int8, one symmetric
    scale per output channel (NNCF's `compress_weights`, mode INT8_SYM), whether this call made it).

    Read from COMPRESSED when an earlier process made it, else made (~5 s for mpnet) under the export's
    lock and saved there (written beside, renamed). A copy that cannot be read, or any copy when
    `again` (`load` found one disagreeing with the float graph), is made afresh with a warning. Where
    the cache cannot be written (an image's, read-only: no lock file can be made) the copy is made in
    memory for this process. Raises ImportError without `nncf` when a copy has to be made."""
    from filelock import FileLock, Timeout

    path = target / COMPRESSED
    if not again and (found := _read(core, path)) is not None:  # no lock needed to read a whole copy
        return found, False
    try:
        lock = FileLock(str(target.parent / f"{target.name}.lock"), timeout=900)  # the export's lock
        try:
            lock.acquire(timeout=0)
        except Timeout:  # another process makes it: say so, a silent wait looks hung
            log.info("another process is making the int8-weight copy; waiting for it ◆ %s", target)
            lock.acquire()
    except OSError as exc:  # read-only cache
        log.info("the model cache is not writable: the int8-weight copy is made in memory ◆ %s", exc)
        return _make(core, target, None), True
    try:
        if not again and (found := _read(core, path)) is not None:  # made while we waited
            return found, False
        return _make(core, target, path), True
    finally:
        lock.release()


def _read(core: Any, path: Path) -> Any | None:
    """The saved copy at `path`, or None when there is none or it cannot be read (logged)."""
    weights = path.with_suffix(".bin")
    if not path.exists():
        return None
    if not weights.exists():
        log.warning("the int8-weight copy has no %s: making it again ◆ %s", weights.name, path)
        return None
    try:
        return core.read_model(str(path))
    except RuntimeError as exc:  # cut short or edited
        why = " ".join(str(exc).split())[-300:]  # OpenVINO's message: source lines first, the reason last
        log.warning("the int8-weight copy could not be read, making it again ◆ %s ◆ %s", path, why)
        return None


def _make(core: Any, target: Path, path: Path | None) -> Any:
    """Compress the float graph (see `compressed`); saved at `path` (None: kept in memory only).
    Called under the export's lock when `path` is given, so any `.int8w-*` work directory there is a
    killed process's and is removed first."""
    import nncf
    import openvino

    log.info("making the int8-weight copy of the graph once for every process (NNCF, ~5 s) ◆ %s", target)
    quiet, level = logging.getLogger("nncf"), logging.getLogger("nncf").level
    quiet.setLevel(logging.ERROR)  # not nncf.set_log_level: it sets the level of every handler it holds
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its tables and progress bars are not our log
            model = nncf.compress_weights(
                core.read_model(str(target / FILES["onnx"])), mode=nncf.CompressWeightsMode.INT8_SYM
            )
    finally:
        quiet.setLevel(level)
    if path is None:
        return model
    for stale in target.glob(".int8w-*"):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        work = Path(tempfile.mkdtemp(dir=target, prefix=".int8w-"))
    except OSError:
        return model
    try:
        openvino.save_model(model, str(work / COMPRESSED), compress_to_fp16=False)
        for saved in (work / COMPRESSED).with_suffix(".bin"), work / COMPRESSED:
            saved.chmod(0o644)  # a shared cache: every user's processes read it
        os.replace((work / COMPRESSED).with_suffix(".bin"), path.with_suffix(".bin"))
        os.replace(work / COMPRESSED, path)  # the .xml last: it is what says a copy is there
    except OSError as exc:
        log.warning("the int8-weight copy could not be saved (kept in memory) ◆ %s", exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return model


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
    try:
        fd, tmp = tempfile.mkstemp(dir=target, suffix=".npy")  # written beside, renamed: never half-read
    except OSError:  # a read-only cache: the gate runs from the float graph each start
        return vectors
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, vectors)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep other users' processes from a shared cache
        os.replace(tmp, path)
    except OSError:  # a read-only cache: the gate runs from the float graph each start
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return vectors


def _no_nncf(exc: ImportError) -> str:
    return f"{exc.name or 'nncf'} is not installed (the int8 copy is made with NNCF)"


def load(
    target: Path,
    source: Path,
    manifest: dict[str, Any],
    *,
    threads: int,
    role: str,
    variant: str = OPENVINO,
) -> tuple[OnnxSentenceModel | None, str]:
    """(the OpenVINO model `variant` (OPENVINO or OPENVINO_INT8) of the export at `target`, what its gate
    measured) or (None, why not): `NOT_HERE`, `nncf` missing for the int8 copy, or its agreement with
    ONNX Runtime's float graph below the bars of `variant` and `role` (`shared.embedding_onnx.bars`)."""
    from shared.embedding_onnx import bars

    core = _core()
    if core is None:
        return None, NOT_HERE
    window = int(manifest["max_seq_length"])
    graph: Path | Any = target / FILES["onnx"]
    made = True
    if variant == OPENVINO_INT8:
        try:
            graph, made = compressed(core, target)
        except ImportError as exc:
            return None, _no_nncf(exc)
    texts = list(QUERY_AGREEMENT_TEXTS if role == "query" else AGREEMENT_TEXTS)
    expected = _reference(target, source, window, threads, role, texts)
    model = OpenVinoSentenceModel(
        graph, source, max_seq_length=window, threads=threads, core=core, variant=variant
    )
    agreed = agreement(expected, model.encode_counted(texts, 16)[0])
    least_mean, least_row = bars(variant, role)
    if not made and (not (agreed.mean >= least_mean and agreed.min >= least_row)):
        # a saved copy that disagrees (damaged in place, a size kept): made afresh once, gated again
        log.warning(
            "the saved int8-weight copy agrees with the float graph at %.5f mean: making it again ◆ %s",
            agreed.mean,
            target / COMPRESSED,
        )
        try:
            graph, _ = compressed(core, target, again=True)
        except ImportError as exc:
            return None, _no_nncf(exc)
        model = OpenVinoSentenceModel(
            graph, source, max_seq_length=window, threads=threads, core=core, variant=variant
        )
        agreed = agreement(expected, model.encode_counted(texts, 16)[0])
    figures = (
        f"agreement with the float graph {agreed.mean:.5f} mean / {agreed.min:.4f} least on {agreed.n} texts"
    )
    if not (agreed.mean >= least_mean and agreed.min >= least_row):
        return None, f"{figures} (needs {least_mean} / {least_row})"
    return model, f"{figures} ◆ {threads} threads"


SPEED_ROUNDS = 3
"""Timed passes per variant in `load_fastest` (the least counts: a start shares the cores with the other
service's)."""


def cpu_signature() -> str:
    """12 hex digits naming what decides OpenVINO's kernels on this host: the CPU's model name and its
    feature flags (`/proc/cpuinfo`; `platform.processor()` where there is none). A model cache shared by
    hosts of two kinds keeps one speed record per kind."""
    model, flags = platform.processor(), ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and not flags:
                model = value.strip()
            elif name.strip() == "flags":
                flags = " ".join(sorted(value.split()))
                break
    return hashlib.sha256(f"{model}\n{flags}".encode()).hexdigest()[:12]


def speed_record(target: Path, role: str, threads: int) -> Path:
    """Where `load_fastest` keeps which variant was faster for `role` on this kind of CPU."""
    return target / f"speed-{role}-{cpu_signature()}-{threads}t.json"


def _pass_seconds(models: dict[str, OnnxSentenceModel], texts: list[str], batch: int) -> dict[str, float]:
    """The least wall seconds of SPEED_ROUNDS passes of `texts` (in passes of `batch`) for each model,
    rounds interleaved so a drifting load falls on each alike, after one warm-up pass each."""
    for model in models.values():
        model.encode_counted(texts, batch)
    best = dict.fromkeys(models, math.inf)
    for _ in range(SPEED_ROUNDS):
        for variant, model in models.items():
            started = time.perf_counter()
            model.encode_counted(texts, batch)
            best[variant] = min(best[variant], time.perf_counter() - started)
    return best


def load_fastest(
    target: Path,
    source: Path,
    manifest: dict[str, Any],
    *,
    threads: int,
    role: str,
    variants: Sequence[str] = (OPENVINO_INT8, OPENVINO),
) -> tuple[OnnxSentenceModel | None, str, str | None]:
    """(the faster on this CPU of the `variants` that pass their gates, what its gate measured and how
    it was chosen, its variant), or (None, why none, None).

    Which is faster depends on the host, not the model: on AMD EPYC (avx512_bf16, avx512_vnni) int8
    products ran mpnet 1.3-1.4x bfloat16's turns/s; on a Xeon with AMX (amx_bf16, amx_int8) bfloat16
    ran 1.44x int8's (162-172 against 111-120 turns/s; 8 questions 36 against 42.5 ms) and agrees
    better with the float graph. So the
    first start loads both (each gated), times SPEED_ROUNDS passes of the gate's texts (documents in
    one pass, queries in passes of 8, as concurrent queries share them), keeps the faster and records
    it in `speed_record` (a read-only cache: measured again at each start); later starts load the
    recorded one (the other only if it fails its gate now). For `role` as in `load`."""
    if _core() is None:
        return None, NOT_HERE, None
    record = speed_record(target, role, threads)
    recorded = ""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # none, or unreadable: measure
        recorded = str(json.loads(record.read_text())["faster"])
    if recorded in variants:
        whys = []
        for variant in (recorded, *(v for v in variants if v != recorded)):
            model, why = load(target, source, manifest, threads=threads, role=role, variant=variant)
            if model is not None:
                how = "faster here" if variant == recorded else f"{recorded} failed its gate"
                return model, f"{why} ◆ {how} ({record.name})", variant
            whys.append(f"{variant}: {why}")
        return None, "; ".join(whys), None
    loaded: dict[str, tuple[OnnxSentenceModel, str]] = {}
    whys = []
    for variant in variants:
        model, why = load(target, source, manifest, threads=threads, role=role, variant=variant)
        if model is None:
            whys.append(f"{variant}: {why}")
        else:
            loaded[variant] = (model, why)
    if not loaded:
        return None, "; ".join(whys), None
    if len(loaded) == 1:
        variant, (model, why) = next(iter(loaded.items()))
        return model, why, variant
    texts = list(QUERY_AGREEMENT_TEXTS if role == "query" else AGREEMENT_TEXTS)
    seconds = _pass_seconds(
        {v: m for v, (m, _) in loaded.items()}, texts, 8 if role == "query" else len(texts)
    )
    faster = min(seconds, key=lambda v: seconds[v])
    measured = ", ".join(f"{v} {seconds[v] * 1e3:.1f} ms" for v in seconds)
    with contextlib.suppress(OSError):  # a read-only cache: measured again at the next start
        work = record.with_name(f".{record.name}.{os.getpid()}")
        work.write_text(json.dumps({"faster": faster, "seconds": seconds, "texts": len(texts), "role": role}))
        os.replace(work, record)
    model, why = loaded.pop(faster)
    loaded.clear()  # the slower graph's memory goes now, not with this frame
    return model, f"{why} ◆ faster here: {measured} for {len(texts)} texts", faster
