"""The 64 KiB bounds of `context` and `metadata` count the field's value as compact UTF-8 JSON
(`validation.json_size`), on the client and on the service alike: at 65,536 bytes both take it, at
65,537 both refuse it naming the field, whatever the characters (1 to 4 bytes each) or the number of
keys, and spaces or `\\u` escapes a sender adds are not counted."""

from __future__ import annotations

import json

import pytest

from engram_episodic import AsyncEngram, InvalidEpisode
from engram_episodic.validation import MAX_JSON_BYTES, json_size

pytest_plugins = ["tests.integration.test_query_support"]
NOWHERE = "http://127.0.0.1:9"  # the discard port: a refusal from here was made before sending


def sized(n_bytes: int, char: str, *, keys: int = 1) -> dict[str, str]:
    """An object of `keys` string fields, mostly `char`, of exactly `n_bytes` as compact UTF-8 JSON."""
    obj = {f"k{i:05d}": "" for i in range(keys)}
    room = n_bytes - json_size(obj)
    width = len(char.encode())
    last = f"k{keys - 1:05d}"
    for key in obj:
        share = room // keys if key != last else room - (room // keys) * (keys - 1)
        obj[key] = char * (share // width) + "a" * (share % width)
    assert json_size(obj) == n_bytes
    return obj


CASES = [("a", 1), ("é", 1), ("€", 1), ("😀", 1), ("a", 2000), ("é", 500)]


def body(field: str, value: dict[str, str], **dumps) -> bytes:
    return json.dumps({"task": "t", "outcome": "success", field: value}, **dumps).encode()


@pytest.mark.parametrize(("char", "keys"), CASES)
@pytest.mark.parametrize("field", ["context", "metadata"])
async def test_the_service_takes_64_kib_of_compact_utf8_and_refuses_one_byte_more(api, field, char, keys):
    headers = {"Content-Type": "application/json"}
    at_limit = sized(MAX_JSON_BYTES, char, keys=keys)
    compact = body(field, at_limit, ensure_ascii=False, separators=(",", ":"))
    padded = body(field, at_limit)  # ", " and ": " and \u escapes: more bytes sent, the same count
    assert len(padded) > len(compact)
    for raw in (compact, padded):
        resp = await api.post("/v1/episodes", data=raw, headers=headers)
        assert resp.status == 202, await resp.text()
    over = body(field, sized(MAX_JSON_BYTES + 1, char, keys=keys), ensure_ascii=False, separators=(",", ":"))
    resp = await api.post("/v1/episodes", data=over, headers=headers)
    assert resp.status == 422
    assert (await resp.json())["errors"] == [
        {"field": field, "reason": "must be at most 65,536 bytes as compact UTF-8 JSON, not 65,537"}
    ]


@pytest.mark.parametrize(("char", "keys"), CASES)
async def test_the_client_draws_the_line_at_the_same_byte(api, char, keys):
    async with AsyncEngram(str(api.make_url("")).rstrip("/")) as memory:
        assert await memory.record(
            task="t", outcome="success", context=sized(MAX_JSON_BYTES, char, keys=keys)
        )
    async with AsyncEngram(NOWHERE, max_retries=0) as nowhere:
        with pytest.raises(InvalidEpisode) as refused:
            await nowhere.record(
                task="t", outcome="success", context=sized(MAX_JSON_BYTES + 1, char, keys=keys)
            )
    assert refused.value.errors == [
        ("context", "must be at most 65,536 bytes as compact UTF-8 JSON, not 65,537")
    ]
