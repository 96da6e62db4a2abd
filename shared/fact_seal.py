"""Sealing the facts of a `FactsConsolidated` event under the data keys of every user they summarise.

A fact mixes several users' episodes, so destroying any one contributor's key must make it unreadable:
each fact is sealed with a fresh content key K, the XOR of one random 32-byte share per contributor
(n-of-n secret sharing: any share missing leaves K uniformly random), each share sealed under its
contributor's data key (AES-256-GCM). A fact with no user has one share under the namespace's key.

Stored form of one fact: `{"z": {"s": [[ref (16), kid (16), sealed share], ...], "c": sealed msgpack of
the fact}}`; associated data binds each ciphertext to (namespace, event id, scope id, position) and a
share's to its (ref, kid). The event's `scope` and `removed` stay in clear (routing, sequence check).

Errors: `KeyDestroyed` (a contributor was forgotten), `SealedEntry` (no key lookup), `Unreadable`
(authentication failed), `DecodeError` (malformed).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import reduce
from typing import Any

import msgpack

from engram_episodic.errors import DecodeError
from shared.crypto import KEY_BYTES, KID_BYTES, REF_BYTES, DataKey, KeyDestroyed, SealedEntry

SEALED_KEY = "z"
"""The key of a sealed fact (a plaintext fact is the fact's own map, which has no such key)."""

_NO_KID = b"\x00" * KID_BYTES  # a content key has no id of its own: it lives only in this entry

KeyLookup = Callable[[bytes, bytes], DataKey | None]


def _ad(namespace: str, event_id: str, scope_id: str, index: int, share: tuple[bytes, bytes] | None) -> bytes:
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
        [ref, key.kid, key.seal(share, _ad(namespace, event_id, scope_id, index, (ref, key.kid)))]
        for (ref, key), share in zip(contributors, shares, strict=True)
    ]
    body = content.seal(
        msgpack.packb(dict(fact), use_bin_type=True), _ad(namespace, event_id, scope_id, index, None)
    )
    return {SEALED_KEY: {"s": sealed_shares, "c": body}}


def is_sealed(fact: Any) -> bool:
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
        shares.append(key.open(share[2], _ad(namespace, event_id, scope_id, index, (ref, kid))))
    if any(len(s) != KEY_BYTES for s in shares):
        raise DecodeError("a sealed fact's share is not a key share")
    content = DataKey.from_bytes(_NO_KID, _xor(shares))
    plain = content.open(fact[SEALED_KEY]["c"], _ad(namespace, event_id, scope_id, index, None))
    try:
        out = msgpack.unpackb(plain, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - authenticated but not msgpack: a writer bug, not input
        raise DecodeError(f"sealed fact is not msgpack: {type(exc).__name__}") from None
    if not isinstance(out, dict):
        raise DecodeError("a sealed fact must be a map")
    return out


def open_facts(data: Mapping[str, Any], keys: KeyLookup | None) -> dict[str, Any]:
    """`data` of a FactsConsolidated envelope with every sealed fact opened (plaintext ones as they
    are); raises as `open_fact` — a snapshot is a scope's whole state, so it opens whole or not at all."""
    facts = data.get("facts")
    if not isinstance(facts, list | tuple) or not any(is_sealed(f) for f in facts):
        return dict(data)
    scope = data.get("scope")
    scope_id = scope.get("scope_id") if isinstance(scope, Mapping) else None
    namespace, event_id = data.get("namespace"), data.get("event_id")
    if not isinstance(scope_id, str) or not isinstance(namespace, str) or not isinstance(event_id, str):
        raise DecodeError("sealed facts need the event's namespace, event_id and scope.scope_id")
    opened = [
        open_fact(f, keys, namespace=namespace, event_id=event_id, scope_id=scope_id, index=i)
        if is_sealed(f)
        else f
        for i, f in enumerate(facts)
    ]
    return {**data, "facts": opened}


def facts_refs(data: Any) -> list[tuple[bytes, bytes]]:
    """Every (ref, kid) the sealed facts of a FactsConsolidated envelope's `data` need (else [])."""
    facts = data.get("facts") if isinstance(data, Mapping) else None
    if not isinstance(facts, list | tuple):
        return []
    return [ref for f in facts if is_sealed(f) for ref in share_refs(f)]
