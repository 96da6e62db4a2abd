"""The consumer lag that backpressure reads, after deletions a group never saw (forgets, compaction)."""

from __future__ import annotations

from shared import streams


async def test_entries_deleted_before_the_group_read_them_are_no_lag(redis, prefix):
    stream, group = f"{prefix}s", "g"
    await streams.StreamGroup(redis, stream, group).ensure()
    ids = [await redis.xadd(stream, {b"e": b"x"}) for _ in range(9)]
    await redis.xdel(stream, *ids[3:6])  # forgotten before any worker read them
    read = await redis.xreadgroup(group, "c", {stream: ">"}, count=100)
    await redis.xack(stream, group, *[i for i, _ in read[0][1]])
    # a rebuilt stream's group (compaction) counts the live entries it read, the stream every entry added
    await redis.execute_command("XGROUP", "SETID", stream, group, "$", "ENTRIESREAD", 6)
    raw = next(g for g in await redis.xinfo_groups(stream) if g["name"] in (group, group.encode()))
    assert raw["lag"] == 3, "the phantom lag this guards against"
    assert await streams.StreamGroup(redis, stream, group).lag() == 0
