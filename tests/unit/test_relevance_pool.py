"""The pool scorer (`relevance.keyword_relevances`, `services.query.recall.terms`) equals the scalar BM25 formula of
`services.query.recall.relevance`'s docstring to the last bit, over random texts (a recall's keyword
relevance is computed the cheaper way, and must not move any ranking).

The reference below is the slow, obvious reading of the definition, kept here and not in the product:
fold each field (`fold_for_search`), Unicode `\\w+` words (the regex module's: marks included), drop RediSearch's stop words, stem each word
with a fresh Snowball stemmer, add the field's weight per occurrence, then the BM25 sum term by term.
"""

from __future__ import annotations

import unicodedata
from collections import Counter

import numpy as np
import regex
import Stemmer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.query.recall import relevance, terms
from shared.index import TEXT_FIELDS
from shared.keywords import STOPWORDS, fold_for_search

_REF_STEMMER = Stemmer.Stemmer("english")  # no cache: a different object from the product's
_REF_WORD = regex.compile(r"\w+")  # Unicode \w: letters, marks, digits (the index keeps marks in a word)


def ref_terms(fields: dict[bytes, bytes]) -> tuple[dict[str, float], float]:
    tf: dict[str, float] = {}
    length = 0.0
    for name, weight in TEXT_FIELDS:
        text = fields.get(name.encode())
        if not text:
            continue
        for word in _REF_WORD.findall(fold_for_search(text.decode("utf-8", "replace"))):
            if word in STOPWORDS:
                continue
            length += weight
            stem = _REF_STEMMER.stemWord(word)
            tf[stem] = tf.get(stem, 0.0) + weight
    return tf, length


def ref_relevance(query: dict[str, float], tf: dict[str, float], length: float) -> float:
    k1, b = relevance.K1, relevance.B
    norm = k1 * (1.0 - b + b * length / relevance.LEN_REF)
    s = 0.0
    for term, idf in query.items():
        f = tf.get(term)
        if f:
            s += idf * f * (k1 + 1.0) / (f + norm)
    return s / (s + relevance.KEYWORD_HALF) if s > 0.0 else 0.0


NFD_UBER = unicodedata.normalize("NFD", "Über")
WORDS = [
    "Über",
    "über",
    "ÜBER",
    NFD_UBER,
    "École",
    "Москву",
    "Straße",
    "İstanbul",
    "ǅemal",
    "東京都に行きました",
    "日本語",
    "カタカナ",
    "ｶﾀｶﾅ",
    "の",
    "。",
    "，",
    "the",
    "The",
    "is",
    "a",
    "and",
    "it's",
    "don't",
    "running",
    "runs",
    "ran",
    "runner",
    "happy",
    "happiness",
    "skies",
    "dying",
    "generously",
    "group",
    "groups",
    "foo_bar",
    "_",
    "42",
    "3.14",
    "v2",
    "Caroline:",
    "(retold",
    "note",
    "12372)",
    "e-mail",
    "co-op",
    "naïve",
    "café",
    "x\x1cy",
    "\t",
    "\n",
    "Ω",
    "ΣΊΣΥΦΟΣ",
    "١٢٣",
    "😀",
]
_word_text = st.lists(st.sampled_from(WORDS), max_size=40).map(" ".join)
_any_text = st.one_of(_word_text, st.text(max_size=60), st.text(alphabet="ab _-.'Ü東京", max_size=30))
_field_value = st.one_of(
    _any_text.map(str.encode),
    st.binary(max_size=20),  # not UTF-8: decoded with replacement
    st.just(b""),
)
_fields = st.dictionaries(st.sampled_from([n.encode() for n, _ in TEXT_FIELDS]), _field_value, max_size=4)


