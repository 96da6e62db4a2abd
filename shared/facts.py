"""Semantic memory: the fact model, the facts index schema and its queries (the one owner of both).

A *fact* condenses a cluster of similar completed episodes of one *scope* (a namespace, or one agent's
category in it): support, success rate, average reward, strategies, common failures, action types,
evidence ids and time span, centroid, confidence, version, and the fact it `supersedes`. Built by
`services.consolidator.facts`; carried in `FactsConsolidated` events as plain dicts (`Fact.to_data` /
`from_data`), each the full state of one scope. Documents are HASHes under `Keys.fact_doc_prefix(gen)`,
searched through `Keys.facts_index_alias`; a fact is valid from `created_at` until `superseded_at`
(`OPEN_END` while current), which `as_of` queries filter on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.typing import EncodableT

from engram_episodic.errors import InvalidEpisode
from engram_episodic.events import Episode
from shared.cluster import search_targets, unless_missing
from shared.index import (
    TAG_SEPARATOR,
    SearchHit,
    create_index,
    current_generation,
    index_size,
    numeric_clause,
    numeric_text,
    parse_search,
    point_alias_at,
    search_limit,
    tag_clause,
    vector_bytes,
)
from shared.keys import Keys, digest
from shared.tags import TagCodec

KINDS = ("strategy", "failure_pattern", "best_practice", "preference")
STATUS_CURRENT, STATUS_SUPERSEDED = "current", "superseded"
SUMMARY_LLM, SUMMARY_FALLBACK = "llm", "fallback"
SUMMARIES = (None, SUMMARY_LLM, SUMMARY_FALLBACK)
LEVEL_NAMESPACE, LEVEL_AGENT_CATEGORY = "namespace", "agent_category"
OPEN_END = 253402300799.0  # 9999-12-31T23:59:59Z: "not superseded" (a missing NUMERIC never matches)
MAX_TEXT_CHARS = 1000

FACT_TAGS = (
    "namespace",
    "fact_id",
    "scope_id",
    "level",
    "kind",
    "status",
    "supersedes",
    "superseded_by",
    "evidence",
    "agents",
    "users",
    "categories",
)
FACT_NUMERICS = (
    "support",
    "success_rate",
    "avg_reward",
    "confidence",
    "first_at",
    "last_at",
    "created_at",
    "updated_at",
    "superseded_at",
    "version",
)
CENTROID_FIELD = "centroid"
DOC_FIELD = "doc"


# --- scopes ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FactScope:
    """Where facts are consolidated: a whole namespace, or one (agent_id, category) inside it."""

    namespace: str
    agent_id: str | None = None
    category: str | None = None

    @property
    def level(self) -> str:
        return LEVEL_NAMESPACE if self.agent_id is None else LEVEL_AGENT_CATEGORY

    @property
    def scope_id(self) -> str:
        if self.agent_id is None:
            return digest("facts", self.namespace)
        return digest("facts", self.namespace, self.agent_id, self.category or "")

    def to_data(self) -> dict[str, str]:
        out = {"namespace": self.namespace, "scope_id": self.scope_id, "level": self.level}
        if self.agent_id is not None:
            out["agent_id"] = self.agent_id
            out["category"] = self.category or ""
        return out

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> FactScope:
        if not isinstance(data.get("namespace"), str):
            raise InvalidEpisode([("scope.namespace", "is required")])
        agent = data.get("agent_id")
        return cls(
            namespace=data["namespace"],
            agent_id=agent if isinstance(agent, str) else None,
            category=(data.get("category") or None) if agent is not None else None,
        )


# --- what facts are built from --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Row:
    """One completed episode of a scope with its unit vector (`vector`: the stored one, which centroids
    are made of); `cluster_vector`, when set, is what clustering compares instead (the embedding of
    the episode's text without the text its scope shares: `services.consolidator.facts_plan`)."""

    episode: Episode
    vector: np.ndarray
    cluster_vector: np.ndarray | None = None

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id

    @property
    def completed_at(self) -> float:
        return self.episode.completed_at if self.episode.completed_at is not None else 0.0


def by_completion(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.completed_at, r.episode_id))


def centroid_of(matrix: np.ndarray) -> np.ndarray:
    """The unit mean of the evidence's unit vectors (`matrix`: [n, dim]), float32[dim]."""
    centroid = matrix.mean(axis=0)
    return (centroid / max(float(np.linalg.norm(centroid)), 1e-12)).astype(np.float32)


