"""Connections pack commands with hiredis, as redis-py (>= 8.2) does on asyncio connections."""

from __future__ import annotations

import pytest
from redis.connection import HiredisRespSerializer

from shared.redis_conn import connect


def test_connect_rejects_unknown_schemes_and_packs_with_hiredis():
    with pytest.raises(ValueError, match="REDIS_URL"):
        connect("http://localhost:6379")
    connection = connect("redis://127.0.0.1:1/0").connection_pool.make_connection()
    assert isinstance(connection._command_packer, HiredisRespSerializer)
