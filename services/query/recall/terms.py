"""An episode's terms as `services.query.recall.relevance` scores them: stems, their weighted counts,
the length. Each text field is folded and split into words (`shared.keywords.words`, as RediSearch's
tokenizer splits the folded text), stop words dropped, the rest Snowball-stemmed (PyStemmer's English
stemmer); a stem's term frequency is the sum over fields of the field's weight
(`shared.index.TEXT_FIELDS`) times its count there, and the length the same sum over every kept word.
Tokenising is a recall's largest Python cost, hence the memos (`Memos`), which drop what was not used
for TERMS_TTL: docs/reliability.md "What is erased, where, when".
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Any, NamedTuple, TypeVar

import Stemmer  # PyStemmer: Snowball in C

from shared.index import TEXT_FIELDS
from shared.keywords import STOPWORDS, words

_BYTE_NAMES = tuple(name.encode() for name, _ in TEXT_FIELDS)
# ASCII bytes → the folded text with every non-word byte a space; bytes of UTF-8 sequences unchanged
_ASCII_WORDS = bytes(
    i if i >= 128 else ord(ch.lower()) if ch.isalnum() or ch == "_" else ord(" ")
    for i, ch in ((i, chr(i)) for i in range(256))
)
STEMS_CACHE = 200_000
"""Distinct pieces of text whose stems are remembered (~100 bytes each)."""
TERMS_CACHE = 50_000
"""Distinct episode texts whose terms are remembered (`Memos.hit_terms`)."""
TERMS_TTL = 60.0
"""Seconds after its last use within which `expire` drops a remembered text or stem (the erasure
window of the memos; a pool member of a busy namespace is used again well within it)."""

K = TypeVar("K")
V = TypeVar("V")


class Recent(dict[K, V]):
    """A memo bounded by count and by age since last use: two generations, `self` (young) and `old`.

    `memo[key]` is the remembered value or `make(key)`, remembered: a miss in `self` finds the entry in
    `old` and moves it back, else makes it (`__missing__`; a hit is one dict look-up). `rotate`
    (from `expire` once the young generation is `ttl / 2` old, or when it reaches `cap / 2` entries)
    makes the young generation old and drops the old one. So an entry last used at u is gone within
    `ttl` + 2·i of u when `expire` is called every i seconds, and never more than `cap` are held.
    """

    def __init__(self, make: Callable[[K], V], cap: int, ttl: float, clock: Any = time.monotonic):
        super().__init__()
        self.make, self.cap, self.ttl, self.clock = make, cap, ttl, clock
        self.old: dict[K, V] = {}
        self.born = clock()

    def __missing__(self, key: K) -> V:
        value = self.old.pop(key, None)
        if value is None:
            value = self.make(key)
        if len(self) >= self.cap // 2:
            self.rotate()
        self[key] = value
        return value

    def rotate(self) -> None:
        """Young becomes old; what was old is dropped."""
        self.old = dict(self)
        self.clear()
        self.born = self.clock()

    def expire(self) -> None:
        """`rotate` if the young generation is `ttl / 2` old; both dropped if it is `ttl` old (nothing
        was used since, or `expire` was not called for that long)."""
        age = self.clock() - self.born
        if age >= self.ttl / 2:
            self.rotate()
            if age >= self.ttl:
                self.old = {}


STEMMER = Stemmer.Stemmer("english", 0)
"""PyStemmer's English (Snowball) stemmer, the algorithm RediSearch stems with; its own word cache is
off (it would keep a forgotten episode's words without end)."""


def _piece_stems(piece: bytes) -> tuple[str, ...]:
    """The stems of a piece of UTF-8 text (invalid bytes replaced) without ASCII spaces or punctuation,
    stop words dropped: an ASCII piece is one word, a non-ASCII one folds into words (`words`)."""
    if piece.isascii():  # one word, lower-cased already
        word = piece.decode()
        return () if word in STOPWORDS else (STEMMER.stemWord(word),)
    return tuple(STEMMER.stemWord(w) for w in words(piece.decode("utf-8", "replace")) if w not in STOPWORDS)


class Terms(NamedTuple):
    """An episode's terms: `tf[stem]` is the stem's weighted term frequency, `length` the weighted
    length (stop words not counted). Shared: never mutate."""

    tf: Mapping[str, float]
    length: float


class Memos:
    """The memos of episode words, one per query service (`services.query.appkeys.TERMS`): `stems`
    (a piece of text → its stems, `_piece_stems`, at most STEMS_CACHE) and `terms` (distinct texts →
    `Terms`, TERMS_CACHE), each dropping what was not used for TERMS_TTL (`expire`)."""

    def __init__(self, clock: Any = time.monotonic):
        self.stems: Recent[bytes, tuple[str, ...]] = Recent(_piece_stems, STEMS_CACHE, TERMS_TTL, clock)
        self.terms: Recent[tuple[bytes | None, ...], Terms] = Recent(
            self._texts_terms, TERMS_CACHE, TERMS_TTL, clock
        )

    def text_stems(self, text: bytes) -> Counter[str]:
        """The stems of one UTF-8 field and their counts, as the index holds its words: the text cut at
        ASCII spaces and punctuation (in C), each piece's stems from `stems`. Folding never joins or
        moves characters across those cuts, so the words are `words(text)`'s."""
        return Counter(chain.from_iterable(map(self.stems.__getitem__, text.translate(_ASCII_WORDS).split())))

    def _texts_terms(self, texts: tuple[bytes | None, ...]) -> Terms:
        """The `Terms` of `texts` (`TEXT_FIELDS` order), each weighted by its field. Counts are summed per
        field before the weight multiplies them: exact while weight × count is, as for weights 2 and 1."""
        tf: dict[str, float] = {}
        length = 0.0
        for text, (_, weight) in zip(texts, TEXT_FIELDS, strict=True):
            if text:
                counts = self.text_stems(text)
                length += weight * counts.total()
                for stem, n in counts.items():
                    tf[stem] = tf.get(stem, 0.0) + weight * n
        return Terms(tf, length)

    def hit_terms(self, fields: Mapping[bytes, bytes]) -> Terms:
        """The `Terms` of a search hit's fields (bytes names and values, as `parse_search` returns them),
        remembered per distinct texts."""
        return self.terms[tuple(map(fields.get, _BYTE_NAMES))]

    def expire(self) -> None:
        """Drop what was not used for TERMS_TTL (`Recent.expire`)."""
        for memo in (self.terms, self.stems):
            memo.expire()