# --- the fact -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Fact:
    """One consolidated fact. Times are UTC epoch seconds; rates in [0, 1]; `centroid` is unit float32."""

    fact_id: str
    namespace: str
    scope_id: str
    level: str
    agent_id: str | None = None
    category: str | None = None
    kind: str
    text: str
    base_text: str
    """The deterministic text (`text` is it, or the optional summariser's rewrite of it)."""
    support: int
    successes: int
    success_rate: float
    avg_reward: float | None = None
    top_strategies: tuple[dict[str, Any], ...] = ()
    """[{strategy, episodes, successes, success_rate}], most used first."""
    common_failures: tuple[dict[str, Any], ...] = ()
    """[{message, count}], most frequent first."""
    action_types: tuple[dict[str, Any], ...] = ()
    """[{action_type, count, failed}], most frequent first."""
    evidence: tuple[str, ...] = ()
    central: tuple[str, ...] = ()
    """The evidence episodes nearest the centroid (the text quotes their tasks)."""
    agents: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    first_at: float
    last_at: float
    evidence_since: float | None = None
    """A superseding fact only counts evidence completed at or after this instant (its regime)."""
    centroid: tuple[float, ...] = ()
    confidence: float
    version: int = 1
    created_at: float
    updated_at: float
    supersedes: str | None = None
    superseded_by: str | None = None
    superseded_at: float | None = None
    status: str = STATUS_CURRENT
    summary: str | None = None
    """How `text` was written: None (no summariser), "llm" (its rewrite) or "fallback" (it failed: the
    deterministic text until a retry succeeds)."""

    def centroid_bytes(self) -> bytes:
        return vector_bytes(self.centroid) if self.centroid else b""

    # stored / event form ------------------------------------------------------------------------
    def to_data(self) -> dict[str, Any]:
        """Plain data for the event (msgpack) and the document: the centroid as float32 bytes."""
        data = asdict(self)
        data["centroid"] = self.centroid_bytes()
        for name in (*_STAT_ROWS, *_ID_LISTS):
            data[name] = [dict(x) if isinstance(x, Mapping) else x for x in data[name]]
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Fact:
        """Rebuild a fact from `to_data` output; InvalidEpisode naming the field when malformed."""
        try:
            raw = dict(data)
            centroid = raw.pop("centroid", b"")
            if isinstance(centroid, bytes | bytearray):
                vec = tuple(float(x) for x in np.frombuffer(bytes(centroid), dtype=np.float32))
            else:
                vec = tuple(float(x) for x in centroid or ())
            for name in _STAT_ROWS:
                raw[name] = tuple(_frozen_row(x) for x in raw.get(name, ()))
            for name in _ID_LISTS:
                raw[name] = tuple(str(x) for x in raw.get(name, ()))
            known = set(cls.__dataclass_fields__)
            fact = cls(centroid=vec, **{k: v for k, v in raw.items() if k in known})
        except (TypeError, ValueError) as exc:
            raise InvalidEpisode([("facts", f"malformed fact: {exc}")]) from None
        if (
            fact.kind not in KINDS
            or fact.status not in (STATUS_CURRENT, STATUS_SUPERSEDED)
            or fact.summary not in SUMMARIES
        ):
            raise InvalidEpisode(
                [("facts", f"fact {fact.fact_id[:40]!r} has an unknown kind, status or summary")]
            )
        return fact

    def to_json(self) -> dict[str, Any]:
        """The HTTP response form: no centroid, ISO 8601 `Z` times."""
        from engram_episodic.timeutil import format_instant

        data = self.to_data()
        data.pop("centroid", None)
        data.pop("base_text", None)
        for name in _TIMES:
            if name in data:
                data[name] = format_instant(data[name])
        return data


_TIMES = ("first_at", "last_at", "evidence_since", "created_at", "updated_at", "superseded_at")
_STAT_ROWS = ("top_strategies", "common_failures", "action_types")
_ID_LISTS = ("evidence", "central", "agents", "users", "categories")


def _frozen_row(row: Any) -> dict[str, Any]:
    if not isinstance(row, Mapping):
        raise ValueError("statistics rows must be maps")
    return dict(row)


def superseded(fact: Fact, by: str | None, at: float | None) -> Fact:
    return replace(fact, status=STATUS_SUPERSEDED, superseded_by=by, superseded_at=at)


# --- the index ------------------------------------------------------------------------------------
FACTS_BLOCK_SIZE = 64
"""Vectors per allocation of the facts index (default 1,024: 1.5 MB at 384 dims for tens of facts, per
namespace on a shard-local cluster)."""


