"""Redis replies as the types our clients actually receive.

Every connection Engram makes is opened with `decode_responses=False` (`shared.redis_conn`), so replies
hold `bytes`; redis-py's annotations say `bytes | str` because they cover both settings. These helpers
narrow a reply once, where it is read, instead of a cast at each use. They also accept `str`, so a
caller handed a decoding client still gets the right value rather than an AttributeError.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def as_bytes(value: bytes | str) -> bytes:
    """One reply value as bytes (UTF-8 when redis-py decoded it)."""
    return value if isinstance(value, bytes) else value.encode()


def as_text(value: bytes | str) -> str:
    """One reply value as text (UTF-8)."""
    return value.decode() if isinstance(value, bytes) else value


def bytes_map(reply: Mapping[bytes | str, bytes | str]) -> dict[bytes, bytes]:
    """A hash reply (HGETALL, a stream entry's fields) as `dict[bytes, bytes]`."""
    return {as_bytes(k): as_bytes(v) for k, v in reply.items()}


def bytes_list(reply: Iterable[bytes | str]) -> list[bytes]:
    """A set or list reply (SMEMBERS, LRANGE) as `list[bytes]`, in reply order."""
    return [as_bytes(v) for v in reply]
