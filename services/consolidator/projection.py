"""The pure fold: an episode's events (any order, any duplicates) → its projected state.

Deterministic in the *set* of events: events are de-duplicated by `event_id` and sorted by
`(occurred_at, kind, event_id)` before merging, so N workers folding interleaved, duplicated
deliveries reach the same document as a sequential replay. Later snapshots
override earlier ones field by field (a None never erases a value); actions are the union of every
snapshot's actions and every `ActionRecorded`, de-duplicated by `action_id` and ordered by time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engram_episodic.events import (
    Action,
    ActionRecorded,
    Episode,
    EpisodeCompleted,
    EpisodeStarted,
    EpisodeUpdated,
    Event,
    Feedback,
)
from shared.index import STATUS_COMPLETED, STATUS_DRAFT

# an update at the same instant as a snapshot applies after it (it changes what the snapshot set)
_KIND_ORDER = {EpisodeStarted: 0, ActionRecorded: 1, EpisodeCompleted: 2, EpisodeUpdated: 3}


@dataclass(frozen=True, slots=True)
class Folded:
    """The projection of one episode.

    `episode` is None while no start or completion has arrived (only actions): nothing to index yet.
    `first_occurred_at` (UTC epoch seconds) is compared with a user's forget time.
    """

    episode: Episode | None
    status: str
    first_occurred_at: float
    event_count: int


def _merge(base: Episode | None, update: Episode) -> Episode:
    if base is None:
        return update
    changes = {}
    for f in dataclasses.fields(Episode):
        value = getattr(update, f.name)
        if value is not None and value != ():
            changes[f.name] = value
    return dataclasses.replace(base, **changes)


def _updated(base: Episode | None, update: EpisodeUpdated) -> Episode | None:
    """`base` with an update's changes (events.EpisodeUpdated); None stays None: an update of an
    episode whose snapshot has not arrived waits for it (it sorts after it by time, folded again then)."""
    if base is None:
        return None
    changes: dict[str, Any] = {}  # field name → new value
    if update.feedback is not None:
        old = base.feedback or Feedback()
        given = {f.name: getattr(update.feedback, f.name) for f in dataclasses.fields(Feedback)}
        changes["feedback"] = dataclasses.replace(old, **{k: v for k, v in given.items() if v is not None})
    if update.metadata is not None:
        merged = dict(base.metadata or {})
        for key, value in update.metadata.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        changes["metadata"] = merged or None
    for name in ("outcome", "outcome_details", "importance", "expires_at"):
        if getattr(update, name) is not None:
            changes[name] = getattr(update, name)
    return dataclasses.replace(base, **changes)


def _action_key(action: Action) -> tuple:
    return (action.action_id,) if action.action_id else ("anon", action)


def fold(events: Iterable[Event]) -> Folded:
    """Fold one episode's episode-events (Started, ActionRecorded, Completed, Updated) into a Folded
    state."""
    unique: dict[str, Event] = {}
    for event in events:
        if type(event) in _KIND_ORDER:
            unique.setdefault(event.event_id, event)
    ordered = sorted(unique.values(), key=lambda e: (e.occurred_at, _KIND_ORDER[type(e)], e.event_id))
    episode: Episode | None = None
    actions: dict[tuple, Action] = {}
    completed = False
    for event in ordered:
        if isinstance(event, EpisodeStarted | EpisodeCompleted):
            episode = _merge(episode, event.episode)
            for action in event.episode.actions:
                actions.setdefault(_action_key(action), action)
            completed = completed or isinstance(event, EpisodeCompleted)
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
        if completed and episode.outcome is None:
            episode = dataclasses.replace(episode, outcome="abandoned")
    return Folded(
        episode=episode,
        status=STATUS_COMPLETED if completed and episode is not None else STATUS_DRAFT,
        first_occurred_at=ordered[0].occurred_at if ordered else math.inf,
        event_count=len(unique),
    )