def facts_schema(dim: int) -> list[Any]:
    args: list[Any] = []
    for name in FACT_TAGS:
        args += [name, "TAG", "SEPARATOR", TAG_SEPARATOR, "CASESENSITIVE"]
    for name in FACT_NUMERICS:
        args += [name, "NUMERIC", "SORTABLE"]
    args += ["text", "TEXT"]
    return args + [
        CENTROID_FIELD,
        "VECTOR",
        "FLAT",
        8,
        "TYPE",
        "FLOAT32",
        "DIM",
        dim,
        "DISTANCE_METRIC",
        "COSINE",
        "BLOCK_SIZE",
        FACTS_BLOCK_SIZE,
    ]


async def ensure_facts_index(
    r: aioredis.Redis, keys: Keys, gen: int, dim: int, *, point_alias: bool = True
) -> str:
    """Create generation `gen`'s facts index if missing (FLAT: facts are few); optionally point the alias."""
    name = keys.facts_index(gen)
    await create_index(r, name, keys.fact_doc_prefix(gen), facts_schema(dim))
    if point_alias:
        await point_alias_at(r, keys.facts_index_alias, name)
    return name


def fact_fields(fact: Fact, tags: TagCodec) -> dict[EncodableT, EncodableT]:
    """The HASH fields of a fact document: tags (`evidence` and `users` digested with `tags`, as the
    episode index's ids are: `shared.tags`), numerics, text, centroid and the full JSON `doc`."""
    fields: dict[EncodableT, EncodableT] = {
        "text": fact.text,
        DOC_FIELD: json.dumps(
            {k: v for k, v in fact.to_data().items() if k != "centroid"}, ensure_ascii=False
        ),
    }
    digested = {
        "evidence": tags.episodes(fact.namespace, fact.evidence),
        "users": tags.users(fact.namespace, fact.users),
    }
    for name in FACT_TAGS:  # a list is one TAG value joined; an empty one or None is left out
        value = digested.get(name, getattr(fact, name))
        if value:
            fields[name] = value if isinstance(value, str) else TAG_SEPARATOR.join(value)
    numbers = {name: getattr(fact, name) for name in FACT_NUMERICS}
    numbers["superseded_at"] = fact.superseded_at if fact.superseded_at is not None else OPEN_END
    fields.update({k: repr(float(v)) for k, v in numbers.items() if v is not None})
    if fact.centroid:
        fields[CENTROID_FIELD] = fact.centroid_bytes()
    return fields


def fact_from_doc(raw: bytes | str, centroid: bytes | None = None) -> Fact:
    data = json.loads(raw)
    if centroid:
        data["centroid"] = centroid
    return Fact.from_data(data)


@dataclass(frozen=True, slots=True, kw_only=True)
class FactQuery:
    """Filters of a facts search; lists mean "any of"; agent/user/category match the evidence's.
    `as_of`: the facts valid at that instant; else current ones only unless `include_superseded`.
    `since`/`until`: evidence spans overlapping the window. `tags`: the generation's digests."""

    namespace: str
    tags: TagCodec
    agent_id: str | None = None
    user_id: str | None = None
    category: tuple[str, ...] = ()
    kind: tuple[str, ...] = ()
    level: str | None = None
    scope_id: str | None = None
    evidence: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    as_of: float | None = None
    include_superseded: bool = False
    min_confidence: float | None = None

    def query(self) -> str:
        parts = [tag_clause("namespace", self.namespace)]
        if self.as_of is not None:
            parts.append(numeric_clause("created_at", None, self.as_of))
            parts.append(f"@superseded_at:[({numeric_text(self.as_of)} +inf]")
        elif not self.include_superseded:
            parts.append(tag_clause("status", STATUS_CURRENT))
        if self.agent_id is not None:
            parts.append(tag_clause("agents", self.agent_id))
        if self.user_id is not None:
            parts.append(tag_clause("users", self.tags.user(self.namespace, self.user_id)))
        evidence = self.tags.episodes(self.namespace, self.evidence)
        for name, values in (("categories", self.category), ("kind", self.kind), ("evidence", evidence)):
            if values:
                parts.append(tag_clause(name, values))
        if self.level is not None:
            parts.append(tag_clause("level", self.level))
        if self.scope_id is not None:
            parts.append(tag_clause("scope_id", self.scope_id))
        if self.since is not None:
            parts.append(numeric_clause("last_at", self.since, None))
        if self.until is not None:
            parts.append(numeric_clause("first_at", None, self.until))
        if self.min_confidence is not None:
            parts.append(numeric_clause("confidence", self.min_confidence, None))
        return " ".join(parts)


