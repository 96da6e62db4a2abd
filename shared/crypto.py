"""Crypto-shredding of the event log: the key hierarchy, key wrapping, sealing of event payloads.

The one module that handles key material; no I/O (`shared.keyring` stores what it makes, `shared.codec`
chooses the sealed fields). Design and guarantees: docs/reliability.md, Erasure. Keys are 32 bytes
(AES-256), nonces 12 random bytes per encryption, GCM tags 16 bytes.

- **master key** (`ENGRAM_MASTER_KEY[_FILE]`): never in Redis; its 8-byte id (an HMAC) is stored with
  what it wraps, so another master key is named instead of misreading data.
- **deployment secret** (one per `ENGRAM_PREFIX`, wrapped by the master key): key references (`ref`)
  are HMACs under a key derived from it; a rotation re-wraps it, so references stay valid.
- **data keys** (random 16-byte id `kid`), one per (namespace, user_id) and one per namespace.

A wrapped key is 85 bytes: `0x01 | kid (16) | master id (8) | nonce (12) | ciphertext (32) + tag (16)`,
associated data `b"engram/wrap/v1\\0" + slot + kid` (it does not unwrap in another slot or as another
kid). A sealed payload is `nonce (12) | ciphertext + tag (16)` under a data key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_episodic.errors import ConfigError, Conflict, DecodeError, EngramError

KEY_BYTES = 32
"""Every key (master, deployment secret, data key): AES-256."""
NONCE_BYTES = 12
"""GCM nonce, random per encryption (2^-32 collision bound reached only after ~2^32 seals per key)."""
TAG_BYTES = 16
KID_BYTES = 16
"""A data key's random id, stored in clear next to it and named by every entry it sealed."""
REF_BYTES = 16
"""A key reference: HMAC-SHA256(ref key, msgpack([namespace, user_id or nil])) truncated to 128 bits."""
MASTER_ID_BYTES = 8
WRAP_VERSION = 1
WRAPPED_BYTES = 1 + KID_BYTES + MASTER_ID_BYTES + NONCE_BYTES + KEY_BYTES + TAG_BYTES  # 85
_KID = slice(1, 1 + KID_BYTES)
_MASTER_ID = slice(_KID.stop, _KID.stop + MASTER_ID_BYTES)
_NONCE = slice(_MASTER_ID.stop, _MASTER_ID.stop + NONCE_BYTES)
_WRAP_AD = b"engram/wrap/v1\x00"
DEPLOYMENT_SLOT = b"deployment"


class KeyDestroyed(EngramError):
    """The data key an entry was sealed with no longer exists: its user (or namespace key) was
    forgotten. The entry is unreadable by design; the consolidator acks and skips it."""


class SealedEntry(EngramError):
    """A sealed entry met a process without a master key (configure ENGRAM_MASTER_KEY[_FILE])."""


class Unreadable(DecodeError):
    """A sealed payload or wrapped key failed authentication: tampered with, moved to another entry
    or slot, or opened with the wrong key. Carries no plaintext (there is none to carry)."""


class MasterKeyMismatch(Conflict):
    """A key in Redis is wrapped by another master key than the configured one (a rotation that this
    process has not followed, or the wrong key file): stop rather than misread or skip data."""


