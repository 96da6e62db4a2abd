"""The only place that builds Redis key names.

Every key starts with the prefix (`ENGRAM_PREFIX`). User-supplied ids never appear raw in a key: a
document key holds a 128-bit BLAKE2b digest of `(namespace, id)`, so no id can name another's key and
the same id in two namespaces is two documents. Projections live under a generation (`g1`, `g2`, ...):
a replay builds the next beside the live one and swaps the index alias; the stream, dead letters,
tombstones and meta keys are generation-independent.

**Cluster-ready.** Every key of one namespace carries its hash tag (`ns_tag`), after the kind of key
(`<prefix>g1:ep:{tag}:<digest>`, so index prefixes still match): every script is single-slot
(tests/integration/test_key_slots.py). Global keys (dead letters, meta, aliases, the deployment key,
a one-partition stream) carry none.

**Stream partitions.** The episode stream is P streams: P = 1 is `<prefix>stream:episodes`; with P > 1
partition i is `<prefix>stream:episodes:{<tag i>}`, its tag chosen (`partition_tag`) so its slot falls
in the i-th of P equal slices of the 16384 slots (even spread over evenly split primaries). A
namespace's events all go to one partition (`partition_of`), in publish order. What a publish script
checks lives in the partition's slot: the encrypted marker and, with P > 1, the users' data keys.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot


@functools.lru_cache(maxsize=8192)  # an episode's four keys share one digest; scopes repeat every batch
def digest(*parts: str) -> str:
    """32 hex chars identifying the tuple `parts` (joined by NUL, which ids cannot contain)."""
    return hashlib.blake2b("\x00".join(parts).encode(), digest_size=16).hexdigest()


@functools.lru_cache(maxsize=8192)
def ns_tag(namespace: str) -> str:
    """The hash tag of `namespace`'s keys: `{` + 12 hex chars + `}` (a digest, so that any namespace
    string, braces included, is safe inside the tag; two namespaces sharing a tag only share a slot)."""
    return "{" + digest("slot", namespace)[:12] + "}"


MAX_PARTITIONS = 256
"""Upper bound of `ENGRAM_STREAM_PARTITIONS` (each worker lane visits every partition in turn)."""
CLUSTER_PARTITIONS = 16
"""Default partitions on a Redis Cluster: room for 16 primaries, 16 cheap XREADGROUPs per lane sweep."""


@functools.lru_cache(maxsize=MAX_PARTITIONS * 4)
def partition_tag(index: int, partitions: int) -> str:
    """The hash tag (`{p<i>.<n>}`) of partition `index` of `partitions`: the first n whose CRC16
    slot lies in [index, index + 1) * 16384 / P (deterministic across processes)."""
    lo = index * REDIS_CLUSTER_HASH_SLOTS // partitions
    hi = (index + 1) * REDIS_CLUSTER_HASH_SLOTS // partitions
    n = 0
    while True:  # about 16384 / (hi - lo) tries: at most ~64 for P = 256
        tag = f"{{p{index}.{n}}}"
        if lo <= key_slot(tag.encode()) < hi:
            return tag
        n += 1


@functools.lru_cache(maxsize=8192)
def partition_of(namespace: str, partitions: int) -> int:
    """The partition (0 <= i < P) of `namespace`'s events: a BLAKE2b digest of the namespace, modulo
    P. Stable across processes and releases (not Python's salted `hash`)."""
    if partitions == 1:
        return 0
    return int(digest("partition", namespace)[:16], 16) % partitions


def _named(suffix: str, doc: str) -> Any:
    """A key of the deployment's own (no namespace, no generation): the prefix, then `suffix`."""
    return property(lambda self: self.prefix + suffix, doc=doc)


def _of_id(kind: str, doc: str) -> Any:
    """The key of one id (a user's, an agent's, an episode's...) of a namespace: `<prefix><kind>:<tag>:<digest>`."""

    def key(self: Keys, namespace: str, ident: str) -> str:
        return f"{self.prefix}{kind}:{ns_tag(namespace)}:{digest(namespace, ident)}"

    key.__doc__ = doc
    return key


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one prefix. Methods return `str` keys; `gen` is a projection generation;
    `partitions` is the number of stream partitions P (1: the single stream `<prefix>stream:episodes`)."""

    prefix: str = "engram:"
    partitions: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ValueError(f"partitions must be in 1..{MAX_PARTITIONS}, not {self.partitions}")

    # --- generation-independent -------------------------------------------------------------
    @property
    def stream(self) -> str:
        """The episode event stream of a deployment with one partition (ValueError with more: a
        caller must name the namespace's partition, `stream_of`, or go over `streams`)."""
        if self.partitions != 1:
            raise ValueError("a partitioned stream has no single key: use stream_of(namespace) or streams")
        return f"{self.prefix}stream:episodes"

    def partition_stream(self, index: int) -> str:
        """Partition `index` (0 <= index < P) of the episode stream (source of truth)."""
        if self.partitions == 1:
            return f"{self.prefix}stream:episodes"
        return f"{self.prefix}stream:episodes:{partition_tag(index, self.partitions)}"

    @property
    def streams(self) -> tuple[str, ...]:
        """Every partition of the episode stream, in partition order."""
        return tuple(self.partition_stream(i) for i in range(self.partitions))

    def partition(self, namespace: str) -> int:
        """`namespace`'s partition index (`partition_of`)."""
        return partition_of(namespace, self.partitions)

    def stream_of(self, namespace: str) -> str:
        """The partition stream that carries every event of `namespace`."""
        return self.partition_stream(self.partition(namespace))

    def stream_compaction(self, stream: str) -> str:
        """`stream`'s copy while `erasure.compact` rewrites it, in the stream's slot: after a
        partition's tag, or with the untagged stream's whole name as its tag."""
        if "{" in stream:
            return f"{stream}:compacting"
        return f"{self.prefix}compacting:{{{stream}}}"

    def encrypted_marker(self, index: int) -> str:
        """What a plaintext publish to partition `index` checks, to be refused on an encrypted
        deployment: the deployment key with one partition, else a marker in the partition's slot."""
        if self.partitions == 1:
            return self.deployment_key
        return f"{self.prefix}keys:encrypted:{partition_tag(index, self.partitions)}"

    dead_letters = _named("stream:dead", "Entries the consolidator could not process, with their reason.")
    meta = _named("meta", "Hash: `generation`, and per generation the embedder its index was built with.")
    episode_index_alias = _named("idx:episodes", "The alias queries use: at the live generation's index.")
    facts_index_alias = _named("idx:facts", "The alias fact queries use.")

    tombstone = _of_id("tomb", "Marks a forgotten episode so late or replayed events never resurrect it.")

    def tombstone_of(self, namespace: str, episode_digest: str) -> str:
        """`tombstone` of an episode known by its `digest(namespace, episode_id)` only (a bulk forget's
        job record keeps digests, not ids)."""
        return f"{self.prefix}tomb:{ns_tag(namespace)}:{episode_digest}"

    dead_letter_refs = _of_id("deadref", "Hash {stream id: dead-letter id} of an episode's dead letters.")
    user_dead_letters = _of_id("deaduser", "Set of a user's episode ids with dead-lettered events.")
    user_tombstone = _of_id("utomb", "Epoch seconds at which a user was forgotten; older events are ignored.")
    agent_tombstone = _of_id(
        "atomb", "Epoch seconds at which an agent was forgotten: no episode of it begun before is written."
    )
    session_tombstone = _of_id("stomb", "`agent_tombstone` for a session (`DELETE /v1/sessions/{id}`).")

    def scope_tombstones(
        self, namespace: str, user_id: str | None, agent_id: str | None, session_id: str | None
    ) -> list[str]:
        """The forget times that apply to an episode of these ids: its user's, agent's and session's
        tombstones (for an id it lacks, the key of no id, never set)."""
        none = "\x00none"
        return [
            self.user_tombstone(namespace, user_id or none),
            self.agent_tombstone(namespace, agent_id or none),
            self.session_tombstone(namespace, session_id or none),
        ]

    deployment_key = _named(
        "keys:deployment", "Hash {k, w, t}: the deployment secret, wrapped (shared.crypto)."
    )
    cursor_secret = _named("keys:cursors", "String: the 32 random bytes that sign listing cursors.")
    data_key_prefix = _named("dek:", "What every `data_key` starts with.")
    expiry_lock = _named("lock:expiry", "Held (SET NX PX) by the worker sweeping expired episodes.")
    sweep_lock = _named("lock:sweep", "Held (SET NX PX) by the worker sweeping dead generations.")
    erasure_lock = _named("lock:erasure", "Held (SET NX PX) by the worker running the erasure pass.")

    def forget_job(self, job_id: str) -> str:
        """Hash (with a TTL): a bulk forget's status record (services.query.views.forgetting)."""
        return f"{self.prefix}forgetjob:{job_id}"

    def data_key(self, ref: bytes, namespace: str | None = None) -> str:
        """Hash {k: key id, w: the wrapped data key, t: creation ms} of the key reference `ref` (an HMAC
        of (namespace, user), shared.crypto): deleting it shreds the user. With P > 1 it carries the tag of
        `namespace`'s partition (`<prefix>dek:{p3.17}:<ref hex>`); ValueError without `namespace` then."""
        if self.partitions == 1:
            return f"{self.data_key_prefix}{ref.hex()}"
        if namespace is None:
            raise ValueError("a partitioned deployment's data key needs its namespace")
        return (
            f"{self.data_key_prefix}{partition_tag(self.partition(namespace), self.partitions)}:{ref.hex()}"
        )

    def data_key_ref(self, name: str) -> bytes:
        """The key reference `ref` of a `data_key` name, in either form."""
        return bytes.fromhex(name[len(self.data_key_prefix) :].rsplit(":", 1)[-1])

    def scope_counter(self, namespace: str, scope_id: str) -> str:
        """Hash {completed, importance} since the scope's last consolidation (facts trigger)."""
        return f"{self.prefix}trigger:{ns_tag(namespace)}:{scope_id}"

    def facts_recent(self, namespace: str, scope_id: str) -> str:
        """Set (with a TTL of the facts interval) when a worker starts a background run of the scope,
        so that the other workers' triggers wait for the interval too."""
        return f"{self.prefix}factsrecent:{ns_tag(namespace)}:{scope_id}"

    def consolidation_lock(self, namespace: str, scope_id: str) -> str:
        return f"{self.prefix}lock:consolidate:{ns_tag(namespace)}:{scope_id}"

    # --- per generation -----------------------------------------------------------------------
    def gen_prefix(self, gen: int) -> str:
        return f"{self.prefix}g{gen}:"

    def episode_index(self, gen: int) -> str:
        return f"{self.prefix}idx:episodes:g{gen}"

    def facts_index(self, gen: int) -> str:
        return f"{self.prefix}idx:facts:g{gen}"

    def episode_doc_prefix(self, gen: int) -> str:
        return f"{self.gen_prefix(gen)}ep:"

    def episode_doc(self, gen: int, namespace: str, episode_id: str) -> str:
        """Hash: the episode's indexed fields, its full JSON and its vector."""
        return self.episode_doc_of(gen, namespace, digest(namespace, episode_id))

    def episode_doc_of(self, gen: int, namespace: str, episode_digest: str) -> str:
        """`episode_doc` of an episode known by its `digest(namespace, episode_id)` only (a forget job's)."""
        return f"{self.episode_doc_prefix(gen)}{ns_tag(namespace)}:{episode_digest}"

    def episode_events(self, gen: int, namespace: str, episode_id: str) -> str:
        """Hash event_id → encoded event: the episode's own log, folded into the document."""
        return f"{self.gen_prefix(gen)}evs:{ns_tag(namespace)}:{digest(namespace, episode_id)}"

    def episode_stream_ids(self, gen: int, namespace: str, episode_id: str) -> str:
        """Set of stream entry ids that carry this episode's data (deleted on forget)."""
        return self.episode_stream_ids_of(gen, f"{ns_tag(namespace)}:{digest(namespace, episode_id)}")

    def episode_stream_ids_of(self, gen: int, episode_tail: str) -> str:
        """`episode_stream_ids` of an episode known by the tail of its `episode_events` key
        (`<namespace tag>:<digest>`, what follows `evs:`)."""
        return f"{self.gen_prefix(gen)}sids:{episode_tail}"

    def fact_doc_prefix(self, gen: int) -> str:
        return f"{self.gen_prefix(gen)}fact:"

    def fact_doc(self, gen: int, namespace: str, fact_id: str) -> str:
        return f"{self.fact_doc_prefix(gen)}{ns_tag(namespace)}:{fact_id}"

    def fact_scope(self, gen: int, namespace: str, scope_id: str) -> str:
        """Hash: the facts projection state of one scope (applied `seq`, fact `ids`, snapshot `sids`)."""
        return f"{self.gen_prefix(gen)}factscope:{ns_tag(namespace)}:{scope_id}"

    def fact_scope_pattern(self, gen: int) -> str:
        """SCAN pattern of every scope state of generation `gen`."""
        return f"{self.gen_prefix(gen)}factscope:*"
