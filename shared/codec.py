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

Sealed facts (`encode_sealed_facts`): a fact of a `FactsConsolidated` mixes several users' episodes,
so destroying any one contributor's key must make it unreadable: each fact is sealed with a fresh
content key K, the XOR of one random 32-byte share per contributor (n-of-n secret sharing: any share
missing leaves K uniformly random), each share sealed under its contributor's data key (AES-256-GCM).
A fact with no user has one share under the namespace's key.

Stored form of one fact: `{"z": {"s": [[ref (16), kid (16), sealed share], ...], "c": sealed msgpack of
the fact}}`; associated data binds each ciphertext to (namespace, event id, scope id, position) and a
share's to its (ref, kid). The event's `scope` and `removed` stay in clear (routing, sequence check).

Its errors: `KeyDestroyed` (a contributor was forgotten), `SealedEntry` (no key lookup), `Unreadable`
(authentication failed), `DecodeError` (malformed).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from functools import reduce
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
from shared import tracing
from shared.crypto import KEY_BYTES, KID_BYTES, REF_BYTES, DataKey, KeyDestroyed, SealedEntry


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
own (`encode_sealed_facts`)."""

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
    `FactsConsolidated` the refs of every fact's shares (`share_refs`); [] for plaintext.
    DecodeError if malformed."""
    ref = sealed_ref(envelope)
    own = [ref] if ref is not None else []
    if envelope.get("type") == "FactsConsolidated":
        return own + facts_refs(envelope.get("data"))
    return own


def is_sealed(envelope: Mapping[str, Any] | None) -> bool:
    """Whether an unpacked envelope holds sealed content (`x`, or sealed facts); never raises."""
    if not envelope:
        return False
    if "x" in envelope:
        return True
    data = envelope.get("data")
    facts = data.get("facts") if isinstance(data, Mapping) else None
    return isinstance(facts, list | tuple) and any(_fact_sealed(f) for f in facts)


