"""Configuration, read once from the environment and passed down.

`Settings.from_env(os.environ)` is called in each entry point (`__main__`), never at import time.
A malformed value raises `ConfigError` naming the variable, e.g.
`ENGRAM_HALF_LIFE='abc' is not a duration (use 3600, 90s, 30m, 12h, 1d or 1w)`.
Not pydantic-settings: its error names the field (`max_deliveries`), not the variable, in a four-line report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit

from engram_episodic.errors import ConfigError
from engram_episodic.validation import Collector, check_id
from shared.keys import CLUSTER_PARTITIONS, MAX_PARTITIONS, Keys

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


def parse_duration(text: str, name: str = "duration") -> float:
    """Parse `3600`, `90s`, `30m`, `12h`, `1d`, `1w` or `250ms` into seconds (float).

    Raises ConfigError naming `name` when the text is not a positive, finite duration.
    """
    m = _DURATION.match(str(text))
    if not m:
        raise ConfigError(f"{name}={text!r} is not a duration (use 3600, 90s, 30m, 12h, 1d or 1w)")
    seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{name}={text!r} must be a positive duration")
    return seconds


PLAIN_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def check_url(url: str) -> str:
    """The scheme of `url`; ValueError naming REDIS_URL unless it is redis://, rediss://, unix://,
    redis+cluster:// or rediss+cluster://."""
    scheme = urlsplit(url).scheme
    if scheme not in PLAIN_SCHEMES and scheme not in CLUSTER_SCHEMES:
        raise ValueError(
            f"REDIS_URL={url[:60]!r} must start with redis://, rediss://, unix://, redis+cluster:// or "
            "rediss+cluster://"
        )
    return scheme


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")


def _check_startup_values(env: Mapping[str, str]) -> None:
    """Values that would otherwise fail later: a traceback from `logging`/`connect()`, or an empty
    default namespace (every ingest 422)."""
    level = env.get("ENGRAM_LOG_LEVEL", "INFO")
    if level.upper() not in LOG_LEVELS:
        raise ConfigError(f"ENGRAM_LOG_LEVEL={level!r} must be one of {', '.join(LOG_LEVELS)}")
    log_format = env.get("ENGRAM_LOG_FORMAT") or "text"
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"ENGRAM_LOG_FORMAT={log_format!r} must be one of {', '.join(LOG_FORMATS)}")
    url = env.get("REDIS_URL") or ""
    if url:
        try:
            check_url(url)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    value = env.get("ENGRAM_DEFAULT_NAMESPACE", "default")
    if not value or value != value.strip():
        raise ConfigError(
            f"ENGRAM_DEFAULT_NAMESPACE={value!r} must be non-empty, without leading or trailing spaces"
        )
    if env.get("ENGRAM_EMBEDDER") == "openai" and not env.get("ENGRAM_OPENAI_URL"):
        raise ConfigError(
            "ENGRAM_EMBEDDER=openai needs ENGRAM_OPENAI_URL (e.g. https://api.openai.com/v1 or "
            "an Ollama/vLLM server's /v1)"
        )


def _master_key(env: Mapping[str, str]) -> bytes | None:
    from shared.crypto import parse_master_key, read_master_key_file

    text, path = env.get("ENGRAM_MASTER_KEY") or "", env.get("ENGRAM_MASTER_KEY_FILE") or ""
    if text and path:
        raise ConfigError("ENGRAM_MASTER_KEY and ENGRAM_MASTER_KEY_FILE are both set; set one of them")
    if text:
        return parse_master_key(text, name="ENGRAM_MASTER_KEY")
    if path:
        return read_master_key_file(path, name="ENGRAM_MASTER_KEY_FILE")
    return None


def _metrics_key(env: Mapping[str, str], api_keys: dict[str, str]) -> str | None:
    """`ENGRAM_METRICS_KEY`: visible ASCII (a Bearer token), not a tenant's key (a tenant would read
    every namespace's traffic); its value is never echoed in the error."""
    key = env.get("ENGRAM_METRICS_KEY") or None
    if key is None:
        return None
    if not all("!" <= ch <= "~" for ch in key):
        raise ConfigError(
            "ENGRAM_METRICS_KEY must be visible ASCII without spaces (it is sent as a Bearer token)"
        )
    if key in api_keys:
        raise ConfigError(
            "ENGRAM_METRICS_KEY is also an API key in ENGRAM_API_KEYS[_FILE]; give metrics a key of their own"
        )
    return key


