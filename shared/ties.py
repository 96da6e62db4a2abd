"""The episode's tie-break: a number per episode, written by the projection as the SORTABLE NUMERIC
field `tiebreak` (`shared.index.episode_fields`), that orders episodes of equal value in the recency /
reward / importance lists (`services.query.lists.top_by`), so those lists' floors narrow at a tie."""

from __future__ import annotations

import hashlib

TIE_FIELD = "tiebreak"
"""A number per episode (`tie_break`) that orders episodes of equal value in the recency / reward /
importance lists (`services.query.lists.top_by`), so those lists' floors can be remembered at a tie."""
TIE_RANGE = 10**12
"""`tie_break`'s values are the integers in [0, TIE_RANGE): a SORTABLE value is returned with 12
significant digits, which these keep exactly."""


def tie_break(episode_tag: str) -> int:
    """The episode's `tiebreak` field: an integer in [0, TIE_RANGE) from BLAKE2b of its `episode_id`
    TAG value (the keyed digest of the id, `shared.tags`, so no plain id's hash is stored), the same on
    every re-projection. Two of 100k episodes share one with probability ~0.5% (birthday bound
    n^2 / 2 TIE_RANGE); a list whose boundary falls on such a pair is sorted in full (still exact)."""
    digest = hashlib.blake2b(episode_tag.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % TIE_RANGE
