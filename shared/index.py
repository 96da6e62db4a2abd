"""The episode index: its schema, its generations, and the queries over it (KNN, BM25, filters, counts).

Episode documents are HASHes under `Keys.episode_doc_prefix(gen)`; queries go through the alias
`Keys.episode_index_alias`, which a replay moves (`FT.ALIASUPDATE`). Every user-supplied value in a
query goes through `escape_tag` or `keyword_query`; TAG fields are CASESENSITIVE with the separator
U+001F (which validation forbids), so `a,b` or `x|y` is one exact tag. Ids of people are digested
(`shared.tags`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from engram_episodic.errors import Conflict
from engram_episodic.events import Episode
from engram_episodic.shapes import episode_to_dict
from shared.cluster import is_missing_index as is_missing_index  # re-exported for search callers
from shared.cluster import unless_missing
from shared.keys import Keys
from shared.keywords import STOPWORDS, fold_for_search, words
from shared.replies import as_text
from shared.tags import TagCodec, codec, mode_for
from shared.ties import TIE_FIELD, tie_break, tie_tag

if TYPE_CHECKING:
    from shared.settings import Settings

log = logging.getLogger("engram.index")

TAG_SEPARATOR = "\x1f"
TAG_FIELDS = (
    "namespace",
    "episode_id",
    "agent_id",
    "user_id",
    "session_id",
    "category",
    "outcome",
    "strategy",
    "status",
)
NUMERIC_FIELDS = (
    "started_at",
    "completed_at",
    "reward",
    "importance",
    "complexity",
    "iterations",
    "duration_s",
    "last_accessed",
    "access_count",
    "expires_at",
    "tiebreak",
)
# (field, BM25 weight). The task is what a new task is matched against, so it counts double.
TEXT_FIELDS = (
    ("task", 2.0),
    ("solution", 1.0),
    ("observation", 1.0),
    ("thoughts", 1.0),
    ("action_text", 1.0),
    ("result", 1.0),
    ("outcome_details", 1.0),
    ("feedback_message", 1.0),
    ("errors", 1.0),
)
VECTOR_FIELD = "vector"
DOC_FIELD = "doc"
STATUS_DRAFT, STATUS_COMPLETED = "draft", "completed"


_TAG_ESCAPES = {code: f"\\{chr(code)}" for code in range(128) if not chr(code).isalnum()}


def escape_tag(value: str) -> str:
    """Escape a TAG value for `@field:{...}` (DIALECT 2): every ASCII non-alphanumeric (non-ASCII needs none)."""
    return value.translate(_TAG_ESCAPES)


def tag_clause(field_name: str, values: str | Iterable[str]) -> str:
    """`@field:{v1 | v2}` with every value escaped; one value or any of several."""
    if isinstance(values, str):
        values = [values]
    escaped = " | ".join(escape_tag(v) for v in values)
    return f"@{field_name}:{{{escaped}}}"


def numeric_text(x: float) -> str:
    """A number as a numeric range's bound: `+inf`, `-inf` or its shortest exact decimal (repr)."""
    if x == math.inf:
        return "+inf"
    if x == -math.inf:
        return "-inf"
    return repr(float(x))


def numeric_clause(field_name: str, lo: float | None, hi: float | None) -> str:
    """`@field:[lo hi]`, both bounds inclusive; None is unbounded."""
    return f"@{field_name}:[{numeric_text(-math.inf if lo is None else lo)} {numeric_text(math.inf if hi is None else hi)}]"


