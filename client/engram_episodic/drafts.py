"""An episode being recorded, and a finished one made ready to publish: one logic for every transport.

The stream SDK (`shared.sdk`, next to Redis) and the HTTP clients (`engram_episodic.client`) both build
episodes here, so an episode recorded either way is validated, stamped and shaped the same.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from engram_episodic.errors import InvalidEpisode
from engram_episodic.events import Action, Episode, new_event_id
from engram_episodic.shapes import episode_to_dict, to_plain
from engram_episodic.validation import MAX_ACTIONS, Collector, json_kind, parse_action, parse_episode


def finished_episode(
    episode: Episode | Mapping[str, Any] | None = None,
    /,
    *,
    max_actions: int | None = MAX_ACTIONS,
    **fields: Any,
) -> Episode:
    """A finished episode ready to publish: validated, its `episode_id` (generated when missing) and
    `completed_at` (default now) fixed here, so publishing it again is the same episode, never a copy.

    `episode` is an Episode, a JSON-shaped dict, or None; `fields` override its fields. Raises
    InvalidEpisode naming every bad field, and when `outcome` is missing. `max_actions`: as `parse_episode`.
    """
    if isinstance(episode, Episode):
        data = episode_to_dict(episode)  # an Episode built in code skipped validation
    elif episode is None:
        data = {}
    elif isinstance(episode, Mapping):
        data = dict(episode)
    else:
        raise InvalidEpisode([("episode", f"must be an Episode or a JSON object, not {json_kind(episode)}")])
    data.update(fields)
    parsed = parse_episode(
        data, default_episode_id=new_event_id(), max_actions=max_actions, default_completed_at=time.time()
    )
    assert parsed is not None  # parse_episode raises without a collector
    if parsed.outcome is None:
        raise InvalidEpisode([("outcome", "is required for a finished episode")])
    return parsed


class EpisodeDraft:
    """An open episode: its start snapshot, the actions recorded so far, then its completion.

    Pure (no I/O): the transports publish what it builds. `task` is a description or a task object;
    `fields` are any Episode fields (agent_id, user_id, context, ...). Raises InvalidEpisode.
    """

    def __init__(
        self,
        task: str | Mapping[str, Any],
        *,
        category: str | None = None,
        complexity: float | None = None,
        **fields: Any,
    ):
        task_obj: dict[str, Any] = dict(task) if isinstance(task, Mapping) else {"description": task}
        if category is not None:
            task_obj["category"] = category
        if complexity is not None:
            task_obj["complexity"] = complexity
        fields = {"task": task_obj, **fields}
        fields.setdefault("episode_id", new_event_id())
        fields.setdefault("started_at", time.time())
        start = parse_episode(fields)  # a bad ttl is refused here, at the block's start
        assert start is not None
        # a ttl counts from completed_at (docs/api.md, Expiry): kept for the completion, not counted
        # from the block's start (`ttl="1h"` over a 2 s block expired 3,598 s after completion)
        self.ttl = fields.get("ttl")
        if self.ttl is not None:
            start = dataclasses.replace(start, expires_at=None)
        self.start: Episode = start
        self.actions: list[Action] = []
        self.completed: Episode | None = None

    @property
    def episode_id(self) -> str:
        return self.start.episode_id

    def action(
        self,
        action_type: str,
        *,
        input: str | None = None,
        output: str | None = None,
        success: bool | None = None,
        error: str | None = None,
        timestamp: float | None = None,
    ) -> Action:
        """Validate one action (its `action_id` is fresh, `timestamp` defaults to now); keep it; return it.

        Raises InvalidEpisode for a bad field, and after the episode was completed (it would be dropped)."""
        if self.completed is not None:
            raise InvalidEpisode(
                [("action", "the episode is already completed; record actions before complete()")]
            )
        raw = {
            "action_type": action_type,
            "input": input,
            "output": output,
            "success": success,
            "error": error,
            "timestamp": timestamp if timestamp is not None else time.time(),
            "action_id": new_event_id(),
        }
        errs = Collector()
        act = parse_action(raw, "action", errs)
        errs.raise_if_any()
        assert act is not None
        self.actions.append(act)
        return act

    def completion(self, outcome: str, *, keep_actions: int | None = MAX_ACTIONS, **fields: Any) -> Episode:
        """The final snapshot to publish, with the last `keep_actions` actions (None: all of them; the
        stream SDK keeps one event's bound, having published each action on its own). `fields`: any
        Episode field. Raises InvalidEpisode, also when the episode was already completed.
        """
        if self.completed is not None:
            raise InvalidEpisode([("outcome", "episode already completed")])
        data = episode_to_dict(self.start)
        if self.ttl is not None and fields.get("expires_at") is None:
            data.setdefault("ttl", self.ttl)
        data.update({k: v for k, v in fields.items() if v is not None})
        data["outcome"] = outcome
        data.setdefault("completed_at", time.time())
        kept = self.actions if keep_actions is None else self.actions[-keep_actions:] if keep_actions else []
        data["actions"] = [to_plain(a) for a in kept]
        snapshot = parse_episode(data, max_actions=keep_actions)
        assert snapshot is not None
        return snapshot

    def completed_with(self, snapshot: Episode) -> Episode:
        """Mark the draft completed by `snapshot` (after it was published); returns it with every action."""
        self.completed = dataclasses.replace(snapshot, actions=tuple(self.actions))
        return self.completed

    @staticmethod
    def exit_fields(
        exc_type: type[BaseException] | None, exc: BaseException | None
    ) -> tuple[str, dict[str, Any]]:
        """The outcome and fields for a block left without `complete()`: failure with the error, or abandoned."""
        if exc is not None and exc_type is not None:
            return "failure", {"outcome_details": f"{exc_type.__name__}: {exc}"[:10_000]}
        return "abandoned", {"outcome_details": "episode block exited without complete()"}
