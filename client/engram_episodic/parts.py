"""Publishing in parts: a list of episodes → request bodies that each fit the service's bounds.

One `POST /v1/episodes` carries at most `MAX_BATCH` episodes, `MAX_ACTIONS` actions per episode and
`max_body_bytes` of JSON (the service's `ENGRAM_MAX_BODY_BYTES`, 4 MiB by default). An episode read
back can exceed one request: its actions accumulate over events, and its text fields may have arrived
in different requests. Such an episode is sent as several snapshots of itself. Each *part* carries the
episode's identity and every small field (ids, task, outcome, timestamps, feedback, metadata, the
vector), and a share of its large fields (the free-text fields and `context`) and of its actions. The
fold overrides a stored episode field by field, where an absent field keeps its value, and unions
actions (services/consolidator/projection.py). So after the last part the stored episode is the whole
one, and sending every part again changes nothing.

The parts of one episode go in separate requests, in order: the service refuses one episode twice in a
request, and events of later requests sort later. The first parts of all episodes go before any
second part. A list that fits one request is one request, which the service applies all or none;
parts are not atomic together (each request is).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from engram_episodic.errors import InvalidEpisode
from engram_episodic.validation import MAX_ACTIONS, TEXT_FIELDS, json_size

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # the service's default ENGRAM_MAX_BODY_BYTES
MAX_BATCH = 1000  # episodes per request (the service's models.MAX_BATCH)
# fields a part may leave out (the fold keeps the stored value): the ones that can be large
SPLIT_FIELDS = (*TEXT_FIELDS, "context")
_ENVELOPE = len(b'{"episodes":[]}')


def encode_body(body: Any) -> bytes:
    """`body` as the bytes the client sends: compact UTF-8 JSON (what httpx ≥ 0.28 writes for `json=`,
    fixed here so that the sizes `request_bodies` counts, `validation.json_size`, are the sizes sent).
    Raises ValueError for NaN or infinity."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


_LIMIT = "one request carries at most {:,} bytes (the client's max_body_bytes, the service's ENGRAM_MAX_BODY_BYTES)"


def episode_parts(
    data: Mapping[str, Any], index: int, *, max_bytes: int, max_actions: int = MAX_ACTIONS
) -> list[dict[str, Any]]:
    """One episode's JSON-shaped dict (`episode_to_dict`) → its parts, each a dict of the same shape whose
    JSON fits one request of `max_bytes` alone, with at most `max_actions` actions: the first part holds
    every small field and as many large fields and actions (in order) as fit, each later part the small
    fields and the next ones. An episode that fits is one part, equal to `data`.

    Raises InvalidEpisode naming `episodes[index]` (its small fields alone do not fit) or the field or
    action that does not fit with them."""
    budget = max_bytes - _ENVELOPE
    core = {k: v for k, v in data.items() if k not in SPLIT_FIELDS and k != "actions"}
    core_size = json_size(core)
    if core_size > budget:
        raise InvalidEpisode(
            [
                (
                    f"episodes[{index}]",
                    f"its fields other than the text fields, context and actions are {core_size:,} bytes as "
                    f"JSON; {_LIMIT.format(max_bytes)}",
                )
            ]
        )
    parts: list[dict[str, Any]] = []
    fields: dict[str, Any] = {}
    actions: list[Any] = []
    size = core_size

    def flush() -> None:
        nonlocal fields, actions, size
        part = {**core, **fields}
        if actions or (not parts and "actions" in data):
            part["actions"] = actions
        parts.append(part)
        fields, actions, size = {}, [], core_size

    pieces: list[tuple[str, Any]] = [(k, data[k]) for k in SPLIT_FIELDS if data.get(k) is not None]
    pieces += [("actions", a) for a in data.get("actions") or ()]
    action_no = 0
    for key, value in pieces:
        is_action = key == "actions"
        own = json_size(value)
        # a key adds `,"key":value`; an action `,` and itself, the first also `,"actions":[` and `]`
        first_action = 1 + len(b'"actions":[') + own + 1
        cost = (1 + own if actions else first_action) if is_action else 1 + json_size(key) + 1 + own
        if (size + cost > budget or (is_action and len(actions) >= max_actions)) and (fields or actions):
            flush()
            if is_action:
                cost = first_action
        if size + cost > budget:
            path = f"episodes[{index}].actions[{action_no}]" if is_action else f"episodes[{index}].{key}"
            raise InvalidEpisode(
                [
                    (
                        path,
                        f"is {own:,} bytes as JSON, {core_size:,} more with the episode's other fields; "
                        + _LIMIT.format(max_bytes),
                    )
                ]
            )
        if is_action:
            actions.append(value)
            action_no += 1
        else:
            fields[key] = value
        size += cost
    flush()
    return parts


def request_bodies(
    episodes: Sequence[Mapping[str, Any]],
    *,
    max_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_batch: int = MAX_BATCH,
    max_actions: int = MAX_ACTIONS,
) -> list[dict[str, Any]]:
    """The `{"episodes": [...]}` bodies that publish `episodes` (JSON-shaped dicts, in order): each at
    most `max_bytes` as `encode_body` writes it, `max_batch` episodes and `max_actions` actions per
    episode, no episode twice in one body, every k-th part of the episodes before any (k+1)-th. One body
    when everything fits, equal to `{"episodes": episodes}`. Raises InvalidEpisode as `episode_parts`."""
    if max_bytes <= _ENVELOPE:
        raise ValueError(f"max_bytes must exceed {_ENVELOPE}")
    split = [
        episode_parts(e, i, max_bytes=max_bytes, max_actions=max_actions) for i, e in enumerate(episodes)
    ]
    bodies: list[dict[str, Any]] = []
    for round_no in range(max((len(p) for p in split), default=0)):
        batch: list[dict[str, Any]] = []
        size = _ENVELOPE
        for parts in split:
            if round_no >= len(parts):
                continue
            part = parts[round_no]
            cost = json_size(part) + (1 if batch else 0)
            if batch and (size + cost > max_bytes or len(batch) >= max_batch):
                bodies.append({"episodes": batch})
                batch, size, cost = [], _ENVELOPE, cost - 1
            batch.append(part)
            size += cost
        if batch:
            bodies.append({"episodes": batch})
    return bodies
