"""Opaque, signed page cursors of the listing routes (`GET /v1/episodes`, `GET /v1/facts`).

A cursor is `base64url(msgpack [version, order, filters digest, value, suffix, tie]) "." base64url(tag)`
(`tie` the last row's tie-break or None, `shared.index_pages.Position`; version 1, without it, ordered
ties by the key alone and is refused with its version), the
tag an HMAC-SHA256 (128 bits) under a random secret kept in Redis (`Keys.cursor_secret`, created once
by whichever replica needs it first with SET NX, so every replica and restart accepts the others'
cursors). A cursor that was altered, truncated, made up, or issued for other filters or another order
is a 422 naming `cursor`. The namespace is not in it: it comes from the API key on every request, so
even a forged cursor could only move within the caller's own data.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import secrets
from typing import Any

import msgpack
import orjson
import redis.asyncio as aioredis

from services.query.problems import Invalid
from shared.index_pages import SUFFIX, Position
from shared.keys import Keys

VERSION = 2
TAG_BYTES = 16
MAX_CURSOR_CHARS = 512


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def filters_digest(route: str, filters: dict[str, Any]) -> str:
    """A short digest of a listing's filters (every query parameter but `cursor` and `limit`)."""
    blob = orjson.dumps([route, filters], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


class Cursors:
    """Signs and checks cursors with the deployment's cursor secret (read from Redis once)."""

    def __init__(self, keys: Keys):
        self.keys = keys
        self._secret: bytes | None = None

    async def _key(self, r: aioredis.Redis) -> bytes:
        if self._secret is None:
            await r.set(self.keys.cursor_secret, secrets.token_bytes(32), nx=True)
            raw = await r.get(self.keys.cursor_secret)
            if not isinstance(raw, bytes) or len(raw) != 32:
                raise RuntimeError(f"{self.keys.cursor_secret} does not hold a 32-byte secret")
            self._secret = raw
        return self._secret

    async def encode(self, r: aioredis.Redis, order: str, filters: str, at: Position) -> str:
        body = msgpack.packb([VERSION, order, filters, at.value, at.suffix, at.tie])
        tag = hmac.new(await self._key(r), body, hashlib.sha256).digest()[:TAG_BYTES]
        return f"{_b64(body)}.{_b64(tag)}"

    async def decode(self, r: aioredis.Redis, cursor: str, order: str, filters: str) -> Position:
        """The position `cursor` names; Invalid naming `cursor` for anything else."""

        def bad(reason: str) -> Invalid:
            return Invalid([("cursor", reason)])

        if len(cursor) > MAX_CURSOR_CHARS or cursor.count(".") != 1:
            raise bad("is not a cursor this service issued")
        body_text, tag_text = cursor.split(".")
        try:
            body, tag = _unb64(body_text), _unb64(tag_text)
        except (binascii.Error, ValueError):
            raise bad("is not a cursor this service issued") from None
        expected = hmac.new(await self._key(r), body, hashlib.sha256).digest()[:TAG_BYTES]
        if not hmac.compare_digest(tag, expected):
            raise bad("is not a cursor this service issued (altered or made up)")
        fields = msgpack.unpackb(body)
        if fields[0] != VERSION:  # signed by this deployment, so a list of the version's own shape
            raise bad(f"is of version {fields[0]}; this service reads version {VERSION}: list from the start")
        version, c_order, c_filters, value, suffix, tie = fields
        if c_order != order:
            raise bad(f"was issued for order={c_order}; send the same order with it")
        if c_filters != filters:
            raise bad("was issued for other filters; send the same filters with it")
        if not (isinstance(value, float) and math.isfinite(value) and SUFFIX.fullmatch(suffix)):
            raise bad("is not a cursor this service issued")
        if tie is not None and not (isinstance(tie, float) and math.isfinite(tie)):
            raise bad("is not a cursor this service issued")
        return Position(value, suffix, tie)