def keyword_query(text: str, scope_query: str | None = None) -> str | None:
    """A BM25 query matching any word of `text` in the text fields (STOPWORDS dropped), or None
    if it has none. With `scope_query`, the scope is in each word's clause with weight 0, so that only
    the words score."""
    terms = [t for t in dict.fromkeys(words(text)) if t not in STOPWORDS][:64]
    if not terms:
        return None
    fields = "|".join(name for name, _ in TEXT_FIELDS)
    if scope_query is None:
        return f"@{fields}:({' | '.join(escape_tag(t) for t in terms)})"
    scope = f"({scope_query})=>{{$weight: 0.0;}}"
    return " | ".join(f"(@{fields}:{escape_tag(t)} {scope})" for t in terms)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scope:
    """Server-side filters of a recall. `namespace` comes from the server (API key or SDK), never a
    request body. Lists mean "any of"; ranges are inclusive; times are UTC epoch seconds on `completed_at`.
    `tags` digests ids for the index queried; `episode_tags` are digests as the index holds them."""

    namespace: str
    tags: TagCodec
    agent_id: str | None = None
    user_id: str | None = None
    session_id: str | None = None
    category: tuple[str, ...] = ()
    outcome: tuple[str, ...] = ()
    strategy: tuple[str, ...] = ()
    episode_id: tuple[str, ...] = ()
    reward: tuple[float | None, float | None] = (None, None)
    importance: tuple[float | None, float | None] = (None, None)
    episode_tags: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    status: str | None = STATUS_COMPLETED
    live_at: float | None = None  # hide the episodes whose expires_at is at or before this instant
    clause: str = ""  # a further filter expression ANDed: only Engram's own (`services.query.recall.lists`)

    def query(self, *, checked: bool = False) -> str:
        """The RediSearch filter expression (DIALECT 2) for this scope; "*" when empty. `checked` leaves
        out the namespace and status clauses, for a KNN restricted (`INKEYS`) to documents of this scope."""
        ns, tags = self.namespace, self.tags
        parts = [] if checked else [tag_clause("namespace", ns)]
        if self.status and not checked:
            parts.append(tag_clause("status", self.status))
        if self.agent_id is not None:
            parts.append(tag_clause("agent_id", self.agent_id))
        if self.user_id is not None:
            parts.append(tag_clause("user_id", tags.user(ns, self.user_id)))
        if self.session_id is not None:
            parts.append(tag_clause("session_id", tags.session(ns, self.session_id)))
        for name in ("category", "outcome", "strategy"):
            values = getattr(self, name)
            if values:
                parts.append(tag_clause(name, values))
        if self.episode_id or self.episode_tags:
            parts.append(tag_clause("episode_id", tags.episodes(ns, self.episode_id) + self.episode_tags))
        for name in ("reward", "importance"):
            lo, hi = getattr(self, name)
            if lo is not None or hi is not None:
                parts.append(numeric_clause(name, lo, hi))
        if self.since is not None or self.until is not None:
            parts.append(numeric_clause("completed_at", self.since, self.until))
        if self.live_at is not None:  # a missing expires_at matches no range: those never expire
            parts.append("-" + numeric_clause("expires_at", None, self.live_at))
        if self.clause:
            parts.append(self.clause)
        return " ".join(parts) or "*"

    def cache_key(self) -> str:
        """`query()` without the expiry clause (whose instant changes every call), for caches."""
        return Scope.query(replace(self, live_at=None))


@dataclass(frozen=True, slots=True, kw_only=True)
class VectorParams:
    """Vector index parameters (see docs/benchmarks.md for the measured HNSW vs FLAT trade-off)."""

    dim: int
    algorithm: str = "HNSW"
    m: int = 16
    ef_construction: int = 200
    ef_runtime: int = 10
    block_size: int = 0
    """FLAT only: vectors per allocation (0 = the module's default, 1,024)."""

    @classmethod
    def of(cls, settings: Settings, dim: int) -> VectorParams:
        """The parameters `settings` configure for vectors of `dim` dimensions."""
        return cls(
            dim=dim,
            algorithm=settings.vector_algorithm,
            m=settings.hnsw_m,
            ef_construction=settings.hnsw_ef_construction,
            ef_runtime=settings.hnsw_ef_runtime,
            block_size=settings.vector_block_size,
        )

    def schema_args(self) -> list[Any]:
        attrs: list[Any] = ["TYPE", "FLOAT32", "DIM", self.dim, "DISTANCE_METRIC", "COSINE"]
        if self.algorithm == "HNSW":
            attrs += ["M", self.m, "EF_CONSTRUCTION", self.ef_construction, "EF_RUNTIME", self.ef_runtime]
        elif self.block_size:
            attrs += ["BLOCK_SIZE", self.block_size]
        return [VECTOR_FIELD, "VECTOR", self.algorithm, len(attrs), *attrs]


