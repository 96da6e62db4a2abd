"""The boundary between domain events and their stored form.

Stored form (one stream entry field `e`): msgpack of `{"type": str, "v": int, "data": map}`, `data`
JSON-shaped (timestamps as epoch floats). Decoding applies the class's upcasters (`Event.UPCASTERS`) up
to its `VERSION`, then rebuilds the event through `engram_episodic.validation`, so a stored event obeys
the rules of a fresh one. No pickle: a stream entry is data, never code.

Errors (all `EngramError`): `DecodeError`, `UnknownEventType`, `UnknownSchemaVersion`, `InvalidEpisode`.

Sealed entries (`shared.crypto`): with a master key, an event's personal fields (`SEALED_FIELDS`) move
into `x: {r: key ref (16 bytes), k: key id (16), c: AES-256-GCM of their msgpack}` under the data key of
(namespace, user), with the clear fields as associated data; `data` keeps only `event_id`,
`namespace`, `occurred_at` and `episode_id`. Decoding one needs a key lookup `(ref, kid) -> DataKey |
None`: None is `KeyDestroyed` (the user was forgotten), no lookup `SealedEntry`, a failed
authentication `Unreadable` (a DecodeError).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

from engram_episodic.errors import DecodeError, InvalidEpisode, UnknownEventType, UnknownSchemaVersion
from engram_episodic.events import (
    EVENT_TYPES,
    UPDATABLE,
    ActionRecorded,
    EpisodeCompleted,
    EpisodeForgotten,
    EpisodeStarted,
    EpisodeUpdated,
    Event,
    FactsConsolidated,
    UserForgotten,
)
from engram_episodic.shapes import to_plain
from engram_episodic.validation import Collector, check_id, parse_action, parse_episode, parse_update
from shared import fact_seal, tracing
from shared.crypto import KID_BYTES, REF_BYTES, DataKey, KeyDestroyed, SealedEntry


def encode(event: Event) -> bytes:
    """Serialise an event to its stored envelope (msgpack bytes)."""
    return _pack(event, to_plain(event))


def _pack(event: Event, data: dict[str, Any], **extra: Any) -> bytes:
    """The stored envelope of `event` with payload `data`, and the current span's W3C traceparent under
    `tp` when tracing is on (outside the associated data: not personal; a changed one only mislinks)."""
    envelope = {"type": event.TYPE, "v": event.VERSION, "data": data, **extra}
    tp = tracing.traceparent()
    if tp is not None:
        envelope["tp"] = tp
    return msgpack.packb(envelope, use_bin_type=True)


def _unpacked(payload: bytes | None) -> dict[str, Any]:
    """`unpack`, or {} for no or undecodable bytes."""
    try:
        return unpack(payload) if payload else {}
    except DecodeError:
        return {}


def trace_of(payload: bytes | None) -> str | None:
    """The `tp` (traceparent) a stored envelope carries, or None; never raises."""
    tp = _unpacked(payload).get("tp")
    return tp if isinstance(tp, str) else None


SEALED_FIELDS: dict[str, tuple[str, ...]] = {
    "EpisodeStarted": ("episode",),
    "EpisodeCompleted": ("episode",),
    "ActionRecorded": ("action",),
    "EpisodeUpdated": ("user_id", *UPDATABLE, "clear_expiry"),
    "UserForgotten": ("user_id",),
}
"""The fields a sealed envelope encrypts, per event type; FactsConsolidated seals each fact on its
own (`shared.fact_seal`, `encode_sealed_facts`)."""

KeyLookup = Callable[[bytes, bytes], DataKey | None]


def _seal_ad(type_name: str, version: int, data: Mapping[str, Any], ref: bytes, kid: bytes) -> bytes:
    """The associated data of a sealed envelope: every clear field, so none can be altered or the
    ciphertext moved to another entry."""
    clear = [data.get(name) for name in ("namespace", "episode_id", "event_id", "occurred_at")]
    return msgpack.packb(["engram/event/v1", type_name, version, *clear, ref, kid], use_bin_type=True)


def seal(event: Event, ref: bytes, key: DataKey) -> bytes:
    """The sealed envelope of `event` (module docstring) under data key `key`, referenced by `ref`."""
    data = to_plain(event)
    secret = {name: data.pop(name) for name in SEALED_FIELDS[event.TYPE] if name in data}
    ad = _seal_ad(event.TYPE, event.VERSION, data, ref, key.kid)
    sealed = key.seal(msgpack.packb(secret, use_bin_type=True), ad)
    return _pack(event, data, x={"r": ref, "k": key.kid, "c": sealed})


def _episode_fields(data: Mapping[str, Any], errs: Collector) -> dict[str, Any]:
    episode = parse_episode(data.get("episode"), "episode", errs, require_task=True)
    if episode is not None and episode.episode_id != data.get("episode_id"):
        errs.add("episode.episode_id", "must equal the event's episode_id")
    return {"episode": episode}


def _updated_fields(data: Mapping[str, Any], errs: Collector) -> dict[str, Any]:
    given = {k: data[k] for k in UPDATABLE if data.get(k) is not None}
    if data.get("clear_expiry") is True:
        given["expires_at"] = None  # parse_update's form of clearing it
    changes = parse_update(given, "", errs)
    return {"user_id": check_id(data.get("user_id"), "user_id", errs), **(changes or {})}


def _facts_fields(data: Mapping[str, Any], errs: Collector) -> dict[str, Any]:
    scope, facts, removed = data.get("scope"), data.get("facts", []), data.get("removed", [])
    if (
        not isinstance(scope, Mapping)
        or not isinstance(facts, list | tuple)
        or not isinstance(removed, list | tuple)
    ):
        errs.add("facts", "scope must be a map and facts/removed lists")
        return {}
    return {
        "scope": dict(scope),
        "facts": tuple(dict(f) for f in facts if isinstance(f, Mapping)),
        "removed": tuple(str(r) for r in removed),
    }


_FIELDS: dict[type[Event], Callable[[Mapping[str, Any], Collector], dict[str, Any]]] = {
    EpisodeStarted: _episode_fields,
    EpisodeCompleted: _episode_fields,
    ActionRecorded: lambda data, errs: {"action": parse_action(data.get("action"), "action", errs)},
    EpisodeUpdated: _updated_fields,
    EpisodeForgotten: lambda data, errs: {},
    UserForgotten: lambda data, errs: {
        "user_id": check_id(data.get("user_id"), "user_id", errs, required=True)
    },
    FactsConsolidated: _facts_fields,
}
"""Per event class, the reader of its own fields (beyond `EpisodeEvent`'s) from (untrusted, already
upcast) plain data."""


def event_from_data(type_name: str, data: Mapping[str, Any]) -> Event:
    """Rebuild a current-version event from its (already upcast) plain data; InvalidEpisode if bad."""
    if not isinstance(data, Mapping):
        raise InvalidEpisode([("data", "must be a map")])
    errs = Collector()
    cls = EVENT_TYPES[type_name]
    ids = [f.name for f in dataclasses.fields(cls) if f.name in ("event_id", "namespace", "episode_id")]
    base: dict[str, Any] = {name: check_id(data.get(name), name, errs, required=True) for name in ids}
    occurred = data.get("occurred_at")
    if isinstance(occurred, bool) or not isinstance(occurred, int | float) or occurred != occurred:
        errs.add("occurred_at", "must be epoch seconds")
    base["occurred_at"] = float(occurred) if isinstance(occurred, int | float) else 0.0
    fields = _FIELDS[cls](data, errs)
    errs.raise_if_any()
    return cls(**base, **fields)


def unpack(payload: bytes) -> dict[str, Any]:
    """The envelope map of stored bytes (not yet checked beyond being a map); DecodeError otherwise."""
    return _map(payload, "not a msgpack envelope", "envelope must be a map with type, v and data")


def _map(payload: bytes, undecodable: str, not_a_map: str) -> dict[str, Any]:
    """The msgpack map `payload` holds; DecodeError `undecodable: <msgpack's error>` or `not_a_map`."""
    try:
        out = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises a zoo of types for garbage; all mean "undecodable"
        raise DecodeError(f"{undecodable}: {type(exc).__name__}") from None
    if not isinstance(out, dict):
        raise DecodeError(not_a_map)
    return out


def sealed_ref(envelope: Mapping[str, Any]) -> tuple[bytes, bytes] | None:
    """(key ref, key id) of a sealed envelope, None for a plaintext one; DecodeError if malformed."""
    x = envelope.get("x")
    if x is None:
        return None
    if (
        not isinstance(x, dict)
        or not isinstance(x.get("r"), bytes)
        or not isinstance(x.get("k"), bytes)
        or not isinstance(x.get("c"), bytes)
        or len(x["r"]) != REF_BYTES
        or len(x["k"]) != KID_BYTES
    ):
        raise DecodeError("sealed envelope must hold x: {r: 16 bytes, k: 16 bytes, c: bytes}")
    return x["r"], x["k"]


def key_refs(envelope: Mapping[str, Any]) -> list[tuple[bytes, bytes]]:
    """Every (key ref, key id) decoding `envelope` needs: its own sealed ref, and for a sealed
    `FactsConsolidated` the refs of every fact's shares (`shared.fact_seal`); [] for plaintext.
    DecodeError if malformed."""
    ref = sealed_ref(envelope)
    own = [ref] if ref is not None else []
    if envelope.get("type") == "FactsConsolidated":
        return own + fact_seal.facts_refs(envelope.get("data"))
    return own


def is_sealed(envelope: Mapping[str, Any] | None) -> bool:
    """Whether an unpacked envelope holds sealed content (`x`, or sealed facts); never raises."""
    if not envelope:
        return False
    if "x" in envelope:
        return True
    data = envelope.get("data")
    facts = data.get("facts") if isinstance(data, Mapping) else None
    return isinstance(facts, list | tuple) and any(fact_seal.is_sealed(f) for f in facts)


def encode_sealed_facts(
    event: FactsConsolidated, contributors: Callable[[Mapping[str, Any]], Sequence[tuple[bytes, DataKey]]]
) -> bytes:
    """The stored envelope of `event` with each fact sealed (`shared.fact_seal`) under the data keys
    `contributors(fact)` names (every user of the fact, or the namespace's key when it has none)."""
    data = to_plain(event)  # omits an empty `facts`: a snapshot whose last fact was removed
    scope_id = str(event.scope.get("scope_id", ""))  # FactScope.to_data's, which open_facts reads back
    if data.get("facts"):
        data["facts"] = [
            fact_seal.seal_fact(
                f,
                contributors(f),
                namespace=event.namespace,
                event_id=event.event_id,
                scope_id=scope_id,
                index=i,
            )
            for i, f in enumerate(data["facts"])
        ]
    return _pack(event, data)


def payload_ref(payload: bytes) -> tuple[bytes, bytes] | None:
    """`sealed_ref` of stored bytes; None for plaintext or undecodable bytes (never raises)."""
    try:
        return sealed_ref(_unpacked(payload))
    except DecodeError:
        return None


def occurred_at(payload: bytes) -> float | None:
    """The clear `occurred_at` of stored bytes, sealed or not (None if unreadable); never raises."""
    data = _unpacked(payload).get("data")
    return _epoch(data.get("occurred_at")) if isinstance(data, dict) else None


def _epoch(at: Any) -> float | None:
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None


def decode(payload: bytes, keys: KeyLookup | None = None) -> Event:
    """Stored envelope bytes → current-version event (upcasting older versions in order).

    Raises DecodeError (Unreadable for a sealed payload that fails authentication), UnknownEventType,
    UnknownSchemaVersion or InvalidEpisode; for a sealed envelope also KeyDestroyed (its data key is
    gone) or SealedEntry (no `keys`). Never anything else for any input bytes (fuzzed in
    tests/unit/test_codec.py).
    """
    return decode_envelope(unpack(payload), keys)


def decode_envelope(envelope: dict[str, Any], keys: KeyLookup | None = None) -> Event:
    """`decode` of an already unpacked envelope (the projector unpacks once to collect key refs)."""
    if not {"type", "v", "data"} <= envelope.keys():
        raise DecodeError("envelope must be a map with type, v and data")
    type_name, version, data = envelope["type"], envelope["v"], envelope["data"]
    if not isinstance(type_name, str) or type_name not in EVENT_TYPES:
        raise UnknownEventType(f"unknown event type {str(type_name)[:64]!r}")
    if isinstance(version, bool) or not isinstance(version, int):
        raise DecodeError("envelope version must be an integer")
    current = EVENT_TYPES[type_name].VERSION
    if version < 1 or version > current:
        raise UnknownSchemaVersion(
            f"{type_name} v{version} is not supported (this build reads v1..v{current})"
        )
    if not isinstance(data, dict):
        raise DecodeError("envelope data must be a map")
    ref = sealed_ref(envelope)
    if ref is not None:
        data = _open(type_name, version, data, envelope["x"], keys)
    elif type_name == "FactsConsolidated":
        data = fact_seal.open_facts(data, keys)
    for v in range(version, current):  # every class has an upcaster from each older version
        data = EVENT_TYPES[type_name].UPCASTERS[v](data)
    return event_from_data(type_name, data)


def _open(
    type_name: str, version: int, data: dict[str, Any], x: dict[str, Any], keys: KeyLookup | None
) -> dict:
    if type_name not in SEALED_FIELDS:
        raise DecodeError(f"{type_name} is never sealed")
    if keys is None:
        raise SealedEntry(
            "the entry is encrypted and this process has no master key "
            "(set ENGRAM_MASTER_KEY or ENGRAM_MASTER_KEY_FILE)"
        )
    key = keys(x["r"], x["k"])
    if key is None:
        raise KeyDestroyed("the entry's data key was destroyed (its user or episode was forgotten)")
    plain = key.open(x["c"], _seal_ad(type_name, version, data, x["r"], x["k"]))
    secret = _map(plain, "sealed part is not msgpack", "sealed part must be a map")
    opened = dict(data)
    for name in SEALED_FIELDS[type_name]:  # only the sealed fields: the clear ones are authenticated as AD
        if name in secret:
            opened[name] = secret[name]
    return opened


def peek_identity(payload: bytes) -> tuple[str, str, str | None, float | None] | None:
    """(namespace, episode_id, user_id, occurred_at) of an envelope that may not decode (a dead
    letter), or None when it names no valid episode; never raises. Finds the data a forget must delete."""
    try:
        data = _unpacked(payload).get("data")
        if not isinstance(data, dict):
            return None
        errs = Collector()
        episode = data.get("episode")
        ns = check_id(data.get("namespace"), "namespace", errs, required=True)
        # the envelope's id, else the episode's own (an envelope that lost its top-level id still names it)
        raw_id = data.get("episode_id") or (episode.get("episode_id") if isinstance(episode, dict) else None)
        eid = check_id(raw_id, "episode_id", errs, required=True)
        if ns is None or eid is None:
            return None
        user = check_id(episode.get("user_id"), "user_id", errs) if isinstance(episode, dict) else None
        return ns, eid, user, _epoch(data.get("occurred_at"))
    except Exception:  # a dead letter can be any bytes at all
        return None
