"""Absolute relevance of one episode to one query.

Recall's similarity signal (`relevances`, in [0, 1]) is never rescaled per result set: that would give
an off-topic query sharing one word relevance 1.0, and storing unrelated episodes would change an
episode's score for the same query. Each arm is a fixed function:

- vector: `max(0, cos)`, the cosine between the query's and the episode's embeddings.
- keyword: `s / (s + KEYWORD_HALF)`, a saturating transform of a BM25 score (Robertson & Zaragoza
  2009, BM25F field weights of `shared.index.TEXT_FIELDS`) computed here with fixed constants:

      s = sum over the query's distinct terms t of
          idf(t) * tf(t)·(K1+1) / (tf(t) + K1·(1 - B + B·len/LEN_REF))
      idf(t) = ln(1 + REFERENCE_EPISODES / (n(t) + 0.5))

  `tf` and `len` are the episode's own (weighted) term frequency and length; LEN_REF is a fixed
  reference length instead of the index's average; `n(t)` is how many episodes *of the caller's
  namespace* contain the term (`shared.index.term_counts`), against a fixed reference collection of
  REFERENCE_EPISODES instead of the index's size: nothing another namespace stores changes it.
- hybrid: `HYBRID_VECTOR_WEIGHT · max(0, cos) + (1 - HYBRID_VECTOR_WEIGHT) · keyword`, a convex
  combination of the two absolute values (a query with no word left after stop words is vector-only).

Terms are the index's (`services.query.recall.terms`). The constants were calibrated on LoCoMo
(docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from services.query.recall.terms import STEMMER, Memos
from shared.keywords import STOPWORDS, words

K1 = 1.2
"""Term-frequency saturation (BM25's k1)."""
B = 0.75
"""Length normalisation (BM25's b), against LEN_REF instead of the average length."""
LEN_REF = 40.0
"""Reference length in weighted terms: a 20-word task (the task field weighs 2)."""
REFERENCE_EPISODES = 100.0
"""The collection size idf is measured against: a word in half of 100 episodes weighs ln 3 ≈ 1.1,
one in a single episode ln 68 ≈ 4.2, one in 10,000 episodes ≈ 0.01."""
KEYWORD_HALF = 20.0
"""The BM25 score `s` at which keyword relevance is 0.5 (`s / (s + KEYWORD_HALF)`)."""
HYBRID_VECTOR_WEIGHT = 0.5
"""Share of the cosine in hybrid relevance; the rest is keyword relevance."""
MAX_TERMS = 64
CONTEXT_FLOOR = {"vector": 0.25, "hybrid": 0.15, "keyword": 1e-6}
"""The `min_relevance` of a `/v1/context` request that names none, per recall mode: an episode below it
is no experience of the task (chosen on LoCoMo: docs/benchmarks.md "Relevance floor"; keyword
relevance cannot tell a rare shared word from the evidence, so the keyword floor only asks for a word)."""


def _stemmed(text: str) -> list[tuple[str, str]]:
    """(word, stem) of each of `text`'s words as the index holds them (`shared.keywords.words`), stop
    words dropped."""
    kept = [w for w in words(text) if w not in STOPWORDS]
    return list(zip(kept, STEMMER.stemWords(kept), strict=True))


def query_words(text: str) -> dict[str, str]:
    """The query's distinct stems (at most MAX_TERMS), each with the first word that gave it."""
    out: dict[str, str] = {}
    for word, stem in _stemmed(text):
        out.setdefault(stem, word)
        if len(out) >= MAX_TERMS:
            break
    return out


def idf(n: int) -> float:
    """ln(1 + REFERENCE_EPISODES / (n + 0.5)) for a term `n` episodes of the namespace contain."""
    return math.log1p(REFERENCE_EPISODES / (max(0, n) + 0.5))


def query_terms(words: Mapping[str, str], counts: Sequence[int]) -> dict[str, float]:
    """{stem: idf} from `query_words` and the namespace's document count of each (same order)."""
    return {stem: idf(n) for stem, n in zip(words, counts, strict=True)}


def common_terms(terms: Mapping[str, float], below: float) -> set[str]:
    """The stems of `terms` ({stem: idf}, `query_terms`) whose idf is below `below`, the terms the BM25
    candidate query leaves out (scoring keeps every term): each adds little relevance, yet costs
    RediSearch a walk of its whole posting list. None for `below` <= 0 (every idf is > 0)."""
    return {stem for stem, weight in terms.items() if weight < below}


def common_count(below: float) -> float:
    """The document count above which a term's idf (`idf`) is below `below`, i.e. the fewest episodes a
    namespace must hold before `common_terms` can find any term common (inf for `below` <= 0)."""
    if below <= 0.0:
        return math.inf
    return REFERENCE_EPISODES / math.expm1(below) - 0.5


def without_terms(text: str, stems: set[str]) -> str:
    """`text`'s words (as `query_words` sees them) without those whose stem is in `stems`, space-joined:
    the BM25 candidate query of a text whose common terms are dropped (every word, not only the first
    of each stem, so the kept terms match as in the full query)."""
    return " ".join(w for w, s in _stemmed(text) if s not in stems)


def keyword_relevances(
    terms: Mapping[str, float], hits: Sequence[Mapping[bytes, bytes]], memos: Memos
) -> np.ndarray:
    """float64[n]: the keyword relevance `s / (s + KEYWORD_HALF)` (module docstring) of each search hit's
    fields (bytes names), the BM25 sum taken term by term in query order (not numpy's pairwise `sum`),
    so it equals the scalar formula to the last bit (tests/unit/test_relevance_pool.py). `memos`: the
    app's (`Memos`)."""
    n = len(hits)
    if not terms or not n:
        return np.zeros(n)
    stems = list(terms)
    zeros = [0] * len(stems)
    found = [memos.hit_terms(fields) for fields in hits]
    tf = np.array([list(map(t.tf.get, stems, zeros)) for t in found], dtype=np.float64)
    norm = K1 * (1.0 - B + B * np.array([t.length for t in found], dtype=np.float64) / LEN_REF)
    s = np.zeros(n)
    for j, weight in enumerate(terms.values()):
        f = tf[:, j]
        s = s + weight * f * (K1 + 1.0) / (f + norm)
    return np.where(s > 0.0, s / (s + KEYWORD_HALF), 0.0)


def max_keyword_relevance(terms: Mapping[str, float]) -> float:
    """An upper bound of the keyword relevance of any episode: every term saturated (s < (K1+1)·sum idf)."""
    s = (K1 + 1.0) * sum(terms.values())
    return s / (s + KEYWORD_HALF) if s > 0.0 else 0.0


def relevances(mode: str, cos: np.ndarray, keyword: np.ndarray) -> np.ndarray:
    """float64[n]: the similarity signal of `mode` (vector | keyword | hybrid) of each row, in [0, 1]:
    `max(0, cos)` (0 for a NaN cosine: no vector), `keyword`, or their hybrid mix (module docstring)."""
    keyword = np.asarray(keyword, dtype=np.float64)
    if mode == "keyword":
        return keyword
    cos = np.asarray(cos, dtype=np.float64)
    clipped = np.where(np.isfinite(cos) & (cos > 0.0), cos, 0.0)
    if mode == "vector":
        return clipped
    return HYBRID_VECTOR_WEIGHT * clipped + (1.0 - HYBRID_VECTOR_WEIGHT) * keyword