@st.composite
def _query(draw, hits: list[dict[bytes, bytes]]) -> dict[str, float]:
    """Stems the hits hold and some they do not (a query text's), each with an idf."""
    held = sorted({s for h in hits for s in ref_terms(h)[0]})
    picked = draw(st.lists(st.sampled_from(held), max_size=6, unique=True)) if held else []
    picked += list(relevance.query_words(draw(_word_text)))
    idfs = st.one_of(
        st.integers(0, 20_000).map(relevance.idf), st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False)
    )
    return {s: draw(idfs) for s in dict.fromkeys(picked)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), hits=st.lists(_fields, max_size=25))
def test_pool_scorer_equals_the_scalar_formula_to_the_bit(data, hits):
    query = data.draw(_query(hits))
    want = [ref_relevance(query, *ref_terms(h)) for h in hits]
    memos = terms.Memos()
    for _ in range(2):  # computed, then remembered
        got = relevance.keyword_relevances(query, hits, memos)
        assert got.dtype == np.float64 and got.shape == (len(hits),)
        assert [x.hex() for x in got.tolist()] == [x.hex() for x in want]


@settings(max_examples=300, deadline=None)
@given(fields=_fields)
def test_episode_terms_equal_the_definition(fields):
    tf, length = ref_terms(fields)
    got = terms.Memos().hit_terms(fields)
    assert got.tf == tf and got.length == length
    assert [got.tf[s].hex() for s in tf] == [tf[s].hex() for s in tf]


# pieces that the folding changes: accents (composed and not), full-width, strokes, scripts written
# without spaces and their marks, ASCII punctuation beside them, a combining overlay (`<` + U+0338 is `≮`)
_FOLDED = "서울역에서ÉcoleŁódźภาษาไทยที่ำ今天玩東京駅でｶﾀｶﾅहिन्दीສະບາຍດີភាសាខ្មែរမြန်မာİΣΟΦΙΑςﬁ①¹ΐ ,.-'<=()\u0338\u0301\u3099aZ9_\u00a0\u3000、"


@settings(max_examples=1500, deadline=None)
@given(
    text=st.one_of(_word_text, st.text(max_size=80), st.text(alphabet=_FOLDED, max_size=40)).map(str.encode)
)
def test_split_is_the_folded_regex_split(text):
    """`text_stems` folds a non-ASCII text a piece at a time: the same words as folding it whole."""
    found = _REF_WORD.findall(fold_for_search(text.decode("utf-8", "replace")))
    want = Counter(terms.STEMMER.stemWords([w for w in found if w not in STOPWORDS]))
    assert terms.Memos().text_stems(text) == want


def test_the_unicode_cases_by_hand():
    """The cases the index folding exists for, spelled out (no hypothesis draw needed to reach them)."""
    hits = [
        {b"task": "Über den Fluss".encode()},
        {b"task": NFD_UBER.encode(), b"result": b"UBER uber"},
        {b"task": "東京都に行きました".encode()},
        {b"task": b"the is a and"},  # stop words only: length 0
        {b"solution": b"Groups of groups, grouped"},
        {},
    ]
    query = {s: relevance.idf(3) for s in relevance.query_words("über 東京 group uber")}
    want = [ref_relevance(query, *ref_terms(h)) for h in hits]
    assert relevance.keyword_relevances(query, hits, terms.Memos()).tolist() == want
    assert want[0] > 0 and want[2] > 0 and want[4] > 0 and want[3] == want[5] == 0.0
    assert not terms.Memos().hit_terms(hits[3]).tf and terms.Memos().hit_terms(hits[3]).length == 0.0
    assert relevance.keyword_relevances({}, hits, terms.Memos()).tolist() == [0.0] * len(hits)
    assert relevance.keyword_relevances(query, [], terms.Memos()).tolist() == []


def test_field_weights_are_exact_in_products():
    """The pool scorer sums a stem's counts before weighting (`Memos._texts_terms`): equal to the reference's
    per-word sum only while weight × count is exact, as for integral weights."""
    assert all(float(w).is_integer() and w > 0 for _, w in TEXT_FIELDS)
