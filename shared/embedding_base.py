"""The contract every embedder keeps (`Embedder`) and its errors: a leaf the implementations import, so
the factory in `shared.embedding` can import them all. Also the progress of `Embedder.embed` for
whoever waits on a long call: a per-task callback (a context variable) every forward pass calls."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from engram_episodic.errors import EngramError

log = logging.getLogger("engram.embedding")

_PROGRESS: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "engram_embed_progress", default=None
)


def report_passes(callback: Callable[[], None]) -> None:
    """From now on in the calling task (and the tasks it starts), `callback()` runs after each forward
    pass of `Embedder.embed` (every `batch_size` texts): a consolidator lane embedding a large batch
    counts as turning for its health check while passes complete, and as stuck once they stop."""
    _PROGRESS.set(callback)


class EmbeddingError(EngramError):
    """The embedder could not produce vectors: a server error after retries, a timeout, a malformed
    response, or vectors of an unexpected dimension. The texts were not embedded; the caller may retry."""


class EmbedderUnavailable(EmbeddingError):
    """The embedder's backend did not answer after its retries (a provider's 5xx, 429 or 408, a timeout,
    a refused or dropped connection): nothing is wrong with the texts, the same call may succeed later."""


class Embedder(ABC):
    """Base class of every embedder: validation, truncation, batching and normalisation live here;
    subclasses implement `_embed_batch` for one batch of prepared texts. `name` identifies the vector
    space (the index records it with `dim` and refuses to mix two: `Conflict`), `dim` is the vector
    length, `max_chars` the input cut-off in characters (a longer text is embedded from its first
    `max_chars` and counted in `truncations`), `batch_size` the texts per model call or request.
    `aclose()` releases sessions and models."""

    name: str
    max_chars: int
    batch_size: int
    truncations: int
    cheap: bool = False
    """True when embedding a text costs less than asking Redis whether it is already embedded (the
    consolidator then skips that check on its fast path); models leave it False."""

    def __init__(self, *, name: str, dim: int | None, max_chars: int, batch_size: int):
        self.name = name
        self._dim = dim
        self.max_chars = max_chars
        self.batch_size = batch_size
        self.truncations = 0

    @property
    def dim(self) -> int:
        """Length of every vector this embedder returns."""
        if self._dim is None:
            raise EmbeddingError(
                f"{self.name}: the dimension is unknown until the first response; "
                f"pass dim= or `await embedder.ensure_dim()` first"
            )
        return self._dim

    async def ensure_dim(self) -> int:
        """The vector length, learning it first if needed (only OpenAIEmbedder without `dim=` must)."""
        return self.dim

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed `texts` → float32[len(texts), dim], each row L2-normalised.

        Raises TypeError for a bare str or a non-str item, ValueError naming the index of an empty or
        whitespace-only text, EmbeddingError when the backend fails.
        """
        prepared, cut = self._prepare(texts)
        if not (n := len(prepared)):
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        # Batch texts of similar length together: a model pads each batch to its longest text. Rows go
        # back to input order below.
        order = sorted(range(n), key=lambda i: len(prepared[i])) if n > self.batch_size else range(n)
        out: np.ndarray | None = None
        for start in range(0, n, self.batch_size):
            if start:
                await asyncio.sleep(0)  # let other tasks run between batches
            rows = order[start : start + self.batch_size]
            vectors, window_cut = await self._embed_batch([prepared[i] for i in rows])
            unit = self._unit_rows(vectors, rows)
            if out is None:
                out = np.empty((n, unit.shape[1]), dtype=np.float32)
            out[list(rows)] = unit
            for i, model_cut in zip(rows, window_cut, strict=True):
                cut[i] = cut[i] or bool(model_cut)
            if (progress := _PROGRESS.get()) is not None:
                progress()
        self.truncations += sum(cut)  # counted once the whole call succeeded: a retried call counts once
        return cast(np.ndarray, out)  # set by the first batch (n > 0)

    @abstractmethod
    async def _embed_batch(self, texts: list[str]) -> tuple[np.ndarray, Sequence[bool]]:
        """Vectors for at most `batch_size` prepared texts (float[len(texts), dim], any norm), and for
        each text whether the model cut it to its own input window (counted as a truncation)."""

    @property
    def loaded(self) -> bool:
        """Whether `embed` can answer without loading anything first (a model embedder: once `load`ed)."""
        return True

    async def load(self) -> None:
        """Load what `embed` needs (a model) ahead of the first call. Idempotent; nothing by default."""
        return None

    async def aclose(self) -> None:
        """Release what the embedder holds (HTTP session, model). Idempotent; nothing by default."""
        return None

    def _prepare(self, texts: Sequence[str]) -> tuple[list[str], list[bool]]:
        """Strip, validate and cut each text to `max_chars`; also returns which texts were cut."""
        if isinstance(texts, str | bytes):
            raise TypeError("embed() takes a sequence of texts, not a single string; use embed_query()")
        prepared: list[str] = []
        cut: list[bool] = []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] is {type(text).__name__}, not str")
            text = text.strip()
            if not text:
                raise ValueError(f"texts[{i}] is empty or only whitespace; there is nothing to embed")
            if len(text) > self.max_chars:
                text = text[: self.max_chars]
                cut.append(True)
            else:
                cut.append(False)
            prepared.append(text)
        return prepared, cut

    def _unit_rows(self, vectors: Any, rows: Sequence[int]) -> np.ndarray:
        """The batch for texts[rows] (float[len(rows), dim]: `_embed_batch` checks what a server sends; a
        model's shape is its own) L2-normalised → float32[n, dim]; EmbeddingError for a zero or
        non-finite row."""
        array = np.asarray(vectors, dtype=np.float32)
        norms = np.linalg.norm(array, axis=1, keepdims=True)
        bad = np.flatnonzero(~np.isfinite(norms[:, 0]) | (norms[:, 0] == 0))
        if bad.size:
            raise EmbeddingError(
                f"{self.name}: the vector for texts[{rows[int(bad[0])]}] is zero or "
                f"not finite and cannot be normalised"
            )
        return array / norms

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, dim={self._dim}, max_chars={self.max_chars})"


async def dim_when_answering(embedder: Embedder, what: str, *, ceiling: float = 30.0) -> int:
    """`embedder.ensure_dim()` (int, the vector length), asked again while the backend does not answer
    (EmbedderUnavailable): a provider that is down when a service starts delays its readiness instead of
    stopping it, since a process that exits at start is restarted until `make run` gives up. Waits 1, 2,
    4 … `ceiling` seconds between tries, logging one line for each. Other errors propagate."""
    delay = 1.0
    while True:
        try:
            return await embedder.ensure_dim()
        except EmbedderUnavailable as exc:
            log.warning("%s ◆ the embedder does not answer (%s); asking again in %.0f s", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(ceiling, delay * 2)
