"""The keyword arguments of the clients' calls (`Engram`, `AsyncEngram`), as TypedDicts.

One per route that takes options (docs/api.md names each field); instants are ISO 8601 strings with an
offset, epoch seconds or aware datetimes, durations seconds, strings such as "12h" or timedeltas.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal, TypedDict

Instant = str | float | int | datetime
Duration = str | float | int | timedelta


class Scope(TypedDict, total=False):
    """Scope keys every read accepts; the namespace comes from the API key, never from here."""

    agent_id: str
    user_id: str
    session_id: str


class NumRange(TypedDict, total=False):
    gte: float
    lte: float


class Weights(TypedDict, total=False):
    similarity: float
    recency: float
    reward: float
    outcome: float
    importance: float


class RecallOptions(Scope, total=False):
    """`POST /v1/recall` options (docs/api.md, "POST /v1/recall")."""

    top_k: int
    category: str | list[str]
    outcome: str | list[str]
    strategy: str | list[str]
    reward: NumRange
    importance: NumRange
    since: Instant
    until: Instant
    mode: Literal["vector", "keyword", "hybrid"]
    weights: Weights
    preset: Literal["auto", "early", "normal", "late"]
    half_life: Duration
    as_of: Instant
    normalize: Literal["none", "minmax"]
    recency_from: Literal["completed", "last_access"]
    touch: bool
    candidates: int
    min_relevance: float
    min_priority: float


class ContextOptions(Scope, total=False):
    category: str
    top_k: int
    max_chars: int
    half_life: Duration
    min_relevance: float
    min_priority: float


class StrategyOptions(Scope, total=False):
    category: str
    complexity: float
    k: int
    min_similarity: float


class SuggestOptions(Scope, total=False):
    category: str
    k: int
    min_similarity: float


class SkillsOptions(Scope, total=False):
    threshold: float


class CurveOptions(Scope, total=False):
    category: str
    window: int
    limit: int


class FactSearchOptions(TypedDict, total=False):
    agent_id: str
    user_id: str
    category: str | list[str]
    kind: str | list[str]
    level: Literal["namespace", "agent_category"]
    since: Instant
    until: Instant
    as_of: Instant
    top_k: int
    include_superseded: bool
    min_confidence: float
    min_similarity: float


class PageOptions(TypedDict, total=False):
    """Paging of the listing calls: `order` "desc" (newest first, default) or "asc"; `limit` 1..1000
    per page; `cursor` the `next_cursor` of the previous page (same filters and order)."""

    order: Literal["desc", "asc"]
    limit: int
    cursor: str


class EpisodeListOptions(Scope, PageOptions, total=False):
    """`GET /v1/episodes` filters (docs/api.md): one value each."""

    category: str
    outcome: str
    since: Instant
    until: Instant


class FactListOptions(PageOptions, total=False):
    """`GET /v1/facts` filters (facts are not kept per session)."""

    agent_id: str
    user_id: str
    category: str
    kind: str
    episode_id: str
    """The facts this episode is evidence for."""
    since: Instant
    until: Instant
    include_superseded: bool


class EpisodeChanges(TypedDict, total=False):
    """`PATCH /v1/episodes/{id}` (docs/api.md): `feedback` merges field by field into the episode's
    (`{"reward": 0.9}` keeps its message), `metadata` key by key (None removes a key), the rest replace; `expires_at=None` (or `ttl=None`)
    clears the expiry: the episode no longer expires."""

    feedback: dict[str, Any]
    outcome: Literal["success", "partial", "failure", "abandoned"]
    outcome_details: str
    importance: float
    metadata: dict[str, Any]
    expires_at: Instant | None
    ttl: Duration | None