SORTABLE_TAG_FIELDS = ("namespace", "outcome", "status")
"""TAG fields a recall returns for every hit, kept in the sorting vector as written (UNF), so a
search returning only sortable fields reads no hash."""


def episode_schema(params: VectorParams) -> list[Any]:
    """The FT.CREATE SCHEMA arguments of a new generation's episode index."""
    args: list[Any] = []
    for name in TAG_FIELDS:
        args += [name, "TAG", "SEPARATOR", TAG_SEPARATOR, "CASESENSITIVE"]
        if name in SORTABLE_TAG_FIELDS:
            args += ["SORTABLE", "UNF"]
    for name in NUMERIC_FIELDS:
        args += [name, "NUMERIC", "SORTABLE"]
    for name, weight in TEXT_FIELDS:
        args += [name, "TEXT", "WEIGHT", weight]
    return args + params.schema_args()


async def index_exists(r: aioredis.Redis, name: str) -> bool:
    """Whether the index (or alias) `name` exists, by `FT.EXPLAIN name *` (far cheaper than FT.INFO).
    ResponseError other than a missing index propagates."""
    return await unless_missing(r.execute_command("FT.EXPLAIN", name, "*", "DIALECT", 2)) is not None


async def create_index(r: aioredis.Redis, name: str, doc_prefix: str, schema: Sequence[Any]) -> None:
    """`FT.CREATE name ON HASH PREFIX 1 doc_prefix SCHEMA *schema`; an index of that name created
    meanwhile by another process is no error (ResponseError otherwise)."""
    try:
        await r.execute_command("FT.CREATE", name, "ON", "HASH", "PREFIX", 1, doc_prefix, "SCHEMA", *schema)
    except ResponseError as exc:
        if "already exists" not in str(exc).lower():
            raise


SEARCH_TIMEOUT = "Timeout limit was reached"
"""RediSearch's error for a query past its TIMEOUT where ON_TIMEOUT is FAIL (`check_on_timeout`)."""

_NO_LIMIT: tuple[Any, ...] = ("TIMEOUT", 0)
_search_limit: tuple[Any, ...] = ()


def search_limit() -> tuple[Any, ...]:
    """The arguments every FT.SEARCH / FT.AGGREGATE carries after its query: none under ON_TIMEOUT
    FAIL (a query past TIMEOUT errs, answered 503), else `TIMEOUT 0` (`check_on_timeout` decides at start)."""
    return _search_limit


async def check_on_timeout(r: aioredis.Redis) -> str:
    """What RediSearch does with a query past its TIMEOUT on `r` (every primary of a cluster):
    "fail" or "return" (also when the server will not say); read, never set (it is server-wide). Under
    "return" a search would silently answer part of its scope, so every search then carries `TIMEOUT 0`."""
    global _search_limit
    nodes = r.get_primaries() if isinstance(r, RedisCluster) else [None]
    policy = "fail"
    for node in nodes:
        target: dict[str, Any] = {"target_nodes": node} if node is not None else {}
        try:
            reply = await r.execute_command("FT.CONFIG", "GET", "ON_TIMEOUT", **target)
            value = as_text(reply[0][1]).lower() if reply and reply[0] else "return"
        except ResponseError:  # a managed Redis refusing FT.CONFIG: assume the default
            value = "return"
        if value != "fail":
            policy = "return"
    _search_limit = () if policy == "fail" else _NO_LIMIT
    return policy


async def current_generation(r: aioredis.Redis, keys: Keys) -> int:
    """The live projection generation (1 when nothing was built yet)."""
    raw = await r.hget(keys.meta, "generation")
    return int(raw) if raw else 1


