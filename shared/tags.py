"""What the TAG fields of the indexes hold in place of person-identifying ids: keyed digests.

RediSearch keeps every value a TAG field ever held (`FT.TAGVALS`) until the index is rebuilt, so the
fields holding ids of people or of what they did (`episode_id`, `user_id`, `session_id` of an episode;
`evidence` and `users` of a fact) hold a digest scoped by namespace and kind of id; queries digest
the values they filter on the same way, and results come from the stored JSON, never a digest.

A generation's mode is recorded in the meta hash (`g{gen}:tags`) when its index is created:
- `hmac-v1`, with a master key: HMAC-SHA256 under `shared.crypto.Deployment.tag_key`, truncated to
  128 bits; without the key a guessed id cannot be confirmed from a copy of Redis.
- `blake2b-v1`, without one: BLAKE2b-128 keyed by a constant: pseudonymous, not secret.
Agent ids, categories, strategies, outcomes and the namespace stay in clear (facts group by them).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field

from engram_episodic.errors import ConfigError

MODE_BLAKE2B, MODE_HMAC = "blake2b-v1", "hmac-v1"
MODES = (MODE_BLAKE2B, MODE_HMAC)
DIGEST_BYTES = 16
# the kinds of id; a fact's `evidence` holds episode ids, so it digests them as the episode index does
EPISODE, USER, SESSION = b"episode", b"user", b"session"
_BLAKE2B_KEY = b"engram/tags/blake2b-v1"


@dataclass(frozen=True, slots=True)
class TagCodec:
    """The digest function of one generation's TAG fields (module docstring). Pure; no I/O.

    `mode` is one of MODES; `key` is the 32-byte HMAC key of `hmac-v1` (None otherwise).
    Digests are 32 lower-case hex characters (letters and digits: nothing to escape in a query).
    """

    mode: str
    key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown TAG digest mode {self.mode!r}")
        if (self.mode == MODE_HMAC) != (self.key is not None):
            raise ValueError("hmac-v1 needs a key, and only it takes one")

    def digest(self, kind: bytes, namespace: str, value: str) -> str:
        """What the TAG field of `kind` (EPISODE, USER, SESSION) holds for `value` of `namespace`."""
        msg = b"\x00".join((kind, namespace.encode(), value.encode()))
        if self.mode == MODE_HMAC:
            assert self.key is not None
            return hmac.new(self.key, msg, hashlib.sha256).digest()[:DIGEST_BYTES].hex()
        return hashlib.blake2b(msg, key=_BLAKE2B_KEY, digest_size=DIGEST_BYTES).hexdigest()

    def episode(self, namespace: str, episode_id: str) -> str:
        return self.digest(EPISODE, namespace, episode_id)

    def episodes(self, namespace: str, episode_ids: Iterable[str]) -> tuple[str, ...]:
        return tuple(self.digest(EPISODE, namespace, e) for e in episode_ids)

    def user(self, namespace: str, user_id: str) -> str:
        return self.digest(USER, namespace, user_id)

    def users(self, namespace: str, user_ids: Iterable[str]) -> tuple[str, ...]:
        return tuple(self.digest(USER, namespace, u) for u in user_ids)

    def session(self, namespace: str, session_id: str) -> str:
        return self.digest(SESSION, namespace, session_id)


BLAKE2B = TagCodec(MODE_BLAKE2B)


def mode_for(tag_key: bytes | None) -> str:
    """The mode a new generation gets: `hmac-v1` with the deployment's tag key, else `blake2b-v1`."""
    return MODE_HMAC if tag_key is not None else MODE_BLAKE2B


def codec(mode: str, tag_key: bytes | None, *, prefix: str = "") -> TagCodec:
    """The codec of a generation recorded with `mode`, for a process holding `tag_key` (None without a
    master key). ConfigError when the generation holds keyed digests and the process has no key."""
    if mode == MODE_HMAC and tag_key is None:
        raise ConfigError(
            f"the index of this deployment (ENGRAM_PREFIX={prefix!r}) holds keyed digests of ids: "
            f"set ENGRAM_MASTER_KEY or ENGRAM_MASTER_KEY_FILE"
        )
    return TagCodec(mode, tag_key if mode == MODE_HMAC else None)  # ValueError for an unknown mode
