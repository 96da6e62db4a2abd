"""The episode's tie-break: a number per episode, written by the projection as the SORTABLE NUMERIC
field `tiebreak` (`shared.index.episode_fields`), that orders episodes of equal value in the recency /
reward / importance lists (`services.query.recall.lists.top_by`), so those lists' floors narrow at a tie, in
recall's ranking (`services.query.recall.score.score`) and in the listing (`shared.index_pages.page`).

It depends on the episode id alone, not on the namespace (`tie_tag`): the same episodes stored in two
namespaces order their exact ties the same way everywhere. A document projected before this (its
value from the namespace's digest) keeps its old value until a replay; the order stays total."""

from __future__ import annotations

import hashlib

from shared.tags import TagCodec

TIE = b"tie"
"""The kind of id `tie_tag` digests (`shared.tags.TagCodec.digest`): its own, so no TAG field's value
can be matched with a tie-break."""

TIE_FIELD = "tiebreak"
"""A number per episode (`tie_break`) that orders episodes of equal value in the recency / reward /
importance lists (`services.query.recall.lists.top_by`), so those lists' floors can be remembered at a tie."""
TIE_RANGE = 10**12
"""`tie_break`'s values are the integers in [0, TIE_RANGE): a SORTABLE value is returned with 12
significant digits, which these keep exactly."""


def tie_tag(tags: TagCodec, episode_id: str) -> str:
    """What `tie_break` hashes for an episode: its id digested as the generation's TAG fields are
    (`shared.tags`: keyed, so no plain id's hash is stored) but without the namespace, so the order of
    exact ties is the same in every namespace."""
    return tags.digest(TIE, "", episode_id)


def tie_break(episode_tag: str) -> int:
    """The episode's `tiebreak` field: an integer in [0, TIE_RANGE) from BLAKE2b of `tie_tag`, the same
    on every re-projection and in every namespace. Two of 100k episodes share one with probability ~0.5% (birthday bound
    n^2 / 2 TIE_RANGE); a list whose boundary falls on such a pair is sorted in full (still exact)."""
    digest = hashlib.blake2b(episode_tag.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % TIE_RANGE
