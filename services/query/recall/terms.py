"""An episode's terms as `services.query.recall.relevance` scores them: stems, their weighted counts,
the length. Each text field is folded and split into words (`shared.keywords.words`, as RediSearch's
tokenizer splits the folded text), stop words dropped, the rest Snowball-stemmed (PyStemmer's English
stemmer); a stem's term frequency is the sum over fields of the field's weight
(`shared.index.TEXT_FIELDS`) times its count there, and the length the same sum over every kept word.

Tokenising the pool's texts was a recall's largest Python cost (`bench.recall_cpu --profile`), so:
ASCII text is lower-cased and split in one `bytes.translate` (the table is built from the same `\\w`
regex); each distinct word is stemmed once (`Memos.stems`); a one-field text keeps integer counts with
its weight beside it (`Terms.scale`); terms are remembered per distinct texts (`Memos.terms`).

Erasure: the memos hold episode words in process memory, dropped TERMS_TTL after their last use once
`Memos.expire` runs (every second, `services.query.app`): docs/reliability.md "What is erased, where, when".
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Mapping
from functools import lru_cache
from itertools import filterfalse
from typing import Any, NamedTuple, TypeVar

import Stemmer  # PyStemmer: Snowball in C

from shared.index import TEXT_FIELDS
from shared.keywords import STOPWORDS, words

_WORD = re.compile(r"\w+", re.UNICODE)
FIELD_KEYS = tuple((name, name.encode(), weight) for name, weight in TEXT_FIELDS)
"""(name, name as bytes, weight) of each text field, in `TEXT_FIELDS` order."""
_BYTE_NAMES = tuple(b for _, b, _ in FIELD_KEYS)
# ASCII bytes → the folded text with every non-word byte a space; bytes of UTF-8 sequences unchanged
_ASCII_WORDS = bytes(
    i if i >= 128 else ord(ch.lower()) if _WORD.fullmatch(ch) else ord(" ")
    for i, ch in ((i, chr(i)) for i in range(256))
)
_IS_STOP = STOPWORDS.__contains__
STEMS_CACHE = 200_000
"""Distinct words whose stem is remembered (~100 bytes each)."""
TERMS_CACHE = 50_000
"""Distinct episode texts whose terms are remembered (`Memos.hit_terms`)."""
TERMS_TTL = 60.0
"""Seconds after its last use within which `expire` drops a remembered text or stem (the erasure
window of the memos; a pool member of a busy namespace is used again well within it)."""

K = TypeVar("K")
V = TypeVar("V")


class Recent(dict[K, V]):
    """A memo bounded by count and by age since last use: two generations, `self` (young) and `old`.

    A look-up misses in `self`, then finds the entry in `old` and moves it back (`get_or`); `rotate`
    (from `expire` once the young generation is `ttl / 2` old, or when it reaches `cap / 2` entries)
    makes the young generation old and drops the old one. So an entry last used at u is gone by the
    second rotation after u: within `ttl` + 2·i of u when `expire` is called every i seconds, and the
    memo never holds more than `cap` entries. A hit in the young generation is one dict
    look-up, as in the `functools.lru_cache` this replaces, without its linked list.
    """

    def __init__(self, cap: int, ttl: float, clock: Any = time.monotonic):
        super().__init__()
        self.cap, self.ttl, self.clock = cap, ttl, clock
        self.old: dict[K, V] = {}
        self.born = clock()

    def get_or(self, key: K, make: Any) -> V:
        """The remembered value of `key`, or `make(key)` remembered."""
        value = self.get(key)
        if value is not None:
            return value
        value = self.old.pop(key, None)
        if value is None:
            value = make(key)
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
        if age >= self.ttl:
            self.old = {}
            self.clear()
            self.born = self.clock()
        elif age >= self.ttl / 2:
            self.rotate()


@lru_cache(maxsize=1)
def stemmer() -> Any:
    """PyStemmer's English (Snowball) stemmer, the algorithm RediSearch stems with. Its own word cache is
    off: it would keep a forgotten episode's words without end; `Memos` keep stems 60 s at most."""
    return Stemmer.Stemmer("english", 0)


