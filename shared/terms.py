"""An episode's terms as `shared.relevance` scores them: stems, their weighted counts, the length (pure).

The definition (unchanged from the first `shared.relevance`): each text field is folded
(`shared.keywords.fold_for_search`), split into Unicode `\\w+` words, RediSearch's stop words are
dropped, the rest Snowball-stemmed (PyStemmer's English stemmer); a stem's term frequency is the sum
over fields of the field's weight (`shared.index.TEXT_FIELDS`) times its count there, and the length
the same sum over every kept word.

Why a module of its own: a recall scores every member of its candidate pool (~300), and tokenising a
member's text was the largest Python cost of a recall (docs/benchmarks.md, issue 20). What makes it
cheaper here, none of which changes a term or a count:
- ASCII text (the common case) is lower-cased and split in one `bytes.translate` + `split`: for ASCII,
  `fold_for_search` is `str.lower` and `\\w` is `[0-9A-Za-z_]`, and the table is built from that same
  regex, so the words are the regex's words; other text goes through `fold_for_search` and the regex.
- Each distinct word is stemmed once per process (`_STEMS`, bounded), not once per text.
- The counts of a one-field text stay integers with the field's weight beside them (`Terms.scale`):
  the scorer multiplies a count by the weight as the sum over fields did (exact: one product).
- The result is remembered per distinct texts (the last TERMS_CACHE), as before.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from functools import lru_cache
from itertools import filterfalse
from typing import Any, NamedTuple

from shared.index import TEXT_FIELDS
from shared.keywords import STOPWORDS, fold_for_search

_WORD = re.compile(r"\w+", re.UNICODE)
FIELD_KEYS = tuple((name, name.encode(), weight) for name, weight in TEXT_FIELDS)
"""(name, name as bytes, weight) of each text field, in `TEXT_FIELDS` order."""
_BYTE_NAMES = tuple(b for _, b, _ in FIELD_KEYS)
# ASCII bytes → the folded text with every non-word byte a space (non-ASCII bytes never reach it)
_ASCII_WORDS = bytes(
    ord(ch.lower()) if _WORD.fullmatch(ch) else ord(" ") if i < 128 else i
    for i, ch in ((i, chr(i)) for i in range(256))
)
_IS_STOP = STOPWORDS.__contains__
STEMS_CACHE = 200_000
"""Distinct words whose stem is remembered (~100 bytes each); the memo starts afresh past it."""
TERMS_CACHE = 50_000
"""Distinct episode texts whose terms are remembered (`texts_terms`)."""


@lru_cache(maxsize=1)
def stemmer() -> Any:
    """PyStemmer's English (Snowball) stemmer, the algorithm RediSearch stems with."""
    import Stemmer  # PyStemmer: Snowball in C

    return Stemmer.Stemmer("english", 100_000)


class _Stems(dict[str, str]):
    """word → stem, filled on first sight."""

    def __missing__(self, word: str) -> str:
        if len(self) >= STEMS_CACHE:
            self.clear()
        stem: str = stemmer().stemWord(word)
        self[word] = stem
        return stem


_STEMS = _Stems()


def text_words(text: bytes) -> list[str]:
    """The words of one UTF-8 field (invalid bytes replaced) as the index holds them, stop words kept."""
    if text.isascii():
        return text.translate(_ASCII_WORDS).decode("ascii").split()
    return _WORD.findall(fold_for_search(text.decode("utf-8", "replace")))


class Terms(NamedTuple):
    """An episode's terms: `tf[stem] * scale` is the stem's weighted term frequency, `length` the
    weighted length (stop words not counted). `scale` is a one-field text's weight (its counts are
    integers), 1.0 for texts of several fields (their counts already weighted). Shared: never mutate."""

    tf: Mapping[str, float]
    scale: float
    length: float


def texts_terms(texts: tuple[bytes | None, ...]) -> Terms:
    """The `Terms` of one episode's text fields (`texts`: UTF-8 or None, in `FIELD_KEYS` order),
    remembered per distinct texts (the last TERMS_CACHE)."""
    return _texts_terms(texts)


def weighted_terms(texts: tuple[bytes | None, ...], weights: tuple[float, ...]) -> Terms:
    """The `Terms` of `texts` with each text's weight from `weights` (same order), not remembered.

    Counts are summed per field before the weight multiplies them (`weight * (n1 + n2)` for two words
    of one stem), which equals the per-word sum exactly while weight × count is exact, as for
    `TEXT_FIELDS`' weights 2 and 1."""
    stems = _STEMS.__getitem__
    found = [
        (Counter(map(stems, filterfalse(_IS_STOP, text_words(text)))), weight)
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


_WEIGHTS = tuple(w for _, _, w in FIELD_KEYS)


@lru_cache(maxsize=TERMS_CACHE)
def _texts_terms(texts: tuple[bytes | None, ...]) -> Terms:
    return weighted_terms(texts, _WEIGHTS)


def hit_terms(fields: Mapping[bytes, bytes]) -> Terms:
    """The `Terms` of a search hit's fields (bytes names and values, as `parse_search` returns them)."""
    return _texts_terms(tuple(map(fields.get, _BYTE_NAMES)))


def field_texts(fields: Mapping[Any, str | bytes | None]) -> tuple[bytes | None, ...]:
    """The text fields of `fields` (names str or bytes, values str or UTF-8 bytes) in `FIELD_KEYS` order."""
    texts = []
    for name, bname, _ in FIELD_KEYS:
        text = fields.get(name)
        if text is None:
            text = fields.get(bname)
        texts.append(text.encode() if isinstance(text, str) else text)
    return tuple(texts)
