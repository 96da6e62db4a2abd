"""The pure fold: an episode's events (any order, any duplicates) → its projected state.

Deterministic in the *set* of events: de-duplicated by `event_id` and sorted by `(occurred_at, kind,
event_id)`, so N workers folding interleaved deliveries reach the document a sequential replay does.
Later snapshots override earlier ones field by field (None never erases); actions are the union of
every snapshot's and every `ActionRecorded`, by `action_id`, in time order. A step that would break
the episode model (`validation.episode_problems`) is not applied. An episode belongs to its latest
user: a snapshot naming another `user_id` starts it afresh (`_current`), the earlier events reported
as `superseded` (the projector drops them, so a forget of an earlier user leaves none of its text).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from engram_episodic.events import (
    Action,
    ActionRecorded,
    Episode,
    EpisodeCompleted,
    EpisodeStarted,
    EpisodeUpdated,
    Event,
    updated,
)
from engram_episodic.timeutil import format_instant
from engram_episodic.validation import episode_problems
from shared.index import STATUS_COMPLETED, STATUS_DRAFT

# an update at the same instant as a snapshot applies after it (it changes what the snapshot set)
_KIND_ORDER = {EpisodeStarted: 0, ActionRecorded: 1, EpisodeCompleted: 2, EpisodeUpdated: 3}


@dataclass(frozen=True, slots=True)
class Folded:
    """The projection of one episode: `episode` None while only actions arrived (nothing to index);
    `first_occurred_at` (UTC epoch s) is compared with a forget time; `superseded` are the event ids
    of the episode's earlier users (`_current`)."""

    episode: Episode | None
    status: str
    first_occurred_at: float
    event_count: int
    superseded: frozenset[str] = frozenset()


def _merge(base: Episode | None, update: Episode) -> Episode:
    """`base` overridden by a later snapshot field by field (never the snapshot alone: base's user_id
    and expires_at stay), or unchanged when the episode model refuses the merge (`episode_problems`)."""
    if base is None:
        return update
    changes = {}
    for f in dataclasses.fields(Episode):
        value = getattr(update, f.name)
        if value is not None and value != ():
            changes[f.name] = value
    merged = dataclasses.replace(base, **changes)
    return base if episode_problems(merged) else merged


def _updated(base: Episode | None, update: EpisodeUpdated) -> Episode | None:
    """`base` with an update's changes (`events.updated`), or unchanged when the episode model refuses
    the result (an update accepted before its episode was projected, or two racing). None stays None:
    the update is folded again once the snapshot arrives."""
    if base is None:
        return None
    changed = updated(base, update)
    return base if episode_problems(changed) else changed


def _action_key(action: Action) -> tuple:
    """An action's identity: its `action_id`, else its content with the timestamp as the API writes it
    (ISO 8601, microseconds), so an exported and re-imported episode folds to the same actions."""
    if action.action_id:
        return (action.action_id,)
    return ("anon", dataclasses.replace(action, timestamp=None), format_instant(action.timestamp))


def _current(ordered: list[Event]) -> tuple[list[Event], frozenset[str]]:
    """The events of the episode's current user, in order, and the ids of the others: from the last
    snapshot whose `user_id` differs from the one before it, without updates sealed for another user."""
    start, user = 0, None
    for i, event in enumerate(ordered):
        if isinstance(event, EpisodeStarted | EpisodeCompleted) and event.episode.user_id is not None:
            if user is not None and event.episode.user_id != user:
                start = i
            user = event.episode.user_id
    if start == 0 and user is None:
        return ordered, frozenset()
    kept = [
        e
        for e in ordered[start:]
        if not (isinstance(e, EpisodeUpdated) and e.user_id is not None and e.user_id != user)
    ]
    if len(kept) == len(ordered):
        return ordered, frozenset()
    ids = {e.event_id for e in kept}
    return kept, frozenset(e.event_id for e in ordered if e.event_id not in ids)


def _completed(episode: Episode, at: float) -> Episode:
    """A completed episode has an outcome (`abandoned` when its completion gave none) and a
    `completed_at` (`at`, its first completion's instant, when none was given: `EngramClient.publish`
    of a bare Episode), so every episode the API answers with has both (`EpisodeOut` requires them)."""
    if episode.outcome is None:
        episode = dataclasses.replace(episode, outcome="abandoned")
    if episode.completed_at is None:
        episode = dataclasses.replace(episode, completed_at=at)
    return episode


def fold(events: Iterable[Event]) -> Folded:
    """Fold one episode's episode-events (Started, ActionRecorded, Completed, Updated) into a Folded
    state: those of its current user only (`_current`)."""
    unique: dict[str, Event] = {}
    for event in events:
        if type(event) in _KIND_ORDER:
            unique.setdefault(event.event_id, event)
    ordered, superseded = _current(
        sorted(unique.values(), key=lambda e: (e.occurred_at, _KIND_ORDER[type(e)], e.event_id))
    )
    episode: Episode | None = None
    actions: dict[tuple, Action] = {}
    completed_at: float | None = None  # the first completion's instant
    for event in ordered:
        if isinstance(event, EpisodeStarted | EpisodeCompleted):
            episode = _merge(episode, event.episode)
            for action in event.episode.actions:
                actions.setdefault(_action_key(action), action)
            if isinstance(event, EpisodeCompleted) and completed_at is None:
                completed_at = event.occurred_at
        elif isinstance(event, ActionRecorded):
            action = event.action
            if action.action_id is None:
                action = dataclasses.replace(action, action_id=event.event_id)
            actions.setdefault(_action_key(action), action)
        elif isinstance(event, EpisodeUpdated):
            episode = _updated(episode, event)
    if episode is not None:
        merged = tuple(
            sorted(
                actions.values(),
                key=lambda a: (a.timestamp if a.timestamp is not None else math.inf, a.action_id or ""),
            )
        )
        if merged != episode.actions:  # a whole episode in one event (the common case) needs no copy
            episode = dataclasses.replace(episode, actions=merged)
        if completed_at is not None:
            episode = _completed(episode, completed_at)
    return Folded(
        episode=episode,
        status=STATUS_COMPLETED if completed_at is not None and episode is not None else STATUS_DRAFT,
        first_occurred_at=ordered[0].occurred_at if ordered else math.inf,
        event_count=len(ordered),
        superseded=superseded,
    )