@dataclass(slots=True)
class FactHit:
    fact: Fact
    score: float | None = None
    """Cosine similarity to the query vector (None for a filter-only search)."""


def _decode_hits(hits: Sequence[SearchHit]) -> list[FactHit]:
    out = []
    for hit in hits:
        raw = hit.fields.get(DOC_FIELD.encode())
        if raw is None:
            continue
        fact = fact_from_doc(raw, hit.fields.get(CENTROID_FIELD.encode()))
        dist = hit.fields.get(b"dist")
        out.append(FactHit(fact=fact, score=1.0 - float(dist) if dist is not None else None))
    return out


async def search_facts(
    r: aioredis.Redis, index: str, q: FactQuery, *, vector: np.ndarray | None = None, top_k: int = 10
) -> list[FactHit]:
    """KNN over fact centroids within the filters (nearest first), or without a vector the filtered
    facts by confidence, then support (descending). A missing index means no facts yet: []."""
    if vector is not None:
        expr = f"({q.query()})=>[KNN {int(top_k)} @{CENTROID_FIELD} $BLOB AS dist]"
        params = ["PARAMS", 2, "BLOB", vector_bytes(vector), "SORTBY", "dist", "ASC", "RETURN", 3, "dist"]
        limit = int(top_k)
    else:
        expr, params, limit = q.query(), ["SORTBY", "confidence", "DESC", "RETURN", 2], 10_000
    command = ["FT.SEARCH", index, expr, *search_limit(), *params, DOC_FIELD, CENTROID_FIELD]
    reply = await unless_missing(r.execute_command(*command, "LIMIT", 0, limit, "DIALECT", 2))
    if reply is None:
        return []
    hits = _decode_hits(parse_search(reply)[1])
    if vector is None:
        hits.sort(key=lambda h: (-h.fact.confidence, -h.fact.support, h.fact.fact_id))
    return hits[:top_k]


async def facts_with_evidence(
    r: aioredis.Redis, index: str, namespace: str, episode_ids: Sequence[str], tags: TagCodec
) -> list[Fact]:
    """Every fact (current or superseded) of `namespace` whose evidence names one of `episode_ids`."""
    out: dict[str, Fact] = {}
    for start in range(0, len(episode_ids), 50):
        q = FactQuery(
            namespace=namespace,
            tags=tags,
            evidence=tuple(episode_ids[start : start + 50]),
            include_superseded=True,
        )
        for hit in await search_facts(r, index, q, top_k=10_000):
            out[hit.fact.fact_id] = hit.fact
    return [out[k] for k in sorted(out)]


async def index_docs(r: aioredis.Redis, index: str) -> int | None:
    """Documents in `index` (on a shard-local cluster the sum over every namespace's), None when there
    is no such index."""

    async def total() -> int:
        return sum([await index_size(r, name, **target) for name, target in await search_targets(r, index)])

    return await unless_missing(total())


def replay_record(gen: int) -> str:
    """The `meta` field where the replay that built generation `gen` says what it did with the facts
    (JSON: facts, fact_scopes, facts_indexed, facts_reembedded, embedder, dim)."""
    return f"g{gen}:facts"


async def facts_state(r: aioredis.Redis, keys: Keys) -> dict[str, Any]:
    """The live generation's facts, for `/readyz`: `{generation, indexed}` (documents its facts index
    holds, searchable) and, when a replay built the generation, `replay` (its `replay_record`: how many
    facts it carried over, how many it re-embedded for another embedder, how many it could index)."""
    gen = await current_generation(r, keys)
    indexed = await index_docs(r, keys.facts_index(gen)) or 0  # no index: no facts yet
    state: dict[str, Any] = {"generation": gen, "indexed": indexed}
    record = await r.hget(keys.meta, replay_record(gen))
    if record:
        state["replay"] = json.loads(record)
    return state


async def live_facts_index(r: aioredis.Redis, keys: Keys) -> str:
    """The facts index of the live generation (queries name it directly: a replay drops the old one)."""
    return keys.facts_index(await current_generation(r, keys))


async def get_fact(r: aioredis.Redis, keys: Keys, namespace: str, fact_id: str) -> Fact | None:
    """One fact of `namespace` (current or superseded), None when absent or of another namespace."""
    gen = await current_generation(r, keys)
    raw = await r.hget(keys.fact_doc(gen, namespace, fact_id), DOC_FIELD)
    if raw is None:
        return None
    fact = fact_from_doc(raw)
    return fact if fact.namespace == namespace else None
