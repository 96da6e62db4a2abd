"""shared.crypto and the sealed envelopes of shared.codec, without Redis."""

from __future__ import annotations

import base64
import os
import stat

import msgpack
import pytest

from engram_episodic.errors import ConfigError
from engram_episodic.events import (
    Action,
    ActionRecorded,
    Episode,
    EpisodeCompleted,
    EpisodeForgotten,
    EpisodeStarted,
    EpisodeUpdated,
    Task,
    UserForgotten,
)
from shared import codec
from shared.crypto import (
    KEY_BYTES,
    NONCE_BYTES,
    TAG_BYTES,
    WRAPPED_BYTES,
    DataKey,
    Deployment,
    KeyDestroyed,
    MasterKey,
    MasterKeyMismatch,
    SealedEntry,
    Unreadable,
    generate_master_key_file,
    new_data_key,
    parse_master_key,
    read_master_key_file,
    wrapped_master_id,
)

REF = b"r" * 16


def completed(eid: str = "e1", user: str | None = "alice", text: str = "SECRET-TEXT") -> EpisodeCompleted:
    return EpisodeCompleted(
        namespace="ns",
        episode_id=eid,
        occurred_at=1700000000.5,
        episode=Episode(
            episode_id=eid, user_id=user, task=Task(description=text), solution=text, outcome="success"
        ),
    )


def key() -> DataKey:
    return DataKey.from_bytes(*new_data_key())


def test_sizes_are_the_documented_ones():
    kid, raw = new_data_key()
    assert len(kid) == 16 and len(raw) == KEY_BYTES == 32
    master = MasterKey(os.urandom(32))
    assert len(master.wrap(REF, kid, raw)) == WRAPPED_BYTES == 85
    sealed = DataKey.from_bytes(kid, raw).seal(b"x" * 10, b"ad")
    assert len(sealed) == NONCE_BYTES + 10 + TAG_BYTES == 12 + 10 + 16
    assert len(master.id) == 16 and master.id not in repr(raw)


def test_wrap_unwrap_and_what_refuses():
    master, other = MasterKey(os.urandom(32)), MasterKey(os.urandom(32))
    kid, raw = new_data_key()
    blob = master.wrap(REF, kid, raw)
    assert master.unwrap(REF, blob) == (kid, raw)
    assert blob[1:17] == kid and wrapped_master_id(blob) == master.id
    with pytest.raises(MasterKeyMismatch, match=master.id):  # names the wrapping key's id, not a key
        other.unwrap(REF, blob)
    with pytest.raises(Unreadable):  # moved to another user's slot
        master.unwrap(b"s" * 16, blob)
    forged = blob[:1] + os.urandom(16) + blob[17:]  # another kid claimed for the same key
    with pytest.raises(Unreadable):
        master.unwrap(REF, forged)
    flipped = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(Unreadable):
        master.unwrap(REF, flipped)
    with pytest.raises(Unreadable):
        master.unwrap(REF, blob[:-1])


def test_seal_open_wrong_ad_and_wrong_key_fail():
    k, other = key(), key()
    sealed = k.seal(b"plaintext", b"ad-1")
    assert k.open(sealed, b"ad-1") == b"plaintext"
    assert b"plaintext" not in sealed
    with pytest.raises(Unreadable):
        k.open(sealed, b"ad-2")
    with pytest.raises(Unreadable):
        other.open(sealed, b"ad-1")
    with pytest.raises(Unreadable):
        k.open(sealed[:10], b"ad-1")
    assert k.seal(b"plaintext", b"ad-1") != sealed  # a fresh nonce each time


@pytest.mark.parametrize(
    "event",
    [
        completed(),
        EpisodeStarted(
            namespace="ns",
            episode_id="e1",
            occurred_at=5.0,
            episode=Episode(episode_id="e1", user_id="alice", task=Task(description="SECRET-TEXT")),
        ),
        ActionRecorded(
            namespace="ns",
            episode_id="e1",
            occurred_at=6.0,
            action=Action(action_type="shell", input="SECRET-TEXT", action_id="a1"),
        ),
        UserForgotten(namespace="ns", user_id="SECRET-TEXT", occurred_at=7.0),
        EpisodeUpdated(namespace="ns", episode_id="e1", occurred_at=8.0, user_id="alice", clear_expiry=True),
    ],
)
def test_sealed_envelope_round_trip_keeps_only_routing_fields_clear(event):
    k = key()
    payload = codec.seal(event, REF, k)
    assert b"SECRET-TEXT" not in payload and b"alice" not in payload
    envelope = msgpack.unpackb(payload, raw=False)
    assert set(envelope["data"]) <= {"event_id", "namespace", "occurred_at", "schema_version", "episode_id"}
    assert codec.sealed_ref(envelope) == (REF, k.kid)
    expected = codec.decode(codec.encode(event))  # the same event as its plaintext envelope gives
    assert codec.decode(payload, lambda ref, kid: k if (ref, kid) == (REF, k.kid) else None) == expected
    with pytest.raises(KeyDestroyed):
        codec.decode(payload, lambda ref, kid: None)
    with pytest.raises(SealedEntry, match="ENGRAM_MASTER_KEY"):
        codec.decode(payload)
    assert codec.occurred_at(payload) == event.occurred_at