# --- the master key ---------------------------------------------------------------------------------
def parse_master_key(text: str | bytes, *, name: str = "ENGRAM_MASTER_KEY") -> bytes:
    """The 32 key bytes from base64 text (surrounding whitespace ignored); ConfigError naming `name`."""
    raw = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    try:
        key = base64.b64decode(raw.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(
            f'{name} is not base64 (generate one: python -c "import base64, os; '
            f'print(base64.b64encode(os.urandom(32)).decode())")'
        ) from None
    if len(key) != KEY_BYTES:
        raise ConfigError(f"{name} must be the base64 of {KEY_BYTES} bytes, not of {len(key)}")
    return key


def read_master_key_file(path: str | Path, *, name: str = "ENGRAM_MASTER_KEY_FILE") -> bytes:
    """The master key held (as base64 text) in `path`; ConfigError naming `name` if unreadable/bad."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}={str(path)!r} cannot be read: {exc.strerror}") from None
    return parse_master_key(text, name=f"{name}={str(path)!r}")


def generate_master_key_file(path: str | Path) -> Path:
    """Write a new random master key (base64 text) to `path` with mode 0600 unless the file exists;
    returns the path. Used by `make run` on its first start. Never overwrites an existing key."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as fh:
        fh.write(base64.b64encode(os.urandom(KEY_BYTES)).decode() + "\n")
    return path


def _hmac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"\x00".join(parts), hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class DataKey:
    """An unwrapped data key: its id and an AES-256-GCM instance (the 32 key bytes live inside it)."""

    kid: bytes
    aead: AESGCM = field(repr=False)

    @classmethod
    def from_bytes(cls, kid: bytes, key: bytes) -> DataKey:
        if len(kid) != KID_BYTES or len(key) != KEY_BYTES:
            raise ValueError("kid is 16 bytes and a data key 32")
        return cls(kid, AESGCM(key))

    def seal(self, plaintext: bytes, ad: bytes) -> bytes:
        """`nonce (12) | ciphertext + tag (16)` of `plaintext` bound to `ad`."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self.aead.encrypt(nonce, plaintext, ad)

    def open(self, sealed: bytes, ad: bytes) -> bytes:
        """The plaintext of `seal(plaintext, ad)`; Unreadable when the blob or `ad` differ."""
        if len(sealed) < NONCE_BYTES + TAG_BYTES:
            raise Unreadable("sealed payload is too short")
        try:
            return self.aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], ad)
        except InvalidTag:
            raise Unreadable("sealed payload fails authentication (wrong key or associated data)") from None


def new_data_key() -> tuple[bytes, bytes]:
    """(kid, key): 16 random id bytes and 32 random key bytes."""
    return os.urandom(KID_BYTES), AESGCM.generate_key(bit_length=256)


class MasterKey:
    """The root of the hierarchy. `wrap`/`unwrap` data keys for a slot; `id` is safe to show and store."""

    __slots__ = ("_aead", "_id")

    def __init__(self, key: bytes):
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            raise ValueError(f"a master key is {KEY_BYTES} bytes")
        self._aead = AESGCM(key)
        self._id = _hmac(key, b"engram/master-key-id/v1")[:MASTER_ID_BYTES]

    def __repr__(self) -> str:
        return f"MasterKey(id={self.id})"

    @property
    def id(self) -> str:
        """16 hex characters identifying the key (an HMAC of it; reveals nothing of the key)."""
        return self._id.hex()

    def wrap(self, slot: bytes, kid: bytes, key: bytes) -> bytes:
        """The 85-byte wrapped form of data key `key` (id `kid`) for `slot` (module docstring)."""
        if len(kid) != KID_BYTES or len(key) != KEY_BYTES:
            raise ValueError("kid is 16 bytes and a data key 32")
        nonce = os.urandom(NONCE_BYTES)
        ct = self._aead.encrypt(nonce, key, _WRAP_AD + slot + kid)
        return bytes([WRAP_VERSION]) + kid + self._id + nonce + ct

    def unwrap(self, slot: bytes, blob: bytes) -> tuple[bytes, bytes]:
        """(kid, key) of a wrapped key. MasterKeyMismatch when another master key wrapped it,
        Unreadable when it was altered or belongs to another slot."""
        if len(blob) != WRAPPED_BYTES or blob[0] != WRAP_VERSION:
            raise Unreadable("not a wrapped key of this format")
        kid, master_id = blob[_KID], blob[_MASTER_ID]
        if master_id != self._id:
            raise MasterKeyMismatch(
                f"a data key in Redis is wrapped by master key {master_id.hex()}, but this process has master "
                f"key {self.id}: set ENGRAM_MASTER_KEY or ENGRAM_MASTER_KEY_FILE to the deployment's key (`make "
                "run` keeps it in ENGRAM_DATA_DIR/master.key; after `rotate-master-key`, the new one)"
            )
        try:
            key = self._aead.decrypt(blob[_NONCE], blob[_NONCE.stop :], _WRAP_AD + slot + kid)
        except InvalidTag:
            raise Unreadable(
                "wrapped key fails authentication (altered, or moved from another slot)"
            ) from None
        return kid, key

    def open_key(self, slot: bytes, blob: bytes) -> DataKey:
        kid, key = self.unwrap(slot, blob)
        return DataKey.from_bytes(kid, key)


def wrapped_master_id(blob: bytes) -> str | None:
    """The id (hex) of the master key that wrapped `blob`, or None if it is not a wrapped key."""
    if len(blob) != WRAPPED_BYTES or blob[0] != WRAP_VERSION:
        return None
    return blob[_MASTER_ID].hex()


class Deployment:
    """What the deployment secret derives: key references (and, for the TAG index, keyed digests)."""

    __slots__ = ("_ref_key", "_cache", "tag_key")

    def __init__(self, secret: bytes):
        if len(secret) != KEY_BYTES:
            raise ValueError("a deployment secret is 32 bytes")
        self._ref_key = _hmac(secret, b"engram/ref/v1")
        self.tag_key = _hmac(secret, b"engram/tags/v1")
        """32 bytes: the HMAC key of the TAG fields' digests of ids (`shared.tags`, mode hmac-v1)."""
        self._cache: dict[tuple[str, str | None], bytes] = {}

    def ref(self, namespace: str, user_id: str | None) -> bytes:
        """The 16-byte reference of the data key of (namespace, user_id); user_id None is the
        namespace's own key. Deterministic, so every publisher finds the same key."""
        ident = (namespace, user_id)
        got = self._cache.get(ident)
        if got is None:
            got = hmac.new(self._ref_key, msgpack.packb([namespace, user_id]), hashlib.sha256).digest()
            got = got[:REF_BYTES]
            if len(self._cache) > 65_536:
                self._cache.clear()
            self._cache[ident] = got
        return got