def env_int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """`env[name]` as an int in [lo, hi] (`default` when unset or empty); ConfigError naming it otherwise."""
    raw = env.get(name)
    return default if raw is None or raw == "" else integer(lo, hi)(raw, name)


_LAYOUT = " \t\r"


def parse_api_keys(text: str, *, name: str = "ENGRAM_API_KEYS") -> dict[str, str]:
    """Parse `key1=namespace1,key2=namespace2` (commas or newlines; blank lines and `#` comments
    ignored) into {key: namespace}.

    Raises ConfigError naming `name` and the entry's position (never the key) on an entry without `=`,
    an empty key or namespace, a namespace `check_id` refuses, or a key listed twice.
    """
    keys: dict[str, str] = {}
    for raw in re.split(r"[,\n]", text):
        # only layout blanks are stripped: `str.strip()` also ate \x1f, so "k=acme\x1f" opened "acme"
        entry = raw.strip(_LAYOUT)
        if not entry or entry.startswith("#"):
            continue
        key, sep, namespace = entry.partition("=")
        key, namespace = key.strip(_LAYOUT), namespace.strip(_LAYOUT)
        if not sep or not key or not namespace:
            raise ConfigError(f"{name}: entry {len(keys) + 1} must look like KEY=NAMESPACE")
        if key in keys:
            raise ConfigError(f"{name}: a key is listed twice")
        errs = Collector()
        check_id(namespace, "namespace", errs, required=True)
        if errs.errors:
            raise ConfigError(f"{name}: the namespace of entry {len(keys) + 1} {errs.errors[0][1]}")
        keys[key] = namespace
    return keys


# --- declaring a setting ---------------------------------------------------------------------------
Parse = Callable[[str, str], Any]
"""(raw text, variable name) -> value; raw is never empty (unset or empty means the default)."""


