"""The episode's tie-break: a number per episode (SORTABLE NUMERIC field `tiebreak`) that orders
episodes of equal value in recall's lists and ranking and in the listing (`shared.index_pages.page`).
It depends on the episode id alone, so exact ties order the same way in every namespace."""

from __future__ import annotations

import hashlib

from shared.tags import TagCodec

TIE = b"tie"
"""The kind of id `tie_tag` digests (`shared.tags.TagCodec.digest`): its own, so no TAG field's value
can be matched with a tie-break."""

TIE_FIELD = "tiebreak"
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
    on every re-projection and in every namespace (a rare shared value only costs a full sort)."""
    digest = hashlib.blake2b(episode_tag.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % TIE_RANGE
