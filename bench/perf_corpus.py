"""Real texts and their vectors for the default-embedder phases of `make bench` (bench.perf_recall,
bench.perf_ingest): LoCoMo dialogue turns and questions read by path, 2,000-character texts joined from
consecutive turns, generated texts when the LoCoMo file is absent, and the turns' vectors embedded once
and cached.

Why a cache: embedding 100k real texts with mpnet on 2 cores takes ~30+ minutes; a few thousand real
vectors (every LoCoMo turn: 4,124, ~10 minutes once) are embedded by the default embedder on the first
run, stored under `~/.cache/engram-bench/` (keyed by the embedder, its backend and a digest of the
texts, so a changed model or text list is embedded again) and reused. The 100k documents are then
derived from them (`derive`): each a real vector plus small Gaussian noise, renormalised, with a
distinct text. Nothing from the data set is copied into the repository.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.locomo import DEFAULT_DATA, all_texts

CACHE_DIR = Path.home() / ".cache" / "engram-bench"
"""Where corpus vectors are cached (one .npy per embedder, backend and text list)."""


def real_texts(path: Path = DEFAULT_DATA) -> tuple[list[str], list[str], str]:
    """(dialogue turns in order, questions, source) of the LoCoMo file at `path`, or generated texts of
    similar length when it is absent (source "generated"). Turns are `speaker: text [image caption]` as
    bench.locomo publishes them (~125 characters on average, 4,124 of them)."""
    if path.exists():
        turns, questions = all_texts(path)
        return turns, questions, f"LoCoMo ({path.name})"
    return _generated_turns(4096), _generated_questions(1024), "generated"


_SUBJECTS = (
    "my sister",
    "the new job",
    "our trip to Lisbon",
    "the garden",
    "my running club",
    "the book club",
)
_VERBS = ("started", "finished", "talked about", "planned", "worried about", "celebrated", "painted", "fixed")
_WHEN = ("last weekend", "yesterday", "this morning", "two weeks ago", "after work", "on my birthday")


def _generated_turns(n: int) -> list[str]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        s, v, w = (rng.choice(x) for x in (_SUBJECTS, _VERBS, _WHEN))
        out.append(f"Speaker {i % 2}: I {v} {s} {w}, and it reminded me of {rng.choice(_SUBJECTS)} ({i}).")
    return out


def _generated_questions(n: int) -> list[str]:
    rng = np.random.default_rng(8)
    return [f"When did they {rng.choice(_VERBS)} {rng.choice(_SUBJECTS)}? ({i})" for i in range(n)]


def long_texts(turns: list[str], n: int, chars: int = 2000) -> list[str]:
    """Up to `n` texts of `chars` characters, each consecutive turns joined (real prose, no repeats)."""
    out, i = [], 0
    while len(out) < n and i < len(turns):
        parts: list[str] = []
        while sum(map(len, parts)) + max(len(parts) - 1, 0) <= chars and i < len(turns):  # joined length
            parts.append(turns[i])
            i += 1
        joined = " ".join(parts)
        text = joined[:chars]
        if text[-1:].isspace() and len(joined) > chars:  # a published text is stripped: end on a character
            text = text[:-1] + joined[chars]
        out.append(text)
    return out


async def cached_vectors(
    embedder: Any, texts: list[str], *, cache_dir: Path = CACHE_DIR
) -> tuple[np.ndarray, dict]:
    """The unit vectors (float32[len(texts), dim]) of `texts` by `embedder` (loaded), from the cache or
    embedded now and stored; with {"cached": bool, "seconds": embedding time or 0, "path": str}."""
    backend = getattr(embedder, "runs_on", "")
    digest = hashlib.blake2b("\n".join(texts).encode(), digest_size=8).hexdigest()
    path = cache_dir / f"{embedder.name}-{backend or 'na'}-{len(texts)}-{digest}.npy"
    if path.exists():
        vectors = np.load(path)
        if vectors.shape[0] == len(texts):
            return vectors.astype(np.float32), {"cached": True, "seconds": 0.0, "path": str(path)}
    from tqdm import tqdm

    started = time.perf_counter()
    parts = []
    with tqdm(
        total=len(texts), desc="embed corpus (cached after)", unit="text", leave=False, disable=None
    ) as bar:
        for start in range(0, len(texts), 256):  # 256 a call: sorted by length within it (less padding)
            parts.append(await embedder.embed(texts[start : start + 256]))
            bar.update(len(parts[-1]))
    seconds = time.perf_counter() - started
    vectors = np.concatenate(parts).astype(np.float32)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vectors)
    tmp.replace(path)  # atomic: a concurrent or interrupted run never reads half a file
    return vectors, {"cached": False, "seconds": seconds, "path": str(path)}


def derive(base: np.ndarray, n: int, *, noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` unit vectors (float32[n, dim]) derived from the real ones in `base` (float32[m, dim]): row i is
    base[i % m] + Gaussian noise of expected norm `noise`, renormalised (rows i < m are the real vectors
    unchanged). Returns (vectors, base index of each row).

    Expected cosine of a derived row to its base: 1 / sqrt(1 + noise²) (0.96 for noise 0.3), and two
    copies of one base ~1 / (1 + noise²) (0.92): a base's copies are close to it but not duplicates,
    which HNSW would collapse. Generated in chunks so 100k × 768 needs no float64 temporary.
    """
    m, dim = base.shape
    rng = np.random.default_rng(seed)
    which = np.arange(n) % m
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 10_000):
        idx = which[start : start + 10_000]
        v = base[idx] + (noise / math.sqrt(dim)) * rng.standard_normal((len(idx), dim), dtype=np.float32)
        real = np.arange(start, start + len(idx)) < m
        v[real] = base[idx[real]]
        out[start : start + len(idx)] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out, which


def derived_text(texts: list[str], i: int) -> str:
    """The text of derived document i: its base turn, and for copies (i ≥ len(texts)) a distinct tail, so
    no two documents share a text (BM25 and the episode ids see 100k different episodes)."""
    m = len(texts)
    return texts[i % m] if i < m else f"{texts[i % m]} (retold {i // m}, note {i})"
