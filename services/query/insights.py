"""Pure helpers behind /v1/context, /v1/skills, /v1/strategy and /v1/suggest (no I/O, no LLM), over
already-fetched episodes (`engram_episodic.events.Episode`).

Strategy advice follows the truth as facts do (`shared.regimes`): per approach (`shared.regimes.approach`:
`strategy_used`, else the tools called, else the flipped words of the texts: `text_approaches`), only the
newest regime counts (`current_evidence`). Views pass ADVICE_POOL episodes; advice keeps the `k` nearest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import zip_longest
from typing import Any

from engram_episodic.events import Episode
from engram_episodic.timeutil import format_instant
from shared.index import episode_texts
from shared.keywords import fold_for_search
from shared.regimes import approach, flips, marks, newest_regimes

STRATEGY_POOL: tuple[str, ...] = ("conservative", "exploratory", "defensive", "iterative", "example_driven")
REUSE_SUCCESS_RATE = 0.6
"""A strategy of similar episodes is reused when its success rate among them is above this."""
REGIME_MIN = 3
"""Episodes each side of a flip of one strategy's outcomes (as ENGRAM_FACTS_MIN_CLUSTER's default)."""
ADVICE_POOL = 100
"""Similar episodes /v1/strategy and /v1/suggest read to find each approach's newest regime (at least k)."""
MIN_SIMILARITY = 0.3
"""The cosine to the task from which an episode is experience of it: advice's `min_similarity` default,
and recall's population for what works now (`services.query.recall.pool.regime_rows`). An episode this
alike is at least as relevant as `/v1/context`'s floors (vector 0.25; hybrid 0.15, half the cosine)."""
ADVICE_SEARCHES = 5
"""Searches of ADVICE_POOL that advice makes at most, each among the episodes completed after the newest
the one before found: a change of approach is seen behind up to ~400 alike older episodes."""


def _approach(ep: Episode) -> str | None:
    return approach(ep.strategy_used, (a.action_type for a in ep.actions))


def _when(ep: Episode) -> tuple[float, str]:
    at = ep.completed_at if ep.completed_at is not None else ep.started_at
    return (at if at is not None else 0.0, ep.episode_id)


MARKED_TEXTS = ("solution", "action_text", "errors", "outcome_details")
"""The texts (`shared.index.episode_texts`) whose words mark an approach, as recall reads them
(`services.query.recall.pool.APPROACH_FIELDS` after the strategy)."""


def text_approaches(
    similar: Sequence[Episode], ok: Sequence[bool | None], min_size: int = REGIME_MIN
) -> list[str | None]:
    """Per episode of `similar`, the approach its texts name (None if none): among the episodes with
    neither a strategy nor a tool, the marks (`shared.regimes.marks`) whose outcomes flipped, by the test
    recall applies (`shared.regimes.flips`, corrected for every mark tested). Those of a flip are named by
    its mark the newest of them names first; the episodes carrying the mark that every success since
    carries and none of them does (the first the newest success names) are named by it: what works now.
    `ok[i]`: episode i succeeded (None: undecided)."""
    out: list[str | None] = [None] * len(similar)
    rows = [i for i, ep in enumerate(similar) if _approach(ep) is None]
    if len(rows) < 2 * min_size:
        return out
    found = []
    for i in rows:
        texts = episode_texts(similar[i])
        found.append(marks(None, (fold_for_search(v).encode() for f in MARKED_TEXTS if (v := texts[f]))))
    times = [_when(similar[i])[0] for i in rows]
    flipped, decided = flips(times, [ok[i] for i in rows], found, min_size)
    carriers: dict[str, set[int]] = {}  # per mark, the decided rows (of `rows`) carrying it, as `flips`
    for r in decided:
        for m in found[r]:
            carriers.setdefault(m, set()).add(r)
    for idx, start in flipped:
        mine = set(idx)
        old = next((m for m in found[idx[-1]] if carriers[m] == mine), None)
        since = [r for r in decided if ok[rows[r]] and r not in mine and times[r] >= times[idx[start]]]
        if old is None or not since:
            continue
        shared = (m for m in found[since[-1]] if all(m in found[r] for r in since) and not carriers[m] & mine)
        new = next(shared, None)
        for name, named in ((old, mine), (new, carriers[new] - mine if new else set())):
            for r in named:
                out[rows[r]] = out[rows[r]] or name
    return out


def current_evidence(
    similar: Sequence[Episode], *, min_size: int = REGIME_MIN, k: int | None = None
) -> tuple[list[Episode], list[dict[str, Any]]]:
    """The similar episodes that still count (input order kept, the first `k` when given) and what
    changed: per approach (`shared.regimes.approach`, else `text_approaches`), its decided episodes in
    time order are cut at their last flip (`shared.regimes.newest_regimes`, as recall's replay context
    cuts them) and the older ones are dropped; episodes without an approach are never cut. `changed` has
    one row per approach whose outcomes flipped:
    `{strategy, since, episodes, successes, earlier_episodes, earlier_successes}`."""
    kept, changed, _ = _evidence(similar, min_size, k)
    return kept, changed


