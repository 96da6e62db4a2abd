"""shared.index_pages.page against a real index: heavy ties, both orders, any page size."""

from __future__ import annotations

import random

from shared.index_pages import page
from shared.keys import digest
from tests.helpers import wait_until


async def test_pages_concatenate_to_the_exact_order(redis, prefix):
    index, docs_prefix = f"{prefix}ix", f"{prefix}d:"
    await redis.execute_command(
        "FT.CREATE",
        index,
        "ON",
        "HASH",
        "PREFIX",
        1,
        docs_prefix,
        "SCHEMA",
        "ns",
        "TAG",
        "t",
        "NUMERIC",
        "SORTABLE",
    )
    rnd = random.Random(7)
    # values with many ties and more digits than the index prints (1764605454.123456789 -> ...454.123)
    steps = [0, 0.1, 0.123456789, 1, 2, 2.5]
    docs = {}
    for i in range(150):
        suffix = digest("ns", f"e{i}")
        docs[suffix] = 1764605454.0 + rnd.choice(steps) * rnd.randint(0, 3)
        await redis.hset(f"{docs_prefix}{suffix}", mapping={"ns": "a", "t": repr(docs[suffix])})
    await redis.hset(f"{docs_prefix}{digest('x', 'no value')}", mapping={"ns": "a"})  # never listed
    await redis.hset(f"{docs_prefix}{digest('x', 'other')}", mapping={"ns": "b", "t": "1"})

    async def indexed():
        info = await redis.execute_command("FT.INFO", index)
        return int(dict(zip(info[::2], info[1::2], strict=False))[b"num_docs"]) == 152

    await wait_until(indexed, message="the index")
    for desc in (True, False):
        # ties break on the key in the listing's direction too: ascending is descending reversed
        expected = sorted(docs, key=lambda s: (docs[s], s), reverse=desc)
        for limit in (1, 2, 3, 7, 50, 149, 150, 1000):
            got, after = [], None
            while True:
                rows, more = await page(
                    redis,
                    index,
                    "@ns:{a}",
                    sort_field="t",
                    descending=desc,
                    after=after,
                    limit=limit,
                )
                assert len(rows) <= limit and (rows or not more)
                got += [row.position.suffix for row in rows]
                if not more:
                    break
                after = rows[-1].position
                assert after.value == docs[after.suffix]  # exact, not as the index prints it
            assert got == expected, (desc, limit)
