"""Optional rewrite of a fact's deterministic text through any OpenAI-compatible chat endpoint
(`ENGRAM_SUMMARIZER_URL`, e.g. `http://127.0.0.1:11434/v1` for Ollama).

It sees the fact's statistics text and the tasks of its most central episodes; the answer is clipped
to `Settings.summarizer_max_chars`. Any failure keeps the deterministic text (the consolidator marks
the fact `summary="fallback"` and retries it next run), is logged and counted in
`engram_summarizer_failures_total{reason}` (`http`, `timeout`, `connection`, `malformed`, `empty`).
"""

from __future__ import annotations

import json
import logging

import aiohttp
from prometheus_client import Counter

from shared.settings import Settings

log = logging.getLogger("engram.facts")

SYSTEM_PROMPT = (
    "You rewrite statistics about an AI agent's past task attempts into one short, factual piece "
    "of advice for the agent. Keep every number. Do not invent anything. Answer with the "
    "advice only, at most three sentences."
)


def _endpoint(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return f"{url}/chat/completions" if url.endswith("/v1") else f"{url}/v1/chat/completions"


class Summarizer:
    """`await summarize(text, examples)` → the rewritten text (≤ max_chars) or None to keep `text`."""

    def __init__(
        self,
        url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout: float = 20.0,
        max_chars: int = 600,
        failures_metric: Counter | None = None,
    ):
        """`failures_metric`: a Prometheus Counter with a `reason` label, incremented per failure."""
        self.url = _endpoint(url)
        self.failures_metric = failures_metric
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_chars = max_chars
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, *, failures_metric: Counter | None = None
    ) -> Summarizer | None:
        if not settings.summarizer_url:
            return None
        return cls(
            settings.summarizer_url,
            model=settings.summarizer_model,
            api_key=settings.summarizer_api_key,
            timeout=settings.summarizer_timeout,
            max_chars=settings.summarizer_max_chars,
            failures_metric=failures_metric,
        )

    async def summarize(self, text: str, examples: list[str]) -> str | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        user = text + (
            "\nExample tasks:\n" + "\n".join(f"- {e[:200]}" for e in examples[:3]) if examples else ""
        )
        body = {
            "model": self.model,
            "temperature": 0,
            "max_tokens": max(16, self.max_chars // 3),
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}],
        }
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        reason = "connection"
        try:
            async with self._session.post(self.url, json=body, headers=headers) as resp:
                if resp.status // 100 != 2:
                    reason = "http"
                    raise ValueError(f"HTTP {resp.status}")
                # read at most a bounded body: a chat answer is small
                raw = await resp.content.read(64 * 1024)
                reason = "malformed"
                data = json.loads(raw)
                answer = data["choices"][0]["message"]["content"]
            if not isinstance(answer, str) or not answer.strip():
                reason = "malformed" if not isinstance(answer, str) else "empty"
                raise ValueError("empty answer")
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
            if isinstance(exc, TimeoutError):
                reason = "timeout"
            if self.failures_metric is not None:
                self.failures_metric.labels(reason).inc()
            log.warning(
                "summariser ◆ kept the deterministic text ◆ %s ◆ %s: %s",
                reason,
                type(exc).__name__,
                str(exc)[:200],
            )
            return None
        answer = " ".join(answer.split())
        return answer if len(answer) <= self.max_chars else answer[: self.max_chars - 1].rstrip() + "…"

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
