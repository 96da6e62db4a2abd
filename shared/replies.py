"""Redis replies as the types our clients receive: `bytes` (`decode_responses=False`,
`shared.redis_conn`) where redis-py annotates `bytes | str`; narrowed once where read (`str` is
accepted too, from a decoding client).
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
