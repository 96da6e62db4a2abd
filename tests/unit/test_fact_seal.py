"""Sealing a fact under the keys of all its contributors (`shared.codec`): pure, no Redis."""

from __future__ import annotations

import os

import msgpack
import pytest

from engram_episodic.errors import DecodeError
from engram_episodic.events import FactsConsolidated
from shared import codec
from shared.crypto import DataKey, KeyDestroyed, SealedEntry, Unreadable, new_data_key

# Markers long enough that random ciphertext cannot hold them by chance (a 2-byte id did: ~1 in 200).
FACT = {
    "fact_id": "fact-id-marker-1",
    "text": "Failures were: 'ALICE lock timeout'",
    "users": ["alice", "bob"],
}
WHERE = {"namespace": "ns", "event_id": "e1", "scope_id": "s1", "index": 0}


def keys(n: int) -> list[tuple[bytes, DataKey]]:
    return [(os.urandom(16), DataKey.from_bytes(*new_data_key())) for _ in range(n)]


def lookup_of(contributors, missing=()):
    table = {(ref, key.kid): key for i, (ref, key) in enumerate(contributors) if i not in missing}
    return lambda ref, kid: table.get((ref, kid))


def test_a_sealed_fact_opens_with_every_contributor_key_and_holds_no_plaintext():
    contributors = keys(3)
    sealed = codec.seal_fact(FACT, contributors, **WHERE)
    packed = msgpack.packb(sealed)
    assert b"ALICE" not in packed and b"alice" not in packed and b"fact-id-marker" not in packed
    assert codec.open_fact(sealed, lookup_of(contributors), **WHERE) == FACT
    assert codec.share_refs(sealed) == [(ref, key.kid) for ref, key in contributors]


@pytest.mark.parametrize("gone", [0, 1, 2])
def test_destroying_any_one_contributor_key_makes_the_fact_unreadable(gone):
    contributors = keys(3)
    sealed = codec.seal_fact(FACT, contributors, **WHERE)
    with pytest.raises(KeyDestroyed):
        codec.open_fact(sealed, lookup_of(contributors, missing={gone}), **WHERE)
    with pytest.raises(SealedEntry):
        codec.open_fact(sealed, None, **WHERE)


def test_the_other_contributors_keys_alone_do_not_open_the_fact():
    """A contributor's key replaced by another of the same id (what an attacker holding every other
    key could try) fails authentication of its share: the fact never opens in part."""
    contributors = keys(2)
    sealed = codec.seal_fact(FACT, contributors, **WHERE)
    impostor = (
        contributors[0],
        (contributors[1][0], DataKey.from_bytes(contributors[1][1].kid, os.urandom(32))),
    )
    with pytest.raises(Unreadable):
        codec.open_fact(sealed, lookup_of(list(impostor)), **WHERE)


@pytest.mark.parametrize(
    "field,value", [("event_id", "e2"), ("scope_id", "s2"), ("index", 1), ("namespace", "x")]
)
def test_a_sealed_fact_moved_to_another_entry_or_position_does_not_open(field, value):
    contributors = keys(2)
    sealed = codec.seal_fact(FACT, contributors, **WHERE)
    with pytest.raises(Unreadable):
        codec.open_fact(sealed, lookup_of(contributors), **{**WHERE, field: value})


@pytest.mark.parametrize(
    "bad",
    [
        {"z": 1},
        {"z": {"s": [], "c": b"x"}},
        {"z": {"s": [[b"r", b"k", b"s"]], "c": b"x"}},
        {"z": {"s": [1], "c": b""}},
    ],
)
def test_a_malformed_sealed_fact_is_a_decode_error(bad):
    with pytest.raises(DecodeError):
        codec.open_fact(bad, lambda r, k: None, **WHERE)


def test_a_sealed_snapshot_round_trips_through_the_codec_and_names_its_keys():
    contributors = keys(2)
    event = FactsConsolidated(
        namespace="ns",
        occurred_at=1.0,
        scope={"namespace": "ns", "scope_id": "s1", "level": "namespace", "seq": "1"},
        facts=(FACT, {**FACT, "fact_id": "f2", "users": []}),
        removed=("f0",),
    )
    payload = codec.encode_sealed_facts(event, lambda f: contributors if f["users"] else contributors[:1])
    assert b"ALICE" not in payload and b"alice" not in payload
    envelope = codec.unpack(payload)
    assert codec.key_refs(envelope) == [(r, k.kid) for r, k in contributors] + [
        (contributors[0][0], contributors[0][1].kid)
    ]
    assert codec.decode(payload, lookup_of(contributors)) == event
    with pytest.raises(KeyDestroyed):  # a snapshot is a scope's whole state: it opens whole or not at all
        codec.decode(payload, lookup_of(contributors, missing={1}))
    # a plaintext snapshot (no master key) decodes as before, needing no key
    assert codec.decode(codec.encode(event)) == event
    assert codec.key_refs(codec.unpack(codec.encode(event))) == []


def test_a_sealed_snapshot_without_facts_round_trips():
    """The snapshot that removes a scope's last fact (a forget of its last evidence) holds no fact to
    seal: it was a KeyError, so the forget that published it was dead-lettered and the scope kept its
    facts."""
    event = FactsConsolidated(
        namespace="ns",
        occurred_at=1.0,
        scope={"namespace": "ns", "scope_id": "s1", "level": "namespace", "seq": "2"},
        facts=(),
        removed=("fact-id-marker-1",),
    )
    payload = codec.encode_sealed_facts(event, lambda f: pytest.fail("no fact to seal"))
    assert codec.decode(payload, lookup_of([])) == event
    assert codec.key_refs(codec.unpack(payload)) == []
