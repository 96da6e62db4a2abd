"""Query embeddings in the query service: a per-namespace LRU cache, and forward passes shared by
concurrent queries. The embedders themselves live in `shared.embedding`."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import numpy as np

from shared.embedding import Embedder, EmbedderUnavailable


class QueryBatcher:
    """Concurrent query embeddings share forward passes (a model embeds a batch much faster than its
    texts one by one): while one pass runs, the texts that arrive wait, and the next pass embeds all of
    them (up to `max_batch`, duplicates once). A lone request starts its pass at once.

    A text's error is answered to its own request only (a failed pass is retried text by text), except
    `EmbedderUnavailable`, which fails every text of the pass at once (alone, each would wait out the
    provider's timeouts again). A text is shared only within one `scope` (the namespace): across
    tenants, sharing would let one time another's identical query. One per embedder; one event loop.
    """

    def __init__(self, embedder: Embedder, max_batch: int = 32):
        self.embedder, self.max_batch = embedder, max_batch
        self._waiting: dict[tuple[str, str], list[asyncio.Future[np.ndarray]]] = {}
        self._running = False

    async def embed(self, text: str, *, scope: str = "") -> np.ndarray:
        """float32[dim] of `text` (unit norm). Raises like `Embedder.embed`."""
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault((scope, text), []).append(future)
        if not self._running:
            self._running = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch = list(self._waiting)[: self.max_batch]
                futures = [self._waiting.pop(t) for t in batch]
                try:
                    vectors = list(await self.embedder.embed([text for _, text in batch]))
                except EmbedderUnavailable as exc:  # the backend, not a text: each alone would wait again
                    for waiting in futures:
                        _answer(waiting, exc)
                    continue
                except Exception as exc:  # noqa: BLE001 - one text's fault must not fail the others
                    if len(batch) == 1:
                        _answer(futures[0], exc)
                        continue
                    vectors = [await self._alone(text) for _, text in batch]
                for row, waiting in zip(vectors, futures, strict=True):
                    _answer(waiting, row)
        finally:
            self._running = False

    async def _alone(self, text: str) -> np.ndarray | Exception:
        try:
            return (await self.embedder.embed([text]))[0]
        except Exception as exc:  # noqa: BLE001 - answered to its own request
            return exc


def _answer(waiting: list[asyncio.Future[np.ndarray]], outcome: np.ndarray | Exception) -> None:
    for f in waiting:
        if f.done():  # a cancelled request (client gone) has nobody to answer
            continue
        if isinstance(outcome, Exception):
            f.set_exception(outcome)
        else:
            f.set_result(outcome)


class QueryVectorCache:
    """The embeddings of the last `size` distinct (namespace, query text) pairs, least recently used
    evicted first (agents repeat queries; on CPU embedding one costs more than the rest of a recall);
    misses go through the embedder's `QueryBatcher` (`batch` texts per pass at most). Vectors are returned read-only. `size` 0 disables it. Entries are per namespace: shared
    across tenants, a hit's speed would tell one tenant what another recently asked. One per service.
    """

    def __init__(self, size: int = 4096, *, batch: int = 32):
        self.size = size
        self.batch = batch
        self._vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._batcher: QueryBatcher | None = None

    async def embed(self, embedder: Embedder, text: str, *, namespace: str) -> np.ndarray:
        """float32[dim] of `text` from `namespace`'s entries, else embedded (raises like `Embedder.embed`)."""
        key = (namespace, text)
        hit = self._vectors.get(key)
        if hit is not None:
            self._vectors.move_to_end(key)
            return hit
        if self._batcher is None or self._batcher.embedder is not embedder:
            self._batcher = QueryBatcher(embedder, self.batch)
        # a copy: the rows of one pass share memory
        vector = np.array(await self._batcher.embed(text, scope=namespace))
        if self.size > 0:
            vector.setflags(write=False)
            self._vectors[key] = vector
            if len(self._vectors) > self.size:
                self._vectors.popitem(last=False)
        return vector
