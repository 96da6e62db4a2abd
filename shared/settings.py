"""Configuration, read once from the environment and passed down.

`Settings.from_env(os.environ)` is called in each entry point (`__main__`), never at import time.
A malformed value raises `ConfigError` naming the variable, e.g.
`ENGRAM_HALF_LIFE='abc' is not a duration (use 3600, 90s, 30m, 12h, 1d or 1w)`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from engram_episodic.errors import ConfigError
from engram_episodic.validation import Collector, check_id
from shared.keys import MAX_PARTITIONS, Keys
from shared.redis_conn import check_url

CLUSTER_PARTITIONS = 16
"""The default number of stream partitions on a Redis Cluster: room for 16 primaries before a
partition has to be moved (docs/scaling.md, Ingest partitions), while each worker lane's sweep of every
partition stays 16 cheap XREADGROUPs."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


def parse_duration(text: str, *, name: str = "duration") -> float:
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


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
"""`ENGRAM_LOG_FORMAT` (shared.logs)."""


def _check_startup_values(env: Mapping[str, str]) -> None:
    """Values that, accepted here, would fail later, in one process or in every request: a traceback
    from `logging`/`connect()`, or a stack whose default namespace is empty (every ingest 422, every
    recall 500)."""
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
        except ValueError:
            raise ConfigError(
                f"REDIS_URL={url[:60]!r} must start with redis://, rediss://, unix://, redis+cluster:// "
                "or rediss+cluster://"
            ) from None
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
    """`ENGRAM_METRICS_KEY`: the one key that reads the query service's /metrics when API keys are set.

    A tenant's key must not be it (a tenant would read every namespace's traffic); it must be sendable as
    a Bearer token (visible ASCII, no spaces), and its value is never echoed in the error.
    """
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
    """Parse `key1=namespace1,key2=namespace2` (commas or newlines) into {key: namespace}.

    Blank lines and `#` comments are ignored (so the same format works for a keys file).
    Raises ConfigError naming `name` on an entry without `=`, an empty key or namespace, a namespace
    that every write would refuse (`engram_episodic.validation.check_id`: control characters, over 256
    characters; the service would start and answer each write with a 422 naming a field the request
    does not have), or a key listed twice. The message names the entry by its position, never the key.
    """
    keys: dict[str, str] = {}
    for raw in re.split(r"[,\n]", text):
        # blanks around an entry are layout; anything else at a namespace's ends is refused below (a
        # `str.strip()` removed \x1f or a no-break space too, so "k=acme\x1f" silently opened "acme")
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


