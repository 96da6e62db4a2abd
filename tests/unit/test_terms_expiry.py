"""The memos of episode words (`services.query.recall.terms.Recent`) forget what was not used for their TTL: the
erasure window of a forgotten episode's text in the query process (docs/reliability.md)."""

from __future__ import annotations

import pytest

from services.query.recall import terms
from services.query.recall.terms import Recent


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_an_entry_not_used_again_is_gone_within_ttl_plus_two_sweeps() -> None:
    clock = Clock()
    made: list[str] = []

    def make(key: str) -> int:
        made.append(key)
        return len(key)

    memo: Recent[str, int] = Recent(make, cap=1_000, ttl=60.0, clock=clock)

    for step in range(200):  # a sweep every second; "kept" used every 10 s, "gone" once at 0.5 s
        clock.t = step * 1.0
        if step % 10 == 0:
            assert memo["kept"] == 4
        if step == 0:
            clock.t = 0.5
            memo["gone"]
        memo.expire()
        if clock.t >= 0.5 + 60.0 + 2.0:
            assert "gone" not in memo and "gone" not in memo.old
    assert made.count("kept") == 1  # used within the TTL each time: never made again
    assert made.count("gone") == 1


def test_an_entry_is_remembered_while_it_is_used() -> None:
    clock = Clock()
    memo: Recent[str, int] = Recent(len, cap=1_000, ttl=60.0, clock=clock)
    assert memo["a"] == 1
    clock.t = 31.0
    memo.expire()  # rotated: "a" is old now, still answered and moved back
    assert "a" in memo.old
    memo.make = lambda _: pytest.fail("made again")
    assert memo["a"] == 1
    assert "a" in memo and "a" not in memo.old


def test_expire_after_a_long_pause_drops_both_generations() -> None:
    clock = Clock()
    memo: Recent[str, int] = Recent(len, cap=1_000, ttl=60.0, clock=clock)
    assert memo["a"] == 1
    clock.t = 100.0
    memo.expire()
    assert not memo and not memo.old


def test_the_memo_never_holds_more_than_its_cap() -> None:
    memo: Recent[int, int] = Recent(lambda k: k, cap=100, ttl=60.0, clock=Clock())
    for i in range(1_000):
        assert memo[i] == i
        assert len(memo) + len(memo.old) <= 100
    memo.make = lambda _: pytest.fail("made again")
    assert memo[999] == 999


def test_the_memos_expire_drops_a_texts_terms_and_its_stems() -> None:
    clock = Clock()
    memos = terms.Memos(clock)
    text = b"Zanzibarian quokkas photographed"
    got = memos.hit_terms({b"task": text})
    assert "quokka" in got.tf
    key = next(k for k in memos.terms if text in k)
    assert b"quokkas" in memos.stems
    clock.t += terms.TERMS_TTL / 2
    memos.expire()
    clock.t += terms.TERMS_TTL / 2
    memos.expire()
    assert key not in memos.terms and key not in memos.terms.old
    assert b"quokkas" not in memos.stems and b"quokkas" not in memos.stems.old
    assert memos.hit_terms({b"task": text}) == got  # made again, the same


def test_the_stemmer_keeps_no_words_of_its_own() -> None:
    # PyStemmer caches every word it stems for the life of the process unless told not to: a forgotten
    # episode's words would outlive the memos' window there
    assert terms.STEMMER.maxCacheSize == 0
