"""The hiredis command packer must put the same bytes on the wire as redis-py's own."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from shared.redis_conn import HiredisConnection, connect

ARG = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=32),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
)


def _wire(conn, *args) -> bytes:
    return b"".join(bytes(part) for part in conn.pack_command(*args))


@given(st.lists(ARG, max_size=40))
def test_packs_exactly_as_redis_py(args):
    args = [a for a in args if not (isinstance(a, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in a))]
    assert _wire(HiredisConnection(), "HSET", b"key", *args) == _wire(Connection(), "HSET", b"key", *args)


def test_multi_word_command_names_are_split_like_redis_py():
    assert _wire(HiredisConnection(), "CONFIG GET", "maxmemory") == _wire(
        Connection(), "CONFIG GET", "maxmemory"
    )
    assert _wire(HiredisConnection(), b"CONFIG GET", "x") == _wire(Connection(), b"CONFIG GET", "x")


def test_types_redis_py_refuses_are_still_refused():
    with pytest.raises(DataError):
        HiredisConnection().pack_command("SET", "k", True)


def test_connect_rejects_unknown_schemes_and_uses_the_hiredis_packer():
    with pytest.raises(ValueError, match="REDIS_URL"):
        connect("http://localhost:6379")
    client = connect("redis://127.0.0.1:1/0")
    assert client.connection_pool.connection_class is HiredisConnection