def _evidence(
    similar: Sequence[Episode], min_size: int = REGIME_MIN, k: int | None = None
) -> tuple[list[Episode], list[dict[str, Any]], dict[str, str]]:
    """`current_evidence`, and the approach of each episode that has one, by episode id."""
    ok = [None if ep.outcome is None else ep.outcome == "success" for ep in similar]
    names = [
        _approach(ep) or t for ep, t in zip(similar, text_approaches(similar, ok, min_size), strict=True)
    ]
    regimes = newest_regimes(names, list(map(_when, similar)), ok, min_size)
    dropped: set[str] = set()
    changed = []
    for name in sorted(regimes, key=str):
        rows, start = regimes[name]
        if start == 0 or name is None:  # no approach recorded: no strategy whose change to report
            continue
        older, newer = [similar[i] for i in rows[:start]], [similar[i] for i in rows[start:]]
        dropped.update(e.episode_id for e in older)
        changed.append(
            {
                "strategy": name,
                "since": format_instant(_when(newer[0])[0]),
                "episodes": len(newer),
                "successes": sum(e.outcome == "success" for e in newer),
                "earlier_episodes": len(older),
                "earlier_successes": sum(e.outcome == "success" for e in older),
            }
        )
    kept = [e for e in similar if e.episode_id not in dropped]
    named = {e.episode_id: n for e, n in zip(similar, names, strict=True) if n}
    return (kept if k is None else kept[:k]), changed, named