def _stem(word: str) -> str:
    stem: str = stemmer().stemWord(word)
    return stem


def _token_words(token: bytes) -> tuple[str, ...]:
    return tuple(words(token.decode("utf-8", "replace")))


class _Stems(Recent[str, str]):
    """word → stem, filled on first sight."""

    def __missing__(self, word: str) -> str:
        return self.get_or(word, _stem)


class _Folds(Recent[bytes, tuple[str, ...]]):
    """token → its words (`shared.keywords.words`), filled on first sight."""

    def __missing__(self, token: bytes) -> tuple[str, ...]:
        return self.get_or(token, _token_words)


class Terms(NamedTuple):
    """An episode's terms: `tf[stem] * scale` is the stem's weighted term frequency, `length` the
    weighted length (stop words not counted). `scale` is a one-field text's weight (its counts are
    integers), 1.0 for texts of several fields (their counts already weighted). Shared: never mutate."""

    tf: Mapping[str, float]
    scale: float
    length: float


_WEIGHTS = tuple(w for _, _, w in FIELD_KEYS)


class Memos:
    """The memos of episode words, one per query service (`services.query.appkeys.TERMS`): `stems`
    (word → stem, at most STEMS_CACHE), `folds` (non-ASCII token → words, STEMS_CACHE) and `terms`
    (distinct texts → `Terms`, TERMS_CACHE), each dropping what was not used for TERMS_TTL (`expire`)."""

    def __init__(self, clock: Any = time.monotonic):
        self.stems = _Stems(STEMS_CACHE, TERMS_TTL, clock)
        self.folds = _Folds(STEMS_CACHE, TERMS_TTL, clock)
        self.terms: Recent[tuple[bytes | None, ...], Terms] = Recent(TERMS_CACHE, TERMS_TTL, clock)

    def text_words(self, text: bytes) -> list[str]:
        """The words of one UTF-8 field (invalid bytes replaced) as the index holds them, stop words
        kept. Non-ASCII text is cut at ASCII spaces and punctuation first, each piece folded once
        (`folds`): folding never joins or moves characters across those, so the words are `words(text)`'s."""
        if text.isascii():
            return text.translate(_ASCII_WORDS).decode("ascii").split()
        out: list[str] = []
        folds = self.folds.__getitem__
        for token in text.translate(_ASCII_WORDS).split():
            out += folds(token)
        return out

    def weighted_terms(self, texts: tuple[bytes | None, ...], weights: tuple[float, ...]) -> Terms:
        """The `Terms` of `texts` with each text's weight from `weights` (same order), not remembered.
        Counts are summed per field before the weight multiplies them: exact while weight × count is,
        as for `TEXT_FIELDS`' weights 2 and 1."""
        stems = self.stems.__getitem__
        found = [
            (Counter(map(stems, filterfalse(_IS_STOP, self.text_words(text)))), weight)
            for text, weight in zip(texts, weights, strict=True)
            if text
        ]
        if len(found) == 1:
            counts, weight = found[0]
            return Terms(counts, weight, weight * counts.total())
        tf: dict[str, float] = {}
        length = 0.0
        for counts, weight in found:  # in field order, as the weighted sum was always taken
            length += weight * counts.total()
            for s, n in counts.items():
                tf[s] = tf.get(s, 0.0) + weight * n
        return Terms(tf, 1.0, length)

    def hit_terms(self, fields: Mapping[bytes, bytes]) -> Terms:
        """The `Terms` of a search hit's fields (bytes names and values, as `parse_search` returns them),
        remembered per distinct texts."""
        texts = tuple(map(fields.get, _BYTE_NAMES))
        got = self.terms.get(texts)
        return got if got is not None else self.terms.get_or(texts, self._texts_terms)

    def _texts_terms(self, texts: tuple[bytes | None, ...]) -> Terms:
        return self.weighted_terms(texts, _WEIGHTS)

    def expire(self) -> None:
        """Drop what was not used for TERMS_TTL (`Recent.expire`: within TERMS_TTL + 2·i when called
        every i seconds; the query service calls it every second)."""
        for memo in (self.terms, self.stems, self.folds):
            memo.expire()
