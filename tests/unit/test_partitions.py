"""Stream partitions (shared.keys): the namespace → partition mapping is stable and spreads, and the
partition tags spread the partition streams evenly over a cluster's slot ranges."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest
from redis.crc import key_slot

from shared.keys import MAX_PARTITIONS, Keys, partition_of, partition_tag

THREE_PRIMARIES = ((0, 5460), (5461, 10922), (10923, 16383))
"""The slot ranges `redis-cli --cluster create` (and deploy.embedded_redis.EmbeddedCluster) give 3 primaries."""


def primary_of(slot: int) -> int:
    return next(i for i, (lo, hi) in enumerate(THREE_PRIMARIES) if lo <= slot <= hi)


@pytest.mark.parametrize("partitions", [2, 3, 7, 16, 64])
def test_the_partition_of_a_namespace_is_the_documented_digest(partitions):
    # the formula of partition_of's docstring, computed apart: a change would send a deployment's new
    # events of a namespace to another stream than its older ones
    for ns in ("default", "team-a", "ns:{x}", "naïve ünicode", "a" * 200):
        expected = int(hashlib.blake2b(f"partition\x00{ns}".encode(), digest_size=16).hexdigest()[:16], 16)
        assert partition_of(ns, partitions) == expected % partitions
    assert partition_of("anything", 1) == 0


def test_namespaces_spread_over_the_partitions():
    counts = Counter(partition_of(f"tenant-{i}", 16) for i in range(16_000))
    assert sorted(counts) == list(range(16))
    # 1,000 expected per partition; a binomial's sd is ~31, so ±15% is > 4 sd
    assert all(850 <= n <= 1150 for n in counts.values()), counts


@pytest.mark.parametrize("partitions", [1, 2, 3, 5, 16, 17, 100, MAX_PARTITIONS])
def test_each_partition_tag_hashes_into_its_own_slice_of_the_slots(partitions):
    tags = [partition_tag(i, partitions) for i in range(partitions)]
    assert len(set(tags)) == partitions
    for i, tag in enumerate(tags):
        slot = key_slot(f"engram:stream:episodes:{tag}".encode())
        assert i * 16384 // partitions <= slot < (i + 1) * 16384 // partitions


def test_sixteen_partitions_balance_over_three_primaries():
    keys = Keys("engram:", 16)
    per_primary = Counter(primary_of(key_slot(s.encode())) for s in keys.streams)
    assert sorted(per_primary.values()) == [5, 5, 6]


def test_one_partition_keeps_the_key_names_of_before_partitions():
    keys = Keys("engram:")
    assert keys.stream == keys.partition_stream(0) == "engram:stream:episodes"
    assert keys.streams == ("engram:stream:episodes",)
    assert keys.stream_of("any") == keys.stream
    # the copy a compaction writes is in the slot of what it copies, tagged or not
    for stream in (keys.stream, keys.dead_letters):
        assert key_slot(keys.stream_compaction(stream).encode()) == key_slot(stream.encode())
        assert keys.stream_compaction(stream).startswith(keys.prefix)
    assert keys.encrypted_marker(0) == keys.deployment_key
    assert keys.data_key(b"\x01" * 16) == "engram:dek:" + "01" * 16


def test_what_a_publish_script_checks_shares_its_partitions_slot():
    keys = Keys("engram:", 16)
    with pytest.raises(ValueError, match="stream_of"):
        _ = keys.stream
    for ns in ("default", "team-a", "ns:{x}", "ünï"):
        stream = keys.stream_of(ns)
        slot = key_slot(stream.encode())
        assert stream == keys.streams[keys.partition(ns)]
        assert key_slot(keys.encrypted_marker(keys.partition(ns)).encode()) == slot
        ref = hashlib.blake2b(ns.encode(), digest_size=16).digest()
        assert key_slot(keys.data_key(ref, ns).encode()) == slot
        assert keys.data_key_ref(keys.data_key(ref, ns)) == ref
        assert key_slot(keys.stream_compaction(stream).encode()) == slot
    with pytest.raises(ValueError, match="namespace"):
        keys.data_key(b"\x01" * 16)


@pytest.mark.parametrize("bad", [0, -1, MAX_PARTITIONS + 1])
def test_a_partition_count_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="partitions must be in"):
        Keys("engram:", bad)


@pytest.mark.parametrize("primaries", [2, 3, 4, 5, 16])
def test_partitions_per_primary_differ_by_at_most_one(primaries):
    # equal contiguous slot ranges, as redis-cli --cluster create assigns them
    bounds = [i * 16384 // primaries for i in range(primaries + 1)]
    keys = Keys("engram:", 16)
    per = Counter(
        next(j for j in range(primaries) if bounds[j] <= key_slot(s.encode()) < bounds[j + 1])
        for s in keys.streams
    )
    assert len(per) == primaries and max(per.values()) - min(per.values()) <= 1