def embedder_setting(name: str, dim: int) -> str:
    """The environment that selects the embedder recorded as `name` with `dim` dimensions, for messages:
    `ENGRAM_EMBEDDER=mpnet`, `ENGRAM_EMBEDDER=hashing ENGRAM_EMBED_DIM=128`."""
    if name.startswith("openai/"):
        return f"ENGRAM_EMBEDDER=openai ENGRAM_OPENAI_MODEL={name[len('openai/') :]}"
    kind = name.split("-")[0].split("/")[0]
    return f"ENGRAM_EMBEDDER={kind}" + (f" ENGRAM_EMBED_DIM={dim}" if kind == "hashing" else "")


class EmbedderMismatch(Conflict):
    """A generation's index was built with another embedder (name or dimension) than this process's.

    At start it is a configuration error; in a running process it means the index was rebuilt under
    it (`reindex`). `gen`, `index_embedder`, `index_dim`, `embedder`, `dim` name both sides.
    """

    def __init__(self, index: str, gen: int, index_embedder: str, index_dim: int, embedder: str, dim: int):
        self.gen, self.index_embedder, self.index_dim = gen, index_embedder, index_dim
        self.embedder, self.dim = embedder, dim
        super().__init__(
            f"index {index} was built with embedder {index_embedder!r} (dim {index_dim}), but this process "
            f"uses {embedder!r} (dim {dim}); start it with {embedder_setting(index_embedder, index_dim)}, "
            f"or rebuild the index with this one: `engram-admin reindex --embedder "
            f"{embedder.split('-')[0].split('/')[0]}`"
        )


async def embedder_mismatch(
    r: aioredis.Redis, keys: Keys, gen: int, embedder: str, dim: int
) -> EmbedderMismatch | None:
    """EmbedderMismatch when generation `gen` records another embedder name or dimension, else None."""
    name, recorded_dim = await r.hmget(keys.meta, [f"g{gen}:embedder", f"g{gen}:dim"])
    if name is None or (as_text(name), int(recorded_dim or 0)) == (embedder, dim):
        return None
    return EmbedderMismatch(
        keys.episode_index(gen), gen, as_text(name), int(recorded_dim or 0), embedder, dim
    )


async def ensure_episode_index(
    r: aioredis.Redis,
    keys: Keys,
    gen: int,
    params: VectorParams,
    embedder_name: str,
    *,
    tag_key: bytes | None,
    point_alias: bool = True,
) -> TagCodec:
    """Create generation `gen`'s episode index if missing, record its embedder, and return the
    digest function of its TAG fields (`shared.tags`); `tag_key` is the deployment's (None without a
    master key).

    Raises EmbedderMismatch (a Conflict) when the index was built with another embedder name or dimension
    (`engram-admin reindex` builds a new generation instead); ConfigError when the generation holds keyed
    digests and `tag_key` is None.
    """
    name = keys.episode_index(gen)
    mismatch = await embedder_mismatch(r, keys, gen, embedder_name, params.dim)
    if mismatch is not None:
        raise mismatch
    if await check_on_timeout(r) != "fail":
        log.warning(
            "RediSearch answers a query past its TIMEOUT with part of its results on this Redis "
            "(ON_TIMEOUT RETURN, server-wide: left as it is); Engram's searches run without a time limit "
            "instead (TIMEOUT 0), so none is cut short. On a Redis of Engram's own, set "
            "`search-on-timeout fail` to bound them (docs/configuration.md)"
        )
    if not await index_exists(r, name):
        # recorded before the index exists, so a process that finds the index also finds its mode
        await r.hsetnx(keys.meta, f"g{gen}:tags", mode_for(tag_key))
        await create_index(r, name, keys.episode_doc_prefix(gen), episode_schema(params))
    await r.hset(
        keys.meta,
        mapping={
            f"g{gen}:embedder": embedder_name,
            f"g{gen}:dim": params.dim,
            f"g{gen}:algorithm": params.algorithm,
        },
    )
    await r.hsetnx(keys.meta, "generation", gen)
    if point_alias:
        await point_alias_at(r, keys.episode_index_alias, name)
    return await generation_tags(r, keys, gen, tag_key)