def test_ciphertext_cannot_be_moved_to_another_entry_or_have_its_clear_fields_changed():
    k = key()
    lookup = lambda ref, kid: k  # noqa: E731
    a = msgpack.unpackb(codec.seal(completed("a"), REF, k), raw=False)
    b = msgpack.unpackb(codec.seal(completed("b", text="OTHER"), REF, k), raw=False)
    swapped = dict(b, x=a["x"])  # a's ciphertext in b's entry
    with pytest.raises(Unreadable):
        codec.decode(msgpack.packb(swapped), lookup)
    for field, value in (("occurred_at", 1.0), ("namespace", "other-ns"), ("event_id", "0" * 32)):
        altered = dict(a, data={**a["data"], field: value})
        with pytest.raises(Unreadable):
            codec.decode(msgpack.packb(altered), lookup)
    retyped = dict(a, type="EpisodeStarted")
    with pytest.raises(Unreadable):
        codec.decode(msgpack.packb(retyped), lookup)
    other_ref = dict(a, x={**a["x"], "r": b"q" * 16})
    with pytest.raises(Unreadable):
        codec.decode(msgpack.packb(other_ref), lookup)


def test_malformed_sealed_parts_are_decode_errors():
    k = key()
    good = msgpack.unpackb(codec.seal(completed(), REF, k), raw=False)
    for x in ("str", {"r": b"short", "k": k.kid, "c": b"x"}, {"r": REF, "k": k.kid}):
        with pytest.raises(codec.DecodeError):
            codec.decode(msgpack.packb(dict(good, x=x)), lambda ref, kid: k)
    forgotten = codec.encode(EpisodeForgotten(namespace="ns", episode_id="e", occurred_at=1.0))
    never = dict(msgpack.unpackb(forgotten, raw=False), x=good["x"])
    with pytest.raises(codec.DecodeError, match="never sealed"):
        codec.decode(msgpack.packb(never), lambda ref, kid: k)


def test_plaintext_entries_written_before_encryption_still_decode():
    plain = codec.encode(completed())
    assert codec.sealed_ref(codec.unpack(plain)) is None and codec.payload_ref(plain) is None
    event = codec.decode(plain)
    assert event.episode.solution == "SECRET-TEXT"
    assert codec.decode(plain, lambda ref, kid: None) == event  # a key ring does not change plaintext


def test_rotation_rewrap_keeps_sealed_data_readable():
    old, new = MasterKey(os.urandom(32)), MasterKey(os.urandom(32))
    kid, raw = new_data_key()
    payload = codec.seal(completed(), REF, DataKey.from_bytes(kid, raw))
    rewrapped = new.wrap(REF, *old.unwrap(REF, old.wrap(REF, kid, raw)))
    opened = new.open_key(REF, rewrapped)
    assert (
        opened.kid == kid and codec.decode(payload, lambda ref, k: opened).episode.solution == "SECRET-TEXT"
    )
    with pytest.raises(MasterKeyMismatch):
        old.unwrap(REF, rewrapped)


def test_key_references_are_keyed_and_distinct():
    secret = os.urandom(32)
    d, again, other = Deployment(secret), Deployment(secret), Deployment(os.urandom(32))
    assert d.ref("ns", "alice") == again.ref("ns", "alice") != other.ref("ns", "alice")
    refs = {
        d.ref("ns", "alice"),
        d.ref("ns", None),
        d.ref("ns2", "alice"),
        d.ref("ns", "bob"),
        d.ref("ns\x00", ""),
    }
    assert len(refs) == 5 and all(len(r) == 16 for r in refs)


def test_master_key_parsing_names_the_variable(tmp_path):
    good = base64.b64encode(os.urandom(32)).decode()
    assert len(parse_master_key(f"  {good}\n")) == 32
    with pytest.raises(ConfigError, match="ENGRAM_MASTER_KEY is not base64"):
        parse_master_key("not base64!")
    with pytest.raises(ConfigError, match="ENGRAM_MASTER_KEY must be the base64 of 32 bytes, not of 16"):
        parse_master_key(base64.b64encode(os.urandom(16)).decode())
    with pytest.raises(ConfigError, match="ENGRAM_MASTER_KEY_FILE='/nonexistent/k' cannot be read"):
        read_master_key_file("/nonexistent/k")
    path = generate_master_key_file(tmp_path / "run" / "master.key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = read_master_key_file(path)
    assert generate_master_key_file(path) == path and read_master_key_file(path) == first  # never overwritten
    (tmp_path / "bad.key").write_text("abc")
    with pytest.raises(ConfigError, match="bad.key"):
        read_master_key_file(tmp_path / "bad.key")