def skill_profiles(rows: list[dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
    """Add `success_rate` and `weak` (success rate below `threshold`) to category_stats rows."""
    out = []
    for row in rows:
        rate = row["successes"] / row["episodes"] if row["episodes"] else None
        out.append({**row, "success_rate": rate, "weak": rate is not None and rate < threshold})
    return out


def choose_strategy(
    similar: Sequence[Episode],
    *,
    complexity: float | None,
    category_profile: dict[str, Any] | None,
    k: int | None = None,
) -> dict[str, Any]:
    """Adaptive strategy choice, first rule that applies:

    1. reuse the approach of similar episodes whose success rate among them is above 0.6 (the one with
       the most successes, then the highest rate), of the `k` nearest that count (`current_evidence`);
    2. `defensive` when the task's category is weak;
    3. by complexity: > 0.7 `iterative`, < 0.3 `exploratory`, otherwise `iterative`;
       unknown complexity: `conservative`.
    """
    everything = similar
    similar, changed, named = _evidence(similar, k=k)
    extra: dict[str, Any] = {"changed": changed} if changed else {}
    used = [(name, ep.outcome == "success") for ep in similar if (name := named.get(ep.episode_id))]
    tried, won = Counter(n for n, _ in used), Counter(n for n, ok in used if ok)
    ranked = [
        (won[n], won[n] / tried[n], n, tried[n]) for n in tried if won[n] / tried[n] > REUSE_SUCCESS_RATE
    ]
    evidence: dict[str, Any] = {"similar_episodes": len(everything)}
    if ranked:
        successes, rate, name, n = max(ranked, key=lambda t: (t[0], t[1]))
        rule = "reuse"
        why = (
            f"{successes} of {n} similar episodes using {name!r} succeeded "
            f"(success rate {rate:.0%} > {REUSE_SUCCESS_RATE:.0%})"
        )
        evidence |= {"episodes": n, "successes": successes}
    elif category_profile is not None and category_profile.get("weak"):
        name, rule = "defensive", "weak_category"
        why = (
            f"category {category_profile['category']!r} is weak "
            f"(success rate {category_profile['success_rate']:.0%} over "
            f"{category_profile['episodes']} episodes)"
        )
    elif complexity is None:
        name, rule = "conservative", "no_evidence"
        why = "no similar successful strategy, no weak category and no complexity given"
    elif complexity > 0.7:
        name, rule, why = "iterative", "complexity", f"complexity {complexity:g} > 0.7"
    elif complexity < 0.3:
        name, rule, why = "exploratory", "complexity", f"complexity {complexity:g} < 0.3"
    else:
        name, rule, why = "iterative", "complexity", f"complexity {complexity:g} is moderate"
    return {"strategy": name, "rule": rule, "reason": why, "evidence": evidence | extra}


FAILED = ("failure", "abandoned")


def suggestion(similar: Sequence[Episode], *, top: int = 5, k: int | None = None) -> dict[str, Any]:
    """Confidence from similar successes vs failures, and what went wrong in the failures.

    confidence: `high` with at least 2 successes and a success share >= 0.7; `medium` with at least one
    success and a share >= 0.4; otherwise `low` (including no evidence at all). Successes, failures and
    strategies count the `k` nearest that still count (`current_evidence`); `changed` lists the
    approaches whose outcomes flipped, with what was left out.
    """
    current, changed, named = _evidence(similar, k=k)
    successes = [e for e in current if e.outcome == "success"]
    failures = [e for e in current if e.outcome in FAILED]
    decided = len(successes) + len(failures)
    share = len(successes) / decided if decided else None
    if share is not None and len(successes) >= 2 and share >= 0.7:
        confidence = "high"
    elif share is not None and successes and share >= 0.4:
        confidence = "medium"
    else:
        confidence = "low"
    messages: Counter[str] = Counter()
    action_types: Counter[str] = Counter()
    for ep in failures:
        texts = [
            ep.feedback.message if ep.feedback else None,
            ep.outcome_details,
            *(a.error for a in ep.actions),
        ]
        # once per episode, in a stable order (ties in most_common keep first appearance)
        messages.update(list(dict.fromkeys(t.strip()[:300] for t in texts if t and t.strip())))
        action_types.update(list(dict.fromkeys(a.action_type for a in ep.actions if a.success is not True)))
    strategies = Counter(name for ep in successes if (name := named.get(ep.episode_id)))
    return {
        "confidence": confidence,
        "similar": len(similar),
        "successes": len(successes),
        "failures": len(failures),
        "success_share": share,
        "common_failures": [{"message": m, "count": c} for m, c in messages.most_common(top)],
        "failed_action_types": [{"action_type": a, "count": c} for a, c in action_types.most_common(top)],
        "successful_strategies": [{"strategy": s, "count": c} for s, c in strategies.most_common(top)],
        "changed": changed,
    }


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: max(0, n - 1)] + "…"


def prompt_section(
    task: str,
    category: str | None,
    results: Sequence[dict[str, Any]],
    replay: dict[str, Any],
    facts: Sequence[dict[str, Any]],
    max_chars: int,
) -> tuple[str, bool]:
    """A ready prompt section of at most `max_chars` characters; returns (text, truncated).

    Header lines first (task, category, summary, proven strategies), then "Known facts" (one line per
    fact), then one block per recalled episode, best first. `results` are recall results
    (`{"episode": {...}, "priority": ...}`), `facts` the facts provider's, best first.

    The budget is filled by rank across the two sections: facts and episodes alternately (fact 1,
    episode 1, fact 2, ...), each while it fits whole; the first that does not fit is cut to the room
    left (when at least `_MIN_PIECE` characters) and the rest are left out, so a small budget holds
    the best of both. Each section keeps its own order.
    """
    lines = [f"## Relevant experience for: {_clip(task, 300)}"]
    if category:
        lines.append(f"Category: {category}")
    n = replay.get("episodes", 0)
    if n:
        avg = replay.get("avg_reward")
        rate = replay.get("success_rate")
        lines.append(
            f"Experiences: {n} similar episode(s), average reward "
            f"{'n/a' if avg is None else f'{avg:.2f}'}, success rate "
            f"{'n/a' if rate is None else f'{rate:.0%}'}"
        )
    else:
        lines.append("Experiences: none recorded for this kind of task yet")
    proven = [s for s in replay.get("strategies", []) if s.get("success_rate")]
    if proven:
        lines.append(
            "Proven strategies: "
            + ", ".join(
                f"{s['strategy']} ({s['episodes']} episode(s), {s['success_rate']:.0%} success)"
                for s in proven
            )
        )
    header = "\n".join(lines)
    if len(header) > max_chars:  # even the header is too long: cut it
        return header[: max_chars - 1] + "…", True
    fact_lines = [f"- {_clip(str(f.get('text', f)), 300)}" for f in facts]
    episode_blocks = [_episode_block(i, r) for i, r in enumerate(results, start=1)]
    ranked = [
        item
        for pair in zip_longest((("fact", t) for t in fact_lines), (("episode", t) for t in episode_blocks))
        for item in pair
        if item is not None
    ]
    taken: dict[str, list[str]] = {"fact": [], "episode": []}
    truncated = False
    for section, item in ranked:
        taken[section].append(item)
        size = len(_assemble(header, taken))
        if size <= max_chars:
            continue
        truncated = True
        room = max_chars - (size - len(item))
        if room >= _MIN_PIECE:
            taken[section][-1] = item[: room - 1] + "…"
        else:
            taken[section].pop()
        break
    return _assemble(header, taken), truncated


_MIN_PIECE = 60
"""Fewest characters of a cut fact or episode block worth showing (an episode's heading line is ~50)."""


def _assemble(header: str, taken: dict[str, list[str]]) -> str:
    blocks = [header]
    if taken["fact"]:
        blocks.append("Known facts:\n" + "\n".join(taken["fact"]))
    blocks += taken["episode"]
    return "\n\n".join(blocks)


def _episode_block(i: int, r: dict[str, Any]) -> str:
    ep = r["episode"]
    task_obj = ep.get("task") or {}
    fb = ep.get("feedback") or {}
    head = f"### Episode {i}: {ep.get('outcome', 'unknown')}"
    if fb.get("reward") is not None:
        head += f", reward {fb['reward']:.2f}"
    head += f", priority {r['priority']:.2f}"
    body = [head, f"Task: {_clip(task_obj.get('description', ''), 400)}"]
    for label, key in (
        ("Strategy", "strategy_used"),
        ("Solution", "solution"),
        ("Outcome", "outcome_details"),
    ):
        if ep.get(key):
            body.append(f"{label}: {_clip(str(ep[key]), 600)}")
    if fb.get("message"):
        body.append(f"Feedback: {_clip(fb['message'], 300)}")
    return "\n".join(body)
