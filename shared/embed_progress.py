"""Progress of `shared.embedding_base.Embedder.embed`, for whoever waits on a long call: a per-task
callback (a context variable) every forward pass calls, whatever embedder runs it. Also `held`: a file
lock that says so when another process holds it (a model unpacked or exported once for all).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator

log = logging.getLogger("engram.embedding")


@contextlib.contextmanager
def held(path: str, waiting: str, *, timeout: float = -1) -> Iterator[None]:
    """Hold the file lock at `path` (`filelock.FileLock`) within the block; when another process holds
    it, log `waiting` (INFO) first, then wait up to `timeout` seconds (-1: for ever; filelock.Timeout
    past it), so that a long wait does not look like a hang."""
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


_PROGRESS: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "engram_embed_progress", default=None
)


def report_passes(callback: Callable[[], None]) -> None:
    """From now on in the calling task (and the tasks it starts), `callback()` runs after each forward
    pass of `Embedder.embed` (every `batch_size` texts): a consolidator lane embedding a large batch
    counts as turning for its health check while passes complete, and as stuck once they stop."""
    _PROGRESS.set(callback)


def passed() -> None:
    """One forward pass done: the callback of `report_passes`, if any, runs."""
    if (callback := _PROGRESS.get()) is not None:
        callback()
