"""`ENGRAM_EMBEDDER=openai`: any server that speaks OpenAI's `POST /v1/embeddings` (OpenAI, vLLM, TEI,
Ollama, a local sentence-transformers server), with retries after 429/5xx (Retry-After honoured) on
redis-py's jittered backoff policy (`shared.retry.Backoff`)."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp
import numpy as np
from redis.backoff import EqualJitterBackoff

from shared.embedding_base import Embedder, EmbedderUnavailable, EmbeddingError
from shared.retry import Backoff

log = logging.getLogger("engram.embedding")


def _embeddings_endpoint(url: str) -> str:
    """`http://host:port`, `.../` or `.../v1` → `.../v1/embeddings`. Raises ValueError for a non-HTTP URL."""
    base = url.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", base):
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    if base.endswith("/v1/embeddings"):
        return base
    if base.endswith("/v1"):
        return base + "/embeddings"
    return base + "/v1/embeddings"


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """Parse a Retry-After header (delay seconds or an HTTP date) → seconds ≥ 0, or None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        current = datetime.now(UTC).timestamp() if now is None else now
        seconds = when.timestamp() - current
    return max(0.0, seconds) if math.isfinite(seconds) else None


class _Retryable(Exception):
    """One attempt failed in a way worth retrying (429, 5xx, connection error, timeout)."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class OpenAIEmbedder(Embedder):
    """Embeddings from a server speaking OpenAI's API: `POST {url}/v1/embeddings` with
    `{"model": model, "input": [texts]}`, answered by `{"data": [{"index": i, "embedding": [...]}]}`.
    `url` may end with or without `/v1`; `api_key` (optional) is sent as a bearer token and never
    appears in errors or repr. One aiohttp session, opened on first use: use it from one event loop.

    A batch is one request of at most `timeout` seconds. A 429, 408, 5xx, connection error or timeout
    is retried up to `retries` times after `backoff * 2**attempt` seconds (capped at `max_backoff`,
    jittered) or the server's Retry-After (capped at `max_retry_after`); other statuses fail at once.
    Rows are put in input order by `index` and L2-normalised. `dim`, when given, is what the vectors
    must measure (not sent to the server); otherwise the first response sets it. Shapes: float32[n, dim].
    Raises EmbedderUnavailable when the retries are spent, EmbeddingError on another status, a bad
    response or dimension, ValueError for empty texts.
    """

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        *,
        dim: int | None = None,
        timeout: float = 30.0,
        batch_size: int = 64,
        retries: int = 3,
        max_chars: int = 2000,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = 60.0,
    ):
        super().__init__(name=f"openai/{model}", dim=dim, max_chars=max_chars, batch_size=batch_size)
        if not model:
            raise ValueError("model must be non-empty")
        self.endpoint = _embeddings_endpoint(url)
        self.model = model
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self._api_key = api_key
        self._session: aiohttp.ClientSession | None = None  # created inside the running loop, on first use

    async def ensure_dim(self) -> int:
        """The vector length; without `dim=` this embeds one probe text to learn it."""
        if self._dim is None:
            await self.embed(["dimension probe"])
        return self.dim

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Content-Type": "application/json"}
            if self._api_key:
                headers["Authorization"] = f"Bearer {self._api_key}"
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout)
            )
        return self._session

    async def _embed_batch(self, texts: list[str]) -> tuple[np.ndarray, Sequence[bool]]:
        payload = {"model": self.model, "input": texts}
        attempt = 0
        # jittered doubling from `backoff` up to `max_backoff` (redis-py's policy counts from 1)
        jitter = Backoff(EqualJitterBackoff(cap=self.max_backoff, base=self.backoff / 2))
        while True:
            try:
                body = await self._post(payload)
                break
            except _Retryable as exc:
                if attempt >= self.retries:
                    raise EmbedderUnavailable(
                        f"{self.name}: {exc} (gave up after {attempt + 1} attempts to {self.endpoint})"
                    ) from None
                if exc.retry_after is not None:
                    delay = min(exc.retry_after, self.max_retry_after)
                else:
                    delay = jitter.next()
                log.warning(
                    "embedding retry ◆ %s ◆ attempt %d/%d ◆ waiting %.2fs",
                    exc,
                    attempt + 1,
                    self.retries + 1,
                    delay,
                )
                attempt += 1
                await asyncio.sleep(delay)
        return self._vectors(body, len(texts)), (False,) * len(texts)

    async def _post(self, payload: dict[str, Any]) -> Any:
        try:
            async with self._client().post(self.endpoint, json=payload) as response:
                if response.status == 429 or response.status == 408 or response.status >= 500:
                    raise _Retryable(
                        f"HTTP {response.status}", retry_after_seconds(response.headers.get("Retry-After"))
                    )
                if response.status != 200:
                    detail = _error_detail(await response.text(errors="replace"))
                    raise EmbeddingError(
                        f"{self.name}: HTTP {response.status} from {self.endpoint}: {detail}"
                    )
                try:
                    return await response.json(content_type=None)
                except ValueError as exc:
                    raise EmbeddingError(f"{self.name}: the response is not JSON ({exc})") from None
        except TimeoutError:
            raise _Retryable(f"no response within {self.timeout:g}s") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise _Retryable(f"connection error: {exc or type(exc).__name__}") from None
        except aiohttp.ClientError as exc:
            raise EmbeddingError(f"{self.name}: request to {self.endpoint} failed: {exc}") from None

    def _vectors(self, body: Any, n: int) -> np.ndarray:
        """The response's vectors in input order → float32[n, dim]; learns or checks the dimension."""
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != n:
            got = len(data) if isinstance(data, list) else "no"
            raise EmbeddingError(f"{self.name}: expected {n} embeddings in `data`, got {got}")
        try:
            ordered = sorted(data, key=lambda item: int(item["index"]))
            if [int(item["index"]) for item in ordered] != list(range(n)):
                raise EmbeddingError(f"{self.name}: `data[].index` must be 0..{n - 1} once each")
            rows = [np.asarray(item["embedding"], dtype=np.float32) for item in ordered]
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"{self.name}: malformed `data` item ({type(exc).__name__}: {exc})"
            ) from None
        sizes = {row.shape for row in rows}
        if len(sizes) != 1 or len(next(iter(sizes))) != 1 or next(iter(sizes))[0] == 0:
            raise EmbeddingError(
                f"{self.name}: expected one non-empty list of numbers per embedding, got "
                f"shapes {sorted(sizes)}"
            )
        size = rows[0].shape[0]
        if self._dim is None:
            self._dim = size
        elif size != self._dim:
            raise EmbeddingError(
                f"{self.name}: the server returned vectors of dimension {size}, expected "
                f"{self._dim}; a model change needs a new index (`engram-admin reindex`)"
            )
        return np.stack(rows)

    async def aclose(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def __repr__(self) -> str:
        return f"OpenAIEmbedder(endpoint={self.endpoint!r}, model={self.model!r}, dim={self._dim})"


def _error_detail(text: str) -> str:
    """The `error.message` of an OpenAI-style error body, else the body's start (≤ 300 characters)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
        message = json.loads(text)["error"]["message"]
        if isinstance(message, str):
            return message[:300]
    return text.strip()[:300] or "(empty body)"