async def generation_tags(r: aioredis.Redis, keys: Keys, gen: int, tag_key: bytes | None) -> TagCodec:
    """The digest function of generation `gen`'s TAG fields, as recorded in the meta hash when its index
    was created (`ensure_episode_index`). ConfigError as in `shared.tags.codec`."""
    raw = await r.hget(keys.meta, f"g{gen}:tags")
    return codec(as_text(raw) if raw else mode_for(tag_key), tag_key, prefix=keys.prefix)


async def point_alias_at(r: aioredis.Redis, alias: str, index: str) -> None:
    """FT.ALIASUPDATE, which creates or atomically moves the alias."""
    await r.execute_command("FT.ALIASUPDATE", alias, index)


def vector_bytes(vector: np.ndarray | Sequence[float]) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


class LiveTags:
    """The live generation's TAG digest function for a long-running reader (the query service): the
    generation is re-read at most every `ttl` seconds, so a `replay` is followed within `ttl`."""

    def __init__(self, keys: Keys, tag_key: bytes | None, *, ttl: float = 1.0):
        self.keys, self.tag_key, self.ttl = keys, tag_key, ttl
        self._by_gen: dict[int, TagCodec] = {}
        self._live: tuple[float, TagCodec] | None = None
        self._gen = 0
        self.embedder: tuple[str, int] | None = None
        """(name, dim) of the process's embedder, once loaded: what `mismatch` compares with."""
        self._mismatch: dict[int, EmbedderMismatch | None] = {}

    async def get(self, r: aioredis.Redis) -> TagCodec:
        now = time.monotonic()
        if self._live is not None and now - self._live[0] < self.ttl:
            return self._live[1]
        gen = await current_generation(r, self.keys)
        tags = self._by_gen.get(gen)
        if tags is None:
            tags = self._by_gen[gen] = await generation_tags(r, self.keys, gen, self.tag_key)
        self._live, self._gen = (now, tags), gen
        return tags

    async def mismatch(self, r: aioredis.Redis) -> EmbedderMismatch | None:
        """EmbedderMismatch when the live generation's index was built with another embedder than
        `embedder` (a `reindex --embedder` under this process), else None (also before `embedder` is set)."""
        await self.get(r)
        gen = self._gen
        if self.embedder is None:
            return None
        if gen not in self._mismatch:
            self._mismatch[gen] = await embedder_mismatch(r, self.keys, gen, *self.embedder)
        return self._mismatch[gen]


def episode_fields(
    namespace: str, episode: Episode, *, status: str, vector: np.ndarray | None, tags: TagCodec
) -> dict[str, Any]:
    """The HASH fields of an episode document: indexed fields (ids digested with `tags`), the JSON
    `doc`, the vector. Not `last_accessed` / `access_count`: the query service owns those."""
    task = episode.task
    fb = episode.feedback
    fields: dict[str, Any] = {
        "namespace": namespace,
        "episode_id": tags.episode(namespace, episode.episode_id),
        "status": status,
        DOC_FIELD: orjson.dumps(episode_to_dict(episode, include_vector=False)),
    }
    clear = {
        "agent_id": episode.agent_id,
        "category": task.category if task else None,
        "outcome": episode.outcome,
        "strategy": episode.strategy_used,
        "user_id": tags.user(namespace, episode.user_id) if episode.user_id is not None else None,
        "session_id": tags.session(namespace, episode.session_id) if episode.session_id is not None else None,
    }
    fields.update({k: v for k, v in clear.items() if v is not None})
    fields[TIE_FIELD] = str(tie_break(tie_tag(tags, episode.episode_id)))
    numbers = {
        "started_at": episode.started_at,
        "completed_at": episode.completed_at,
        "reward": fb.reward if fb else None,
        "importance": episode.importance,
        "complexity": task.complexity if task else None,
        "iterations": episode.iterations,
        "duration_s": episode.duration_s,
        "expires_at": episode.expires_at,
    }
    fields.update({k: repr(float(v)) for k, v in numbers.items() if v is not None})
    texts = episode_texts(episode)
    fields.update({k: fold_for_search(v) for k, v in texts.items() if v})
    if vector is not None:
        fields[VECTOR_FIELD] = vector_bytes(vector)
    return fields