def integer(lo: int, hi: int) -> Parse:
    """An int in [lo, hi]; ConfigError naming the variable otherwise."""

    def parse(raw: str, name: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not an integer") from None
        if not lo <= value <= hi:
            raise ConfigError(f"{name}={raw!r} must be between {lo} and {hi}")
        return value

    return parse


def number(lo: float, hi: float) -> Parse:
    """A finite float in [lo, hi]; ConfigError naming the variable otherwise."""

    def parse(raw: str, name: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise ConfigError(f"{name}={raw!r} must be between {lo} and {hi}")
        return value

    return parse


def duration(raw: str, name: str) -> float:
    return parse_duration(raw, name=name)


def duration_or_off(raw: str, name: str) -> float | None:
    """A duration, or None for `off` / `none`."""
    return None if raw.strip().lower() in ("off", "none") else parse_duration(raw, name=name)


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
    """A Settings field read from `variable`, declared once (its default, its parser, its name) and read
    by `Settings.from_env` (unset or empty: the default). docs/configuration.md lists every variable
    (tests/unit/test_docs_configuration.py keeps it complete)."""
    return field(default=default, metadata={"env": variable, "parse": parse})


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every tunable of Engram. Times are seconds; see docs/configuration.md for the table.

    Each field read from the environment is declared once, with `env(VARIABLE, default, parser)`;
    `from_env` reads them all. Fields with a plain default are tuned constants, not operator questions:
    the reason for each value is beside it; tests and benchmarks set them in code. The API keys, the master key and the metrics key are read by hand (files,
    mutual exclusion, secrets never echoed)."""

    redis_url: str | None = env("REDIS_URL", None)
    """`REDIS_URL`; None means 'start/use the embedded Redis' (dev, tests, make run)."""
    prefix: str = env("ENGRAM_PREFIX", "engram:", prefix_text)
    """`ENGRAM_PREFIX`: every key Engram writes starts with it (tests use one per test)."""
    stream_partitions: int | None = env("ENGRAM_STREAM_PARTITIONS", None, integer(1, MAX_PARTITIONS))
    """`ENGRAM_STREAM_PARTITIONS`: the number P of episode stream partitions (`shared.keys`); None
    (unset) = 1 on a single Redis, 16 on a cluster. Recorded
    in the deployment's meta at first start; another value is refused (`shared.partitions`)."""
    cluster_search: str = env("ENGRAM_CLUSTER_SEARCH", "shard", choice("shard", "coordinator"))
    """`ENGRAM_CLUSTER_SEARCH`, with a `redis+cluster://` REDIS_URL: `shard` (an index per primary,
    queries routed to the namespace's primary) or `coordinator` (Redis 8's FT.SEARCH fans out);
    `shared.cluster`."""

    # embedding
    embedder: str = env("ENGRAM_EMBEDDER", "auto", choice("auto", "hashing", "minilm", "mpnet", "openai"))
    embed_dim: int = env("ENGRAM_EMBED_DIM", 384, integer(8, 8192))
    embed_batch_size: int = 64
    """Texts per forward pass; larger calls are sorted by length first. 64 keeps padding low on CPU (a
    256-text call embeds ~50% faster than 64 ones only because it is sorted)."""
    embed_max_chars: int = 2000
    """Characters of an episode's text that are embedded (the model's 256-384 word-piece window holds ~2,000;
    the stored text stays whole)."""
    embed_threads: int = env("ENGRAM_EMBED_THREADS", 2, integer(1, 256))
    """`ENGRAM_EMBED_THREADS`: inference threads of the model (minilm, mpnet), per process."""
    model_cache: str | None = env("ENGRAM_MODEL_CACHE", None)
    """`ENGRAM_MODEL_CACHE`: where mpnet's archive is unpacked and the models' exported graphs are kept;
    None = ~/.cache/engram."""
    openai_url: str | None = env("ENGRAM_OPENAI_URL", None)
    openai_model: str = env("ENGRAM_OPENAI_MODEL", "text-embedding-3-small")
    openai_api_key: str | None = env("ENGRAM_OPENAI_API_KEY", None)
    openai_timeout: float = 30.0
    """Seconds one embeddings request may take before it is retried (up to 3 times)."""

    # index
    vector_algorithm: str = env("ENGRAM_VECTOR_ALGORITHM", "HNSW", choice("HNSW", "FLAT"))
    hnsw_m: int = 16
    """HNSW graph degree (RediSearch's default)."""
    hnsw_ef_construction: int = 200
    """HNSW build beam. 100 halves Redis's CPU per insert at the same recall@10/@100, but inserts are ~2% of
    an ingest's CPU, so the module's default stays."""
    hnsw_ef_runtime: int = 100
    """HNSW search beam: at 100,000 documents 100 gives recall@10 0.985 in 0.71 ms; the module's 10 gave
    0.648 (docs/benchmarks.md, HNSW)."""
    vector_block_size: int = env("ENGRAM_VECTOR_BLOCK_SIZE", 0, integer(0, 1_048_576))
    """`ENGRAM_VECTOR_BLOCK_SIZE`, with `ENGRAM_VECTOR_ALGORITHM=FLAT`: vectors per allocation of the
    episode index (0 = the module's 1,024). Its first vector allocates a whole block (1.5 MB at 384
    dims), which is what one index per namespace pays on a shard-local cluster
    (docs/scaling.md, How many namespaces); RediSearch 2.10 refuses it for HNSW."""

    # consolidator
    consumer_group: str = "consolidator"
    """The consolidator's consumer group on the episode stream; `prefix` separates deployments."""
    consumer_name: str | None = env("ENGRAM_CONSUMER_NAME", None)
    batch_size: int = 256
    """Stream entries one lane reads at a time: 256 lets a model embed whole sorted batches; 128 and 512
    measured within noise."""
    in_flight: int = 4
    """Batches one worker projects concurrently, so Redis writes one while the worker decodes and folds the
    next; 8 lanes measured no better than 4."""
    block_ms: int = 1000
    """Milliseconds an idle lane blocks in XREADGROUP (tests use 50 ms)."""
    lease_ms: int = env("ENGRAM_LEASE_MS", 30_000, integer(10, 3_600_000))
    max_deliveries: int = env("ENGRAM_MAX_DELIVERIES", 5, integer(1, 1000))
    short_term_window: int = env("ENGRAM_SHORT_TERM_WINDOW", 5, integer(1, 1000))
    metrics_port: int = env("ENGRAM_METRICS_PORT", 9191, integer(0, 65535))
    """`ENGRAM_METRICS_PORT`: the consolidator's `/healthz` and `/metrics` (services.consolidator.health);
    0 = none. One port per process (`make run` gives worker i this port + i)."""
    health_stall: float = 120.0
    """Seconds a consolidator lane may go without coming round its loop before `/healthz` answers 503
    `stuck`; a forward pass of a whole batch takes well under a minute on 2 cores."""

    # recall defaults
    recall_mode: str = env("ENGRAM_RECALL_MODE", "hybrid", choice("vector", "keyword", "hybrid"))
    """`ENGRAM_RECALL_MODE`: vector | keyword | hybrid, when a request names none (docs/benchmarks.md)."""
    recall_candidates: int = 100
    """Hits each candidate list (KNN, BM25, and the recency / reward / importance lists that carry weight)
    contributes to the pool a recall re-ranks; a request may ask for another depth (`candidates`).
    Independent of `top_k`, so recall is prefix-stable in `top_k`. On LoCoMo 30, 50 and 100 gave the same
    R@5."""
    idf_cache_ttl: float | None = 30.0
    """Seconds the query service remembers how many episodes of a namespace hold a query word (keyword
    relevance's idf, `services.query.sizes.ScopeSizes.term_counts`); a common word's count 10x this. At a
    million episodes a first-seen common word costs 30-100 ms of Redis to count; a few seconds of lag
    moves its idf by < 4e-4. None = count every time (tests)."""
    bm25_common_idf: float = 0.02
    """Query words whose idf is below this leave the BM25 candidate query (scoring keeps them;
    `shared.relevance.common_terms`). Only namespaces holding more than ~4,950 episodes have such words,
    so smaller ones rank exactly as with 0."""
    query_cache: int = env("ENGRAM_QUERY_CACHE", 4096, integer(0, 1_000_000))
    """`ENGRAM_QUERY_CACHE`: query embeddings the query service remembers (LRU by text); 0 = off."""
    query_batch: int = 32
    """Concurrent query embeddings share one forward pass of up to this many texts
    (`shared.query_vectors.QueryBatcher`: no waiting window): at 8 clients with mpnet, 2.7x the
    recalls/s of a pass per query."""
    half_life: float = env("ENGRAM_HALF_LIFE", 86400.0, duration)
    default_top_k: int = env("ENGRAM_DEFAULT_TOP_K", 3, integer(1, 100))

    # query service
    host: str = env("ENGRAM_HOST", "127.0.0.1")
    port: int = env("ENGRAM_PORT", 8080, integer(1, 65535))
    api_keys: dict[str, str] = field(default_factory=dict)
    """`ENGRAM_API_KEYS` and `ENGRAM_API_KEYS_FILE` (read by `from_env`): {key: namespace}."""
    metrics_key: str | None = None
    """`ENGRAM_METRICS_KEY`: with API keys set, the only key that reads /metrics (tenant keys get 403)."""
    default_namespace: str = env("ENGRAM_DEFAULT_NAMESPACE", "default")
    max_body_bytes: int = env("ENGRAM_MAX_BODY_BYTES", 4 * 1024 * 1024, integer(1024, 1 << 30))
    body_timeout: float = 60.0
    """Seconds a request body may take to arrive once its headers did (408 after)."""

    # SDK / publishing
    publish_timeout: float = 5.0
    """Seconds one publish of the query service's ingest may take before it is retried."""
    publish_retries: int = 100
    """Retries of a publish that met a Redis fault (with backoff) before ingest answers 503."""

    # facts (semantic memory)
    facts_every: int = 20
    """A scope is re-consolidated after this many newly completed episodes."""
    facts_importance_threshold: float = 150.0
    """... or when their summed importance reaches this (Generative Agents' reflection trigger, Park et al.
    2023: 150)."""
    facts_min_cluster: int = env("ENGRAM_FACTS_MIN_CLUSTER", 3, integer(2, 10_000))
    facts_distance: float | None = env("ENGRAM_FACTS_DISTANCE", None, number(0.01, 1.99))
    """`ENGRAM_FACTS_DISTANCE`: the clustering threshold; None (unset) = the default calibrated for the
    index's embedder (`services.consolidator.facts_plan.DEFAULT_DISTANCE`)."""
    facts_min_interval: float = 10.0
    """A worker re-consolidates one scope at most this often (seconds): clustering is ~60 ms of CPU per run."""
    facts_max_episodes: int = 2000
    """A scope's consolidation reads at most its newest this many episodes (clustering is O(n^2) in memory)."""
    summarizer_url: str | None = env("ENGRAM_SUMMARIZER_URL", None)
    summarizer_model: str = env("ENGRAM_SUMMARIZER_MODEL", "gpt-4o-mini")
    summarizer_api_key: str | None = env("ENGRAM_SUMMARIZER_API_KEY", None)
    summarizer_timeout: float = 20.0
    """Seconds one summarizer call may take; a fact keeps its template text when it fails."""
    summarizer_max_chars: int = 600
    """A summarised fact is clipped to this many characters."""

    # backpressure and retention
    max_lag: int = env("ENGRAM_MAX_LAG", 100_000, integer(1, 1 << 40))
    max_clock_skew: float = env("ENGRAM_MAX_CLOCK_SKEW", 300.0, duration)
    """`ENGRAM_MAX_CLOCK_SKEW`: how far in the future an ingested instant may lie (seconds; HTTP edge)."""
    stream_retention: float | None = env("ENGRAM_STREAM_RETENTION", 7 * 86400.0, duration_or_off)
    """`ENGRAM_STREAM_RETENTION`: acked entries older than this are trimmed; `off` keeps everything."""
    retention_interval: float = 60.0
    """How often (seconds) a worker trims acked stream entries older than `stream_retention`."""
    expiry_interval: float = 60.0
    """How often (seconds) one worker erases the episodes past their `expires_at` (reads hide them at once;
    services.consolidator.expiry)."""

    # erasure (docs/reliability.md, "Erasure")
    master_key: bytes | None = field(default=None, repr=False)
    """`ENGRAM_MASTER_KEY` (base64 of 32 bytes) or `ENGRAM_MASTER_KEY_FILE` (a file holding that text):
    with a key, stream payloads are sealed per user (shared.crypto); None = plaintext (tests' default).
    Never logged, never sent to Redis."""
    erasure_interval: float | None = env("ENGRAM_ERASURE_INTERVAL", 600.0, duration_or_off)
    """`ENGRAM_ERASURE_INTERVAL`: after forgets, the stream is compacted and the AOF rewritten
    (services.consolidator.erasure) at most this often; `off` never (then run `engram-admin
    erase-now`)."""

    @property
    def partitions(self) -> int:
        """`stream_partitions`, or its default for the topology of `redis_url`."""
        if self.stream_partitions is not None:
            return self.stream_partitions
        url = self.redis_url or ""
        return CLUSTER_PARTITIONS if url.startswith(("redis+cluster://", "rediss+cluster://")) else 1

    @property
    def graph_ef(self) -> int:
        """`hnsw_ef_runtime` when the index is HNSW, else 0: what a KNN that may walk the graph is told,
        to widen its beam when duplicate vectors crowd it (`shared.hybrid.widened_ef`)."""
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
