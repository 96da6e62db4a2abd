"""Which exported graph a sentence-transformers embedder runs (`load_onnx`): ONNX Runtime's float or
int8 graph (`shared.embedding_onnx`) or OpenVINO's bfloat16 or int8-weight one
(`shared.embedding_openvino`), by `ENGRAM_EMBED_BACKEND` / `ENGRAM_QUERY_EMBED_BACKEND` and the
agreement gates; None (the embedder runs torch) with the reason logged.

Above both backends: `shared.embedding_openvino` builds on `shared.embedding_onnx`, and this module
imports the two, so neither imports the other back.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shared import embedding_openvino
from shared.embedding_onnx import (
    AUTO_ORDER,
    FILES,
    OPENVINO_VARIANTS,
    QUERY_ORDERS,
    ROLES,
    SETTING,
    OnnxSentenceModel,
    bars,
    check_mean_pooling,
    ensure_export,
    gate_of,
    on_queries,
)
from shared.embedding_openvino import NOT_HERE

log = logging.getLogger("engram.embedding")


def _groups(order: Sequence[str]) -> list[tuple[str, ...]]:
    """`order` with its OpenVINO variants as one group where the first of them stood: which of those
    is faster depends on the host's CPU (`shared.embedding_openvino.load_fastest` measures it there)."""
    vino = tuple(v for v in order if v in OPENVINO_VARIANTS)
    out: list[tuple[str, ...]] = []
    for variant in order:
        if variant not in OPENVINO_VARIANTS:
            out.append((variant,))
        elif variant == vino[0]:
            out.append(vino)
    return out


def _load_openvino(
    target: Path, source: Path, manifest: dict[str, Any], threads: int, role: str, variants: tuple[str, ...]
) -> tuple[OnnxSentenceModel | None, str, str]:
    """(model or None, why, its variant) of the OpenVINO `variants` `load_onnx` reached: the faster of
    two on this host's CPU (`shared.embedding_openvino.load_fastest`: measured there once), or the one.
    `why` is `NOT_HERE` when the CPU cannot run them at all (passed over silently by `auto`)."""
    if len(variants) > 1:
        found, why, chosen = embedding_openvino.load_fastest(
            target, source, manifest, threads=threads, role=role, variants=variants
        )
        variant = chosen or variants[0]
    else:
        variant = variants[0]
        found, why = embedding_openvino.load(
            target, source, manifest, threads=threads, role=role, variant=variant
        )
    return found, why, variant


def load_onnx(
    model_dir: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    name: str,
    backend: str,
    threads: int,
    *,
    role: str = "document",
) -> OnnxSentenceModel | None:
    """The ONNX model for `backend` ("auto", "onnx" or "onnx-int8"; `auto` runs the first variant that
    loads and passes, in AUTO_ORDER, or in QUERY_ORDERS for a model's queries), exporting it first if
    needed, or None when it cannot be used: onnxruntime or the exporter is missing, the model is not
    mean-pooled, the export failed, or the variant failed the agreement gate of `role` (ROLES:
    "document" vectors are stored, "query" vectors only compared with them; see `gate_of`). The reason
    is logged (a warning when the backend was asked for by name) and the caller runs torch. Raises
    ValueError for a role not in ROLES."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    level = logging.INFO if backend == "auto" else logging.WARNING
    source = Path(model_dir)
    reason = check_mean_pooling(source)
    try:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as exc:
        reason = reason or f"{exc.name} is not installed (pip install onnxruntime onnx)"
    if reason is None:
        try:
            target, manifest = ensure_export(source, Path(cache_dir), name, threads=threads)
        except Exception as exc:  # any exporter failure falls back to torch, with the reason
            reason = f"the ONNX export failed ({type(exc).__name__}: {exc})"
    if reason is not None:
        log.log(level, "%s ◆ %s=%s ◆ running torch: %s", name, SETTING[role], backend, reason)
        return None
    failed: list[str] = []
    order = QUERY_ORDERS.get(name, AUTO_ORDER) if role == "query" else AUTO_ORDER
    for group in _groups(order) if backend == "auto" else [(backend,)]:
        variant = group[0]
        if variant in OPENVINO_VARIANTS:  # gated at load, on this host's CPU (shared/embedding_openvino.py)
            found, why, variant = _load_openvino(target, source, manifest, threads, role, group)
            if found is not None:
                if failed:
                    log.info("%s ◆ %s=%s ◆ passed over %s", name, SETTING[role], backend, "; ".join(failed))
                log.info(
                    "%s ◆ %s for %s ◆ %s", name, variant, "queries" if role == "query" else "documents", why
                )
                return found
            if backend != "auto" or why != NOT_HERE:  # a group's why names each of its variants
                failed.append(why if len(group) > 1 else f"{variant}: {why}")
            continue
        agreed = gate_of(manifest, variant, role)
        if agreed is None or not agreed.passes(variant, role):
            texts, needs = "queries" if on_queries(variant, role) else "texts", bars(variant, role)
            failed.append(
                f"{variant}'s agreement with torch on {texts} was not measured by this export"
                if agreed is None
                else f"{variant} (agrees with torch at mean {agreed.mean:.4f} / min {agreed.min:.4f} "
                f"on {texts}; needs {needs[0]} / {needs[1]})"
            )
            continue
        if failed:  # `auto` passed over a faster graph: say why, or the fallback looks like a choice
            log.info("%s ◆ %s=%s ◆ passed over %s", name, SETTING[role], backend, "; ".join(failed))
        model = OnnxSentenceModel(
            target / FILES[variant],
            source,
            max_seq_length=int(manifest["max_seq_length"]),
            threads=threads,
            variant=variant,
        )
        log.info(
            "%s ◆ ONNX Runtime %s for %s ◆ agreement with torch %.4f ◆ %d threads",
            name,
            variant,
            "queries" if role == "query" else "documents",
            agreed.mean,
            threads,
        )
        return model
    log.log(level, "%s ◆ %s=%s ◆ running torch: %s", name, SETTING[role], backend, "; ".join(failed))
    return None