def episode_texts(episode: Episode) -> dict[str, str | None]:
    """The episode's text fields as indexed (before `fold_for_search`), None where it has none: `task`,
    `solution`, `observation`, `thoughts`, `action_text` (the action, then each action's type, input,
    output), `result`, `outcome_details`, `feedback_message`, `errors` (the actions' errors)."""
    return {
        "task": episode.task.description if episode.task else None,
        "solution": episode.solution,
        "observation": episode.observation,
        "thoughts": episode.thoughts,
        "action_text": " ".join(
            filter(
                None,
                [episode.action]
                + [f"{a.action_type} {a.input or ''} {a.output or ''}" for a in episode.actions],
            )
        )
        or None,
        "result": episode.result,
        "outcome_details": episode.outcome_details,
        "feedback_message": episode.feedback.message if episode.feedback else None,
        "errors": " ".join(a.error for a in episode.actions if a.error) or None,
    }


def embedding_text(episode: Episode) -> str:
    """What the embedder sees for an episode: the task first (what recall queries resemble), then
    the observation, solution, result and outcome notes."""
    parts = [
        episode.task.description if episode.task else "",
        episode.observation or "",
        episode.solution or "",
        episode.result or "",
        episode.outcome_details or "",
    ]
    return "\n".join(p for p in parts if p).strip() or (episode.task.description if episode.task else "")


@dataclass(slots=True)
class SearchHit:
    """One document from FT.SEARCH: its key, returned fields and score/distance if asked for."""

    key: bytes
    fields: dict[bytes, bytes] = field(default_factory=dict)
    score: float | None = None


def aggregate_rows(reply: list[Any]) -> list[dict[str, Any]]:
    """The rows of a RESP2 FT.AGGREGATE reply ([count, [f, v, ...], ...]) as {field name: raw value}."""
    return [{row[i].decode(): row[i + 1] for i in range(0, len(row) - 1, 2)} for row in reply[1:]]


def parse_search(reply: list[Any], *, with_scores: bool = False) -> tuple[int, list[SearchHit]]:
    """Parse a RESP2 FT.SEARCH reply: [total, key, (score,) [f, v, ...], ...]."""
    step = 3 if with_scores else 2
    hits: list[SearchHit] = []
    for i in range(1, len(reply), step):
        raw = reply[i + step - 1] if i + step - 1 < len(reply) else []
        pairs: Iterator[bytes] = iter(raw if isinstance(raw, list) else ())
        fields = dict(zip(pairs, pairs, strict=False))  # [f1, v1, f2, v2] → {f1: v1, f2: v2}
        hits.append(
            SearchHit(key=reply[i], fields=fields, score=float(reply[i + 1]) if with_scores else None)
        )
    return int(reply[0]), hits


async def index_size(r: aioredis.Redis, index: str, query: str = "*", **target: Any) -> int:
    """Documents of `query` in `index` (all by default: cheaper than FT.INFO's num_docs). `target`:
    `execute_command` keyword arguments."""
    reply = await r.execute_command(
        "FT.SEARCH", index, query, *search_limit(), "NOCONTENT", "LIMIT", 0, 0, "DIALECT", 2, **target
    )
    return int(reply[0])