def encode_sealed_facts(
    event: FactsConsolidated, contributors: Callable[[Mapping[str, Any]], Sequence[tuple[bytes, DataKey]]]
) -> bytes:
    """The stored envelope of `event` with each fact sealed (`seal_fact`) under the data keys
    `contributors(fact)` names (every user of the fact, or the namespace's key when it has none)."""
    data = to_plain(event)  # omits an empty `facts`: a snapshot whose last fact was removed
    scope_id = str(event.scope.get("scope_id", ""))  # FactScope.to_data's, which open_facts reads back
    if data.get("facts"):
        data["facts"] = [
            seal_fact(
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
        data = open_facts(data, keys)
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


# --- sealed facts ---------------------------------------------------------------------------------
SEALED_KEY = "z"
"""The key of a sealed fact (a plaintext fact is the fact's own map, which has no such key)."""

_NO_KID = b"\x00" * KID_BYTES  # a content key has no id of its own: it lives only in this entry


def _fact_ad(
    namespace: str, event_id: str, scope_id: str, index: int, share: tuple[bytes, bytes] | None
) -> bytes:
    return msgpack.packb(
        ["engram/fact/v1", namespace, event_id, scope_id, index, *(share or ())], use_bin_type=True
    )


def _xor(parts: Sequence[bytes]) -> bytes:
    return reduce(lambda a, b: bytes(x ^ y for x, y in zip(a, b, strict=True)), parts, bytes(KEY_BYTES))


def seal_fact(
    fact: Mapping[str, Any],
    contributors: Sequence[tuple[bytes, DataKey]],
    *,
    namespace: str,
    event_id: str,
    scope_id: str,
    index: int,
) -> dict[str, Any]:
    """The sealed form of `fact` (plain data) needing every (ref, data key) of `contributors` (≥ 1)."""
    if not contributors:
        raise ValueError("a sealed fact needs at least one contributor key")
    shares = [os.urandom(KEY_BYTES) for _ in contributors]
    content = DataKey.from_bytes(_NO_KID, _xor(shares))
    sealed_shares = [
        [ref, key.kid, key.seal(share, _fact_ad(namespace, event_id, scope_id, index, (ref, key.kid)))]
        for (ref, key), share in zip(contributors, shares, strict=True)
    ]
    body = content.seal(
        msgpack.packb(dict(fact), use_bin_type=True), _fact_ad(namespace, event_id, scope_id, index, None)
    )
    return {SEALED_KEY: {"s": sealed_shares, "c": body}}


def _fact_sealed(fact: Any) -> bool:
    return isinstance(fact, Mapping) and SEALED_KEY in fact


def share_refs(fact: Mapping[str, Any]) -> list[tuple[bytes, bytes]]:
    """(ref, kid) of every share of a sealed fact; DecodeError if malformed."""
    z = fact.get(SEALED_KEY)
    if not isinstance(z, Mapping) or not isinstance(z.get("s"), list) or not isinstance(z.get("c"), bytes):
        raise DecodeError("a sealed fact must hold z: {s: [[ref, kid, share], ...], c: bytes}")
    out = []
    for share in z["s"]:
        if (
            not isinstance(share, list)
            or len(share) != 3
            or not all(isinstance(p, bytes) for p in share)
            or len(share[0]) != REF_BYTES
            or len(share[1]) != KID_BYTES
        ):
            raise DecodeError("a sealed fact's share must be [ref (16 bytes), kid (16 bytes), bytes]")
        out.append((share[0], share[1]))
    if not out:
        raise DecodeError("a sealed fact has no share")
    return out


def open_fact(
    fact: Mapping[str, Any],
    keys: KeyLookup | None,
    *,
    namespace: str,
    event_id: str,
    scope_id: str,
    index: int,
) -> dict[str, Any]:
    """The plain fact of `seal_fact(...)` (see the module docstring for the errors)."""
    refs = share_refs(fact)
    if keys is None:
        raise SealedEntry("the facts are encrypted and this process has no master key")
    shares = []
    for (ref, kid), share in zip(refs, fact[SEALED_KEY]["s"], strict=True):
        key = keys(ref, kid)
        if key is None:
            raise KeyDestroyed("a data key of the fact's contributors was destroyed (a user was forgotten)")
        shares.append(key.open(share[2], _fact_ad(namespace, event_id, scope_id, index, (ref, kid))))
    if any(len(s) != KEY_BYTES for s in shares):
        raise DecodeError("a sealed fact's share is not a key share")
    content = DataKey.from_bytes(_NO_KID, _xor(shares))
    plain = content.open(fact[SEALED_KEY]["c"], _fact_ad(namespace, event_id, scope_id, index, None))
    return _map(plain, "sealed fact is not msgpack", "a sealed fact must be a map")


def open_facts(data: Mapping[str, Any], keys: KeyLookup | None) -> dict[str, Any]:
    """`data` of a FactsConsolidated envelope with every sealed fact opened (plaintext ones as they
    are); raises as `open_fact` — a snapshot is a scope's whole state, so it opens whole or not at all."""
    facts = data.get("facts")
    if not isinstance(facts, list | tuple) or not any(_fact_sealed(f) for f in facts):
        return dict(data)
    scope = data.get("scope")
    scope_id = scope.get("scope_id") if isinstance(scope, Mapping) else None
    namespace, event_id = data.get("namespace"), data.get("event_id")
    if not isinstance(scope_id, str) or not isinstance(namespace, str) or not isinstance(event_id, str):
        raise DecodeError("sealed facts need the event's namespace, event_id and scope.scope_id")
    opened = [
        open_fact(f, keys, namespace=namespace, event_id=event_id, scope_id=scope_id, index=i)
        if _fact_sealed(f)
        else f
        for i, f in enumerate(facts)
    ]
    return {**data, "facts": opened}


def facts_refs(data: Any) -> list[tuple[bytes, bytes]]:
    """Every (ref, kid) the sealed facts of a FactsConsolidated envelope's `data` need (else [])."""
    facts = data.get("facts") if isinstance(data, Mapping) else None
    if not isinstance(facts, list | tuple):
        return []
    return [ref for f in facts if _fact_sealed(f) for ref in share_refs(f)]