def _bounded(kind: Callable[[str], float], what: str, lo: float, hi: float) -> Parse:
    def parse(raw: str, name: str) -> Any:
        try:
            value = kind(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not {what}") from None
        if not lo <= value <= hi:  # also refuses nan and inf
            raise ConfigError(f"{name}={raw!r} must be between {lo} and {hi}")
        return value

    return parse


def integer(lo: int, hi: int) -> Parse:
    """An int in [lo, hi]; ConfigError naming the variable otherwise."""
    return _bounded(int, "an integer", lo, hi)


def number(lo: float, hi: float) -> Parse:
    """A finite float in [lo, hi]; ConfigError naming the variable otherwise."""
    return _bounded(float, "a number", lo, hi)


def duration_or_off(raw: str, name: str) -> float | None:
    """A duration, or None for `off` / `none`."""
    return None if raw.strip().lower() in ("off", "none") else parse_duration(raw, name)


def choice(*choices: str) -> Parse:
    """One of `choices`; ConfigError naming the variable and the choices otherwise."""

    def parse(raw: str, name: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{name}={raw!r} must be one of {', '.join(choices)}")
        return raw

    return parse


def text(raw: str, name: str) -> str:
    return raw


def prefix_text(raw: str, name: str) -> str:
    if any(ch.isspace() for ch in raw):
        raise ConfigError(f"{name}={raw!r} must be non-empty and contain no whitespace")
    if "{" in raw or "}" in raw:  # the first braces of a key name are its hash tag (shared.keys)
        raise ConfigError(f"{name}={raw!r} must not contain braces")
    return raw


def env(variable: str, default: Any, parse: Parse = text) -> Any:
    """A Settings field read from `variable` by `Settings.from_env` (unset or empty: the default). Its
    one-line docstring is its row in docs/configuration.md (tests/unit/test_docs_configuration.py)."""
    return field(default=default, metadata={"env": variable, "parse": parse})


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every tunable of Engram; times are seconds.

    Fields declared with `env(...)` are read by `from_env`; fields with a plain default are tuned
    constants (their reason beside them; tests and benchmarks set them in code). The API keys, the
    master key and the metrics key are read by hand (files, mutual exclusion, secrets never echoed)."""

    redis_url: str | None = env("REDIS_URL", None)
    """Redis 8 with the Query Engine; `redis+cluster://host:port` for a Redis Cluster ([scaling.md](scaling.md#a-redis-cluster)); unset: the embedded Redis"""
    prefix: str = env("ENGRAM_PREFIX", "engram:", prefix_text)
    """prefix of every key (no whitespace, no braces)"""
    stream_partitions: int | None = env("ENGRAM_STREAM_PARTITIONS", None, integer(1, MAX_PARTITIONS))
    """episode stream partitions (1–256), recorded at first start"""
    cluster_search: str = env("ENGRAM_CLUSTER_SEARCH", "shard", choice("shard", "coordinator"))
    """on a cluster: `shard` (an index per primary, queries routed by slot) or `coordinator` (Redis 8 fans out)"""

    # embedding
    embedder: str = env("ENGRAM_EMBEDDER", "auto", choice("auto", "hashing", "minilm", "mpnet", "openai"))
    """`auto`, `mpnet`, `minilm`, `hashing` or `openai` ([below](#the-embedders))"""
    embed_dim: int = env("ENGRAM_EMBED_DIM", 384, integer(8, 8192))
    """dimensions of the `hashing` embedder (a model has its own)"""
    embed_batch_size: int = 64
    """Texts per forward pass, sorted by length: 64 keeps padding low on CPU."""
    embed_max_chars: int = 2000
    """Characters of an episode's text that are embedded (the model's 256-384 word-piece window)."""
    embed_threads: int = env("ENGRAM_EMBED_THREADS", 2, integer(1, 256))
    """inference threads of `minilm` / `mpnet` per process ([below](#how-the-models-run))"""
    model_cache: str | None = env("ENGRAM_MODEL_CACHE", None)
    """where `mpnet` is unpacked and the model exports are kept"""
    openai_url: str | None = env("ENGRAM_OPENAI_URL", None)
    """base URL of an OpenAI-compatible `/v1/embeddings` (required with `ENGRAM_EMBEDDER=openai`)"""
    openai_model: str = env("ENGRAM_OPENAI_MODEL", "text-embedding-3-small")
    """its model"""
    openai_api_key: str | None = env("ENGRAM_OPENAI_API_KEY", None)
    """its bearer key"""
    openai_timeout: float = 30.0
    """Seconds one embeddings request may take before it is retried (up to 3 times)."""

    # index
    vector_algorithm: str = env("ENGRAM_VECTOR_ALGORITHM", "HNSW", choice("HNSW", "FLAT"))
    """`HNSW` (M 16, EF_CONSTRUCTION 200, EF_RUNTIME 100) or `FLAT` (exact; as fast below ~20,000 episodes)"""
    hnsw_m: int = 16
    """HNSW graph degree (RediSearch's default)."""
    hnsw_ef_construction: int = 200
    """HNSW build beam (the module's default: 100 halves Redis's CPU per insert, ~2% of an ingest's)."""
    hnsw_ef_runtime: int = 100
    """HNSW search beam: recall@10 0.985 at 100,000 documents; the module's 10 gave 0.648 (docs/benchmarks.md)."""
    vector_block_size: int = env("ENGRAM_VECTOR_BLOCK_SIZE", 0, integer(0, 1_048_576))
    """with `FLAT` only: vectors per allocation (many small namespaces per shard, [scaling.md](scaling.md))"""

    # consolidator
    consumer_group: str = "consolidator"
    """The consolidator's consumer group on the episode stream."""
    consumer_name: str | None = env("ENGRAM_CONSUMER_NAME", None)
    """this worker's consumer name (`make run` names worker *i* stably, so a restart reads its predecessor's pending entries)"""
    batch_size: int = 256
    """Stream entries one lane reads at a time (128 and 512 measured within noise)."""
    in_flight: int = 4
    """Batches one worker projects concurrently (8 measured no better)."""
    block_ms: int = 1000
    """Milliseconds an idle lane blocks in XREADGROUP (tests use 50 ms)."""
    lease_ms: int = env("ENGRAM_LEASE_MS", 30_000, integer(10, 3_600_000))
    """how long a read entry belongs to its worker before another may reclaim it"""
    max_deliveries: int = env("ENGRAM_MAX_DELIVERIES", 5, integer(1, 1000))
    """deliveries after which an entry is dead-lettered with its reason"""
    short_term_window: int = env("ENGRAM_SHORT_TERM_WINDOW", 5, integer(1, 1000))
    """completed episodes in `/v1/context`'s short-term window"""
    metrics_port: int = env("ENGRAM_METRICS_PORT", 9191, integer(0, 65535))
    """the consolidator's `/healthz` and `/metrics` (0 = none; [reliability.md](reliability.md#health-of-a-consolidator))"""
    health_stall: float = 120.0
    """Seconds a lane may go without coming round its loop before `/healthz` answers 503 `stuck`."""

    # recall defaults
    recall_mode: str = env("ENGRAM_RECALL_MODE", "hybrid", choice("vector", "keyword", "hybrid"))
    """`vector`, `keyword` or `hybrid` when a request names none"""
    recall_candidates: int = 100
    """Hits each candidate list contributes to the pool a recall re-ranks (a request may ask for
    another depth); independent of `top_k`, so recall is prefix-stable. 30, 50, 100: same LoCoMo R@5."""
    idf_cache_ttl: float | None = 30.0
    """Seconds a namespace's word counts (keyword idf) are remembered, a common word's 10x; None = count
    every time (tests). A first-seen common word costs 30-100 ms at a million episodes."""
    bm25_common_idf: float = 0.02
    """Query words with a lower idf leave the BM25 candidate query (`services.query.recall.relevance.common_terms`)."""
    query_cache: int = env("ENGRAM_QUERY_CACHE", 4096, integer(0, 1_000_000))
    """query embeddings remembered per namespace and text (LRU; 0 = off)"""
    query_batch: int = 32
    """Concurrent query embeddings share one forward pass of up to this many texts (8 clients, mpnet:
    2.7x the recalls/s of a pass per query)."""
    half_life: float = env("ENGRAM_HALF_LIFE", 86400.0, parse_duration)
    """recency half-life when a request names none"""
    default_top_k: int = env("ENGRAM_DEFAULT_TOP_K", 3, integer(1, 100))
    """`top_k` when a request names none"""

    # query service
    host: str = env("ENGRAM_HOST", "127.0.0.1")
    """the query service's bind address (a non-loopback host requires API keys)"""
    port: int = env("ENGRAM_PORT", 8080, integer(1, 65535))
    """the query service's port"""
    api_keys: dict[str, str] = field(default_factory=dict)
    """`ENGRAM_API_KEYS` and `ENGRAM_API_KEYS_FILE`: {key: namespace}."""
    metrics_key: str | None = None
    """`ENGRAM_METRICS_KEY`: with API keys set, the only key that reads /metrics."""
    default_namespace: str = env("ENGRAM_DEFAULT_NAMESPACE", "default")
    """the namespace when no API keys are set"""
    max_body_bytes: int = env("ENGRAM_MAX_BODY_BYTES", 4 * 1024 * 1024, integer(1024, 1 << 30))
    """larger request bodies get 413"""
    body_timeout: float = 60.0
    """Seconds a request body may take to arrive once its headers did (408 after)."""

    # SDK / publishing
    publish_timeout: float = 5.0
    """Seconds one publish of the query service's ingest may take before it is retried."""
    publish_retries: int = 100
    """Retries of a publish that met a Redis fault (with backoff) before ingest answers 503."""

    # facts (semantic memory)
    facts_every: int = 20
    """A scope is re-consolidated after this many newly completed episodes ..."""
    facts_importance_threshold: float = 150.0
    """... or when their summed importance reaches this (Park et al. 2023, Generative Agents: 150)."""
    facts_min_cluster: int = env("ENGRAM_FACTS_MIN_CLUSTER", 3, integer(2, 10_000))
    """episodes a cluster needs to become a fact"""
    facts_distance: float | None = env("ENGRAM_FACTS_DISTANCE", None, number(0.01, 1.99))
    """the clustering threshold; set it for an `openai` embedder ([architecture.md, Facts](architecture.md#facts-semantic-memory))"""
    facts_min_interval: float = 10.0
    """A worker re-consolidates one scope at most this often (clustering is ~60 ms of CPU per run)."""
    facts_max_episodes: int = 2000
    """A scope's consolidation reads at most its newest this many episodes (clustering is O(n^2))."""
    summarizer_url: str | None = env("ENGRAM_SUMMARIZER_URL", None)
    """optional fact summariser: any OpenAI-compatible base URL"""
    summarizer_model: str = env("ENGRAM_SUMMARIZER_MODEL", "gpt-4o-mini")
    """its model"""
    summarizer_api_key: str | None = env("ENGRAM_SUMMARIZER_API_KEY", None)
    """its bearer key"""
    summarizer_timeout: float = 20.0
    """Seconds one summarizer call may take; a fact keeps its template text when it fails."""
    summarizer_max_chars: int = 600
    """A summarised fact is clipped to this many characters."""

    # backpressure and retention
    max_lag: int = env("ENGRAM_MAX_LAG", 100_000, integer(1, 1 << 40))
    """consumer lag above which ingest answers 429 with `Retry-After`"""
    max_clock_skew: float = env("ENGRAM_MAX_CLOCK_SKEW", 300.0, parse_duration)
    """how far in the future an ingested instant may lie (422 beyond)"""
    stream_retention: float | None = env("ENGRAM_STREAM_RETENTION", 7 * 86400.0, duration_or_off)
    """projected stream entries older than this are trimmed (`off` keeps all)"""
    retention_interval: float = 60.0
    """How often a worker trims acked stream entries older than `stream_retention`."""
    expiry_interval: float = 60.0
    """How often one worker erases the episodes past their `expires_at` (reads hide them at once)."""

    # erasure (docs/reliability.md, "Erasure")
    master_key: bytes | None = field(default=None, repr=False)
    """`ENGRAM_MASTER_KEY` or `ENGRAM_MASTER_KEY_FILE`: 32 bytes sealing stream payloads per user
    (shared.crypto); None = plaintext. Never logged, never sent to Redis."""
    erasure_interval: float | None = env("ENGRAM_ERASURE_INTERVAL", 600.0, duration_or_off)
    """after forgets, workers compact the stream and rewrite the AOF at most this often (`off`: `erase-now` by hand)"""

    @property
    def partitions(self) -> int:
        """`stream_partitions`, or its default for the topology of `redis_url`."""
        if self.stream_partitions is not None:
            return self.stream_partitions
        url = self.redis_url or ""
        return CLUSTER_PARTITIONS if url.startswith(("redis+cluster://", "rediss+cluster://")) else 1

    @property
    def graph_ef(self) -> int:
        """`hnsw_ef_runtime` when the index is HNSW, else 0 (`services.query.recall.arms.widened_ef`)."""
        return self.hnsw_ef_runtime if self.vector_algorithm == "HNSW" else 0

    @property
    def keys(self) -> Keys:
        """The key names of this deployment: `prefix` and `partitions`."""
        return Keys(self.prefix, self.partitions)

    def with_(self, **changes) -> Settings:
        """A copy with some fields replaced (tests, per-test prefixes)."""
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read every `ENGRAM_*` variable (and `REDIS_URL`) once; raise ConfigError naming a bad one."""
        api_keys: dict[str, str] = {}
        if env.get("ENGRAM_API_KEYS"):
            api_keys.update(parse_api_keys(env["ENGRAM_API_KEYS"]))
        if env.get("ENGRAM_API_KEYS_FILE"):
            path = env["ENGRAM_API_KEYS_FILE"]
            try:
                with open(path, encoding="utf-8") as fh:
                    api_keys.update(parse_api_keys(fh.read(), name="ENGRAM_API_KEYS_FILE"))
            except OSError as exc:
                raise ConfigError(f"ENGRAM_API_KEYS_FILE={path!r} cannot be read: {exc.strerror}") from None
        if env.get("ENGRAM_PREFIX") == "":
            raise ConfigError("ENGRAM_PREFIX='' must be non-empty and contain no whitespace")
        _check_startup_values(env)
        values: dict[str, Any] = {}
        for f in fields(cls):
            variable = f.metadata.get("env")
            raw = env.get(variable) if variable else None
            if raw is not None and raw != "":
                values[f.name] = f.metadata["parse"](raw, variable)
        if values.get("vector_block_size") and values.get("vector_algorithm", "HNSW") != "FLAT":
            raise ConfigError(
                f"ENGRAM_VECTOR_BLOCK_SIZE={values['vector_block_size']} needs ENGRAM_VECTOR_ALGORITHM=FLAT "
                "(RediSearch refuses a block size for HNSW)"
            )
        return cls(
            **values, api_keys=api_keys, metrics_key=_metrics_key(env, api_keys), master_key=_master_key(env)
        )