async def filter_search(
    r: aioredis.Redis,
    index: str,
    scope: Scope,
    *,
    return_fields: Sequence[str],
    sort_by: str | None = None,
    descending: bool = True,
    offset: int = 0,
    limit: int = 10,
) -> tuple[int, list[SearchHit]]:
    """Documents matching the scope (no ranking), optionally sorted by a SORTABLE numeric field."""
    args: list[Any] = ["FT.SEARCH", index, scope.query(), *search_limit()]
    if return_fields:
        args += ["RETURN", len(return_fields), *return_fields]
    else:
        args += ["NOCONTENT"]
    if sort_by:
        args += ["SORTBY", sort_by, "DESC" if descending else "ASC"]
    args += ["LIMIT", offset, limit, "DIALECT", 2]
    return parse_search(await r.execute_command(*args))


async def term_counts(r: aioredis.Redis, index: str, scope: Scope, words: Sequence[str]) -> list[int]:
    """How many documents of `scope` each word matches in the text fields (stemmed, as in BM25);
    one pipelined count per word."""
    queries = [keyword_query(w, scope.query()) for w in words]
    async with r.pipeline(transaction=False) as pipe:
        for q in queries:
            if q is not None:
                pipe.execute_command("FT.SEARCH", index, q, *search_limit(), "LIMIT", 0, 0, "DIALECT", 2)
        replies = iter(await pipe.execute())
    return [int(next(replies)[0]) if q is not None else 0 for q in queries]


async def count(r: aioredis.Redis, index: str, scope: Scope) -> int:
    total, _ = await filter_search(r, index, scope, return_fields=(), limit=0)
    return total


async def category_stats(r: aioredis.Redis, index: str, scope: Scope) -> list[dict[str, Any]]:
    """Per category of the scope: {category, episodes, successes, avg_reward, avg_iterations}; averages
    are SUM / (documents with the field), None when none has it (AVG would count a missing one as 0)."""

    sums = {"successes": "@is_success", "sum_reward": "@reward", "n_reward": "@has_reward"}
    sums |= {"sum_iterations": "@iterations", "n_iterations": "@has_iterations"}
    args: list[Any] = ["FT.AGGREGATE", index, scope.query(), *search_limit()]
    args += ["LOAD", 4, "@category", "@outcome", "@reward", "@iterations"]
    applies = {"is_success": '@outcome == "success"', "has_reward": "exists(@reward)"}
    for name, expression in (applies | {"has_iterations": "exists(@iterations)"}).items():
        args += ["APPLY", expression, "AS", name]
    args += ["GROUPBY", 1, "@category", "REDUCE", "COUNT", 0, "AS", "episodes"]
    for name, source in sums.items():
        args += ["REDUCE", "SUM", 1, source, "AS", name]
    out = []
    for f in aggregate_rows(await r.execute_command(*args, "DIALECT", 2)):
        if f.get("category") is None:
            continue
        n = {name: float(f.get(name) or 0) for name in ("episodes", *sums)}
        out.append(
            {
                "category": f["category"].decode(),
                "episodes": int(n["episodes"]),
                "successes": int(n["successes"]),
                "avg_reward": n["sum_reward"] / n["n_reward"] if n["n_reward"] else None,
                "avg_iterations": n["sum_iterations"] / n["n_iterations"] if n["n_iterations"] else None,
            }
        )
    return sorted(out, key=lambda row: row["category"])


async def agent_category_counts(r: aioredis.Redis, index: str, scope: Scope) -> list[tuple[str, str, int]]:
    """(agent_id, category, episodes) of every pair present in the scope's documents (FT.AGGREGATE);
    documents without an agent or a category are not counted. Facts are consolidated per pair."""
    reply = await r.execute_command(
        "FT.AGGREGATE",
        index,
        scope.query(),
        *search_limit(),
        *("LOAD", 2, "@agent_id", "@category", "FILTER", "exists(@agent_id) && exists(@category)"),
        *("GROUPBY", 2, "@agent_id", "@category", "REDUCE", "COUNT", 0, "AS", "n", "DIALECT", 2),
    )
    out = []
    for f in aggregate_rows(reply):
        if f.get("agent_id") and f.get("category"):
            out.append((f["agent_id"].decode(), f["category"].decode(), int(f.get("n") or 0)))
    return out
