"""Keyword (BM25) recall in every script, against the real RediSearch module.

RediSearch 2.10 lower-cases only ASCII, and splits words only at spaces and ASCII punctuation: so words
starting with a non-ASCII capital never matched a (lower-cased) query, and Chinese or Japanese clauses
were one token each. `fold_for_search` case-folds and splits Han/kana runs into bigrams at index and
query time; these tests index real episodes and query them both ways.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from shared.keywords import fold_for_search, keyword_terms
from tests.integration.test_query_support import episode, put

pytest_plugins = ["tests.integration.test_query_support"]

TEXTS = {
    "ru": "Поездка в Москву на поезде",
    "de": "Über die Straße zum Bahnhof",
    "fr": "École d'été à Genève",
    "el": "ΣΟΦΙΑ ΚΑΙ ΓΝΩΣΗ",
    "zh": "今天玩成语接龙游戏，赢了三局",
    "ja": "東京駅で新幹線のきっぷを買った",
    "mixed": "汇率换算 E1234 失败",
}
QUERIES = [  # (query, expected episode)
    ("москву", "ru"),
    ("МОСКВУ", "ru"),
    ("Москву", "ru"),
    ("über", "de"),
    ("ÜBER", "de"),
    ("STRASSE", "de"),
    ("straße", "de"),
    ("école", "fr"),
    ("ÉCOLE", "fr"),
    ("genève", "fr"),
    ("σοφια", "el"),
    ("Σοφια", "el"),
    ("成语接龙", "zh"),
    ("赢了", "zh"),
    ("新幹線", "ja"),
    ("きっぷ", "ja"),
    ("汇率换算", "mixed"),
    ("e1234", "mixed"),
]


async def test_keyword_recall_matches_across_case_and_cjk(api, redis, prefix):
    for eid, text in TEXTS.items():
        await put(redis, prefix, "default", episode(eid, task=text))
    for query, expected in QUERIES:
        resp = await api.post("/v1/recall", json={"query": query, "mode": "keyword", "top_k": 3})
        assert resp.status == 200, await resp.text()
        found = [r["episode"]["episode_id"] for r in (await resp.json())["results"]]
        assert found[:1] == [expected], f"{query!r} → {found}"
        got = await (await api.get(f"/v1/episodes/{expected}")).json()
        assert got["episode"]["task"]["description"] == TEXTS[expected], "the stored text stays byte-exact"
    mixed = await (
        await api.post("/v1/recall", json={"query": "汇率换算 E1234", "mode": "keyword", "top_k": 5})
    ).json()
    assert mixed["results"][0]["episode"]["episode_id"] == "mixed", "both the Han and the Latin part match"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_query_terms_are_index_terms(text):
    """A query built from a stored (folded) text finds the same words as one built from the original."""
    folded = fold_for_search(text)
    assert keyword_terms(folded) == keyword_terms(text)
    assert keyword_terms(fold_for_search(folded)) == keyword_terms(folded)


async def test_long_cjk_and_mixed_queries_reach_the_module_safely(api, redis, prefix):
    """64 bigram clauses in one union: the module must answer (2.10.5 crashed on some long unions)."""
    await put(redis, prefix, "default", episode("zh", task=TEXTS["zh"]))
    query = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(300)) + " 成语接龙 Über E1234 the a is"
    resp = await api.post("/v1/recall", json={"query": query, "mode": "keyword", "top_k": 3})
    assert resp.status == 200, await resp.text()
    assert (await api.get("/healthz")).status == 200
