"""Keyword (BM25) recall in every script, against the real RediSearch module.

RediSearch 2.10 lower-cases only ASCII, and splits words only at spaces and ASCII punctuation: so words
starting with a non-ASCII capital never matched a (lower-cased) query, and Chinese or Japanese clauses
were one token each. `fold_for_search` normalises (NFKC), folds case and accents and splits runs of
scripts written without spaces into character pairs at index and query time; these tests index real
episodes and query them both ways.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from shared.index import Scope, keyword_query
from shared.keys import Keys
from shared.keywords import STOPWORDS, fold_for_search, words
from shared.tags import BLAKE2B
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
    assert keyword_query(folded) == keyword_query(text)
    assert keyword_query(fold_for_search(folded)) == keyword_query(folded)


async def test_long_cjk_and_mixed_queries_reach_the_module_safely(api, redis, prefix):
    """64 bigram clauses in one union: the module must answer (2.10.5 crashed on some long unions)."""
    await put(redis, prefix, "default", episode("zh", task=TEXTS["zh"]))
    query = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(300)) + " 成语接龙 Über E1234 the a is"
    resp = await api.post("/v1/recall", json={"query": query, "mode": "keyword", "top_k": 3})
    assert resp.status == 200, await resp.text()
    assert (await api.get("/healthz")).status == 200


# (family, stored text, query): the query, written in another form of the same word, must find the
# stored text, and the other way round (query stored, stored text queried)
FORMS = [
    ("ko-particle", "서울역에서 친구를 만났다", "서울역"),
    ("ko-particle", "부산항으로 배가 들어왔다", "부산항"),
    ("ko-particle", "김치찌개를 끓였다", "김치찌개"),
    ("ko-ending", "회의록은 공유폴더에 있습니다", "공유폴더"),
    ("fullwidth", "注文番号 ＡＢＣ１２３ を確認", "ABC123"),
    ("fullwidth", "invoice ＩＮＶ－２０２４ paid", "inv 2024"),
    ("halfwidth-kana", "ｶﾀｶﾅ入力の不具合", "カタカナ"),
    ("ligature", "the ﬁnal ﬂoor plan", "final floor"),
    ("accent", "École d'été à Genève", "ecole geneve"),
    ("accent", "crème brûlée recipe", "creme brulee"),
    ("accent", "naïve Ångström façade", "naive angstrom facade"),
    ("accent", "São Paulo señor", "sao paulo senor"),
    ("stroke", "Łódź trip with Søren", "lodz soren"),
    ("greek", "Η Σοφία ταξίδεψε", "σοφια"),
    ("thai", "ฉันเรียนภาษาไทยทุกวัน", "ภาษาไทย"),
    ("thai", "ร้านกาแฟเปิดตอนเช้า", "กาแฟ"),
    ("lao", "ພາສາລາວງາມຫຼາຍ", "ພາສາລາວ"),
    ("khmer", "ខ្ញុំរៀនភាសាខ្មែរ", "ភាសាខ្មែរ"),
    ("myanmar", "မြန်မာစာကိုလေ့လာသည်", "မြန်မာစာ"),
    ("hindi", "मुझे हिन्दी भाषा पसंद है", "हिन्दी"),
    ("zh", "今天玩成语接龙游戏", "成语接龙"),
    ("ja", "東京駅で新幹線のきっぷを買った", "新幹線"),
]
_NOISE = ["ordinary english text about deploys", "другой текст без совпадений", "別の話題の文章です"]


async def test_each_form_finds_the_other(api, redis, prefix):
    """Per family, the stored text is found by the query written in the other form (particle off,
    ASCII for full-width, no accents), and a text holding the query's form by the stored one."""
    for i, text in enumerate(_NOISE):
        await put(redis, prefix, "default", episode(f"noise{i}", task=text))
    for i, (_, stored, other) in enumerate(FORMS):
        await put(redis, prefix, "default", episode(f"s{i}", task=stored))
        await put(redis, prefix, "default", episode(f"o{i}", task=f"{other} zzz{i}"))
    for i, (family, stored, other) in enumerate(FORMS):
        for query, expected in ((other, f"s{i}"), (stored, f"o{i}")):
            resp = await api.post("/v1/recall", json={"query": query, "mode": "keyword", "top_k": 30})
            assert resp.status == 200, await resp.text()
            results = (await resp.json())["results"]
            found = {r["episode"]["episode_id"]: r["relevance"] for r in results if r["relevance"] > 0.0}
            assert expected in found, f"{family}: {query!r} → {found}"
            assert not any(k.startswith("noise") for k in found), f"{family}: {query!r} → {found}"
        got = await (await api.get(f"/v1/episodes/s{i}")).json()
        assert got["episode"]["task"]["description"] == stored, "the stored text stays byte-exact"


async def test_every_python_word_is_an_index_term(api, redis, prefix):
    """Keyword relevance is computed from `words` in Python; each of those words must be a term
    RediSearch indexed for that episode, or relevance and the BM25 arm would disagree (the stdlib's
    `\\w` cut Hindi and Thai words at their vowel signs into pieces the index never held)."""
    index = Keys(prefix).episode_index_alias
    scope = Scope(tags=BLAKE2B, namespace="default")
    texts = [stored for _, stored, _ in FORMS] + ["«Привет», — сказал он… ﬁle ① Ⅻ İstanbul"]
    for i, text in enumerate(texts):
        await put(redis, prefix, "default", episode(f"t{i}", task=text))
    for i, text in enumerate(texts):
        key = Keys(prefix).episode_doc(1, "default", f"t{i}").encode()
        for word in dict.fromkeys(words(text)):
            if word in STOPWORDS:
                continue
            query = keyword_query(word, scope.query())
            reply = await redis.execute_command(
                "FT.SEARCH", index, query, "NOCONTENT", "LIMIT", 0, 100, "DIALECT", 2
            )
            assert key in reply[1:], f"{word!r} of {text!r} is not an index term"
