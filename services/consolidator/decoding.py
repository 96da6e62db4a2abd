"""The first stage of a batch: stream entries → events.

Sealed entries (a master key configured, `shared.crypto`): the data keys a batch names are fetched in
one pipeline (`KeyRing.prefetch`), then each entry is opened. An entry whose data key is gone (its user
was forgotten) is `shredded`: acked and deleted, never logged or dead-lettered. An entry that does not
decode is dead with its reason, which for a sealed entry names fields, never their values
(`deadletters.withhold_values`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from engram_episodic.errors import DecodeError, EngramError, InvalidEpisode
from engram_episodic.events import EpisodeCompleted, EpisodeStarted, Event
from services.consolidator.deadletters import withhold_values
from services.consolidator.metrics import WorkerMetrics
from services.consolidator.projection import Folded
from shared import streams
from shared.codec import decode, decode_envelope, is_sealed, key_refs, unpack
from shared.crypto import KeyDestroyed
from shared.embedding_base import Embedder
from shared.keyring import KeyRing

log = logging.getLogger("engram.consolidator")


@dataclass(slots=True)
class BatchResult:
    """Stream ids to ack, entries to dead-letter `(entry, reason)`, newly completed episodes
    `(namespace, fold)`."""

    ok: list[bytes] = field(default_factory=list)
    dead: list[tuple[streams.Entry, str]] = field(default_factory=list)
    completed: list[tuple[str, Folded]] = field(default_factory=list)


def dead_reason(exc: Exception, sealed: bool) -> str:
    """`Type: message`, without quoted values for a sealed entry."""
    reason = f"{type(exc).__name__}: {exc}"
    return withhold_values(reason) if sealed else reason


class Decoder:
    """Opens payloads with `keyring` (None: plaintext stream); an episode's own vector must have the
    dimensions of `embedder` (the index's)."""

    def __init__(
        self, redis: aioredis.Redis, keyring: KeyRing | None, embedder: Embedder, *, metrics: WorkerMetrics
    ):
        self.redis = redis
        self.keyring = keyring
        self.embedder = embedder
        self.metrics = metrics

    def events(
        self,
        entries: Sequence[streams.Entry],
        envelopes: Sequence[dict | None],
        result: BatchResult,
        shredded: list[streams.Entry],
    ) -> Iterator[tuple[streams.Entry, Event, bool]]:
        """(entry, event, sealed) in stream order, each decoded when the one before was applied (a
        forget destroys a key that later entries name); the others go to `result` (`ok`: deleted while
        pending, or shredded; `dead` with a reason) and shredded ones to `shredded` too."""
        for entry, envelope in zip(entries, envelopes, strict=True):
            if entry.payload is None:  # deleted from the stream by a forget while pending
                result.ok.append(entry.stream_id)
                continue
            try:
                if not entry.payload:
                    raise DecodeError(f"the entry has no payload field {streams.FIELD.decode()!r}")
                event = self.decode(entry.payload, envelope)
                self._check_vector(event)
            except KeyDestroyed:  # its user was forgotten: unreadable by design, and nothing to keep
                shredded.append(entry)
                result.ok.append(entry.stream_id)
                self.metrics.events.labels(str((envelope or {}).get("type"))[:32], "shredded").inc()
            except EngramError as exc:
                result.dead.append((entry, dead_reason(exc, is_sealed(envelope))))
                self.metrics.events.labels("unknown", "dead").inc()
            else:
                yield entry, event, is_sealed(envelope)

    async def envelopes(self, payloads: Sequence[bytes | None]) -> list[dict | None]:
        """With a key ring: each payload's envelope (None if it does not unpack), after fetching every
        data key they name in one round trip. Without one: Nones (`decode` reads the payloads)."""
        if self.keyring is None:
            return [None] * len(payloads)
        envelopes: list[dict | None] = []
        wanted: set[tuple[bytes, bytes, str]] = set()
        for payload in payloads:
            envelope = None
            if payload:
                try:
                    envelope = unpack(payload)
                    refs = key_refs(envelope)  # a facts snapshot names a key per contributor
                except DecodeError:
                    envelope, refs = None, []
                data = envelope.get("data") if envelope is not None else None
                namespace = data.get("namespace") if isinstance(data, dict) else None
                if isinstance(namespace, str):  # else: decoding names the error
                    wanted.update((*ref, namespace) for ref in refs)
            envelopes.append(envelope)
        if wanted:
            await self.keyring.prefetch(self.redis, wanted)
        return envelopes

    def decode(self, payload: bytes, envelope: dict | None) -> Event:
        """One event; raises as `shared.codec.decode` does."""
        lookup = self.keyring.lookup if self.keyring is not None else None
        return decode_envelope(envelope, lookup) if envelope is not None else decode(payload, lookup)

    async def stored(self, payloads: Sequence[bytes]) -> list[Event]:
        """An episode's stored events (its event hash) that can be read: shredded ones are skipped
        silently, undecodable ones with a warning that names no content."""
        out = []
        for payload, envelope in zip(payloads, await self.envelopes(payloads), strict=True):
            try:
                out.append(self.decode(payload, envelope))
            except KeyDestroyed:
                continue
            except EngramError:  # validated when recorded; a build that cannot read it skips it
                log.warning("skipping undecodable stored event of an episode")
        return out

    def _check_vector(self, event: Event) -> None:
        if not isinstance(event, EpisodeStarted | EpisodeCompleted):
            return
        episode = event.episode
        if episode.vector is not None and len(episode.vector) != self.embedder.dim:
            raise InvalidEpisode(
                [
                    (
                        "episode.vector",
                        f"has {len(episode.vector)} dimensions; the index "
                        f"({self.embedder.name}) expects {self.embedder.dim}",
                    )
                ]
            )
