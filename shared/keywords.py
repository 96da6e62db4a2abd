"""Words as the keyword (BM25) arm sees them: Unicode normalisation and folding, character pairs for
scripts written without spaces, stop words (pure). The index and the queries both go through
`fold_for_search`, so they agree on every word whatever its script or case.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from operator import add

import regex

# regex's \w: letters, marks, digits, connector punctuation. The stdlib's \w leaves out combining
# marks, so it would cut Thai or Hindi words apart where RediSearch keeps them whole.
_NON_WORD = regex.compile(r"[^\w]+")
_ASCII_WORD = re.compile(r"\w+")  # on ASCII text the same words, with the stdlib's faster engine
# accents: the combining diacritical marks of Latin, Greek and Cyrillic letters once NFKD has split them
_ACCENTS = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\ufe20-\ufe2f]+")
# Latin letters with a stroke or ligatures, which have no decomposition to take the accent off
_LETTERS = {"ł": "l", "ø": "o", "đ": "d", "ħ": "h", "ı": "i", "ŧ": "t", "æ": "ae", "œ": "oe"}
_LETTER = re.compile(f"[{''.join(_LETTERS)}]")
# Runs of one script written without spaces between words. Group 1: Han and kana (one run: Japanese
# mixes them), or Hangul (Korean spaces its words but writes particles and endings onto them), whose
# characters are the units. Group 2: Thai, Lao, Khmer, Myanmar, whose units are a letter with its
# marks (ที่ is one unit, `_CLUSTER`).
_HAN_KANA = (
    "\u2e80-\u2fdf\u3005-\u3007\u3021-\u3029\u3031-\u3035\u3038-\u303b\u3040-\u30ff\u31f0-\u31ff"
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U0001b000-\U0001b16f\U00020000-\U0003134f"
)
_HANGUL = "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff"
_SOUTHEAST = {  # Thai, Lao, Khmer, Myanmar
    "thai": "\u0e00-\u0e7f",
    "lao": "\u0e80-\u0eff",
    "khmer": "\u1780-\u17ff\u19e0-\u19ff",
    "myanmar": "\u1000-\u109f\ua9e0-\ua9ff\uaa60-\uaa7f",
}
_UNSPACED = re.compile(
    f"([{_HAN_KANA}]+|[{_HANGUL}]+)|" + "|".join(f"[{chars}]+" for chars in _SOUTHEAST.values())
)
_CLUSTER = regex.compile(r"\X")


def _pairs(match: re.Match[str]) -> str:
    run = match.group()
    units: Sequence[str] = run if match.lastindex == 1 else _CLUSTER.findall(run)
    if len(units) < 3:
        return f" {run} "
    return " " + " ".join(map(add, units, units[1:])) + " "


def fold_for_search(text: str) -> str:
    """The form of a text the BM25 index holds and a keyword query is built from (idempotent).

    - NFKC compatibility forms: full-width `ＡＢＣ１２３` is `abc123`, half-width `ｶﾅ` is `カナ`, `ﬁ` is `fi`.
    - Case folding (`str.casefold`): RediSearch 2.10 lower-cases only ASCII, so `Москву`, `Über` would
      be indexed with their capitals while queries are lower-cased, and never match.
    - Accents off (the combining marks NFKD splits from Latin, Greek, Cyrillic letters, and the stroke
      letters of `_LETTERS`): `École` is `ecole`, `Łódź` is `lodz`, as a query typed without them.
    - Every character that is not a letter, mark, digit or `_` is a space: RediSearch splits words at
      ASCII punctuation only, so `«word»` or `word、` would be one token holding the punctuation.
    - Runs of scripts written without spaces (`_UNSPACED`) as overlapping pairs of characters (Lucene's
      CJKAnalyzer approach): a word inside a clause, or a Korean noun with its particle attached
      (`서울역에서` holds `서울 울역`, the pairs of `서울역`), matches as its pairs; no dictionary, so
      index and queries always split alike. A run of one character stays one term.
    """
    if text.isascii():  # the common case, far cheaper
        return text.lower()
    folded = _ACCENTS.sub("", unicodedata.normalize("NFKD", text).casefold())
    folded = unicodedata.normalize("NFKC", folded)
    folded = _LETTER.sub(lambda m: _LETTERS[m.group(0)], folded)
    return _UNSPACED.sub(_pairs, _NON_WORD.sub(" ", folded))


def words(text: str) -> list[str]:
    """The words of `text` as the index holds them: `fold_for_search`, then the words RediSearch's
    tokenizer sees (runs of letters, marks, digits, `_`), stop words kept, in order."""
    if text.isascii():
        return _ASCII_WORD.findall(text.lower())
    return fold_for_search(text).split()


# RediSearch's default stop words (the index is created without STOPWORDS, so these apply). They are
# dropped from keyword queries: they match nothing, and a union starting with two of them
# (`@task:(is | it | nate)`) crashes redisearch.so 2.x.
STOPWORDS = frozenset(
    (
        "a",
        "is",
        "the",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    )
)
