"""Progress of `shared.embedding_base.Embedder.embed`, for whoever waits on a long call.

A context variable, so it is per task: a consolidator lane (`services.consolidator.worker`) sets a
callback around its turn, and every forward pass of the embeds that turn makes calls it, whatever
embedder runs them. Its own module: `shared.embedding` stays within its line budget.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_PROGRESS: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "engram_embed_progress", default=None
)


@contextlib.contextmanager
def reporting_progress(callback: Callable[[], None]) -> Iterator[None]:
    """Within the block (this task, and the tasks it starts), `callback()` runs after each forward pass
    of `Embedder.embed` (every `batch_size` texts): a consolidator lane embedding a large batch counts
    as turning for its health check while passes complete, and as stuck once they stop."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def passed() -> None:
    """One forward pass done: the callback of `reporting_progress`, if any, runs."""
    if (callback := _PROGRESS.get()) is not None:
        callback()
