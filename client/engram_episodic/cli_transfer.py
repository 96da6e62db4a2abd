"""`engram export` and `engram import`: a namespace (or one user's, agent's, session's episodes) as JSONL.

Export pages through `iter_episodes` and writes each episode in its ingest shape (derived fields and the
vector dropped); import publishes the lines back in batches with their own `episode_id` and
`completed_at`, so importing twice changes nothing. Details: docs/api.md, "Export and import".
"""

from __future__ import annotations

import json
import time
from typing import IO, Any

import click

from engram_episodic.calls import MAX_WAIT, WaitTimeout
from engram_episodic.cli_common import call, scope_of, scoped
from engram_episodic.cli_progress import Bars, progress_option
from engram_episodic.drafts import finished_episode
from engram_episodic.errors import InvalidEpisode
from engram_episodic.events import Episode
from engram_episodic.parts import request_bodies
from engram_episodic.shapes import episode_to_dict
from engram_episodic.timeutil import format_instant

IMPORT_BATCH = 500  # episodes per `publish` call (one progress step); it splits them by the body limit


@click.command("export")
@scoped
@click.option("--out", "out", type=click.File("w", encoding="utf-8"), default="-", help="Default: stdout.")
@click.pass_context
def export_command(ctx: click.Context, out: IO[str], **scope: Any) -> None:
    """Write the namespace's episodes (or a user's, an agent's, a session's) as JSONL, oldest first."""

    def export(client: Any) -> int:
        n = 0
        for episode in client.iter_episodes(order="asc", limit=1000, **scope_of(**scope)):
            out.write(json.dumps(episode_to_dict(episode, include_vector=False), ensure_ascii=False) + "\n")
            n += 1
        return n

    n = call(ctx, export)
    out.flush()
    click.echo(f"exported {n} episodes", err=True)


def _episodes(file: IO[bytes]) -> list[tuple[int, dict[str, Any]]]:
    """The file's episodes with their line numbers (1-based; blank lines skipped). ClickException
    naming every line that is not UTF-8, not JSON or not an object (the first 20)."""
    out, problems = [], []
    for number, raw in enumerate(file, 1):  # bytes, so that a bad byte is named with its line
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a byte-order mark is no error
        except UnicodeDecodeError as exc:
            problems.append(f"{file.name}:{number} is not UTF-8 ({exc.reason})")
            continue
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{file.name}:{number} is not JSON: {exc}")
            continue
        if not isinstance(item, dict):
            problems.append(f"{file.name}:{number} is not an episode (a JSON object)")
            continue
        out.append((number, item))
    _refuse(problems)
    return out


def _refuse(problems: list[str]) -> None:
    """ClickException listing the first 20 `problems`, when there are any."""
    if problems:
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise click.ClickException("nothing imported:\n  " + "\n  ".join(problems[:20]) + more)


def _prepared(name: str, lines: list[tuple[int, dict[str, Any]]], max_body_bytes: int) -> list[Episode]:
    """Every line validated (and given its `episode_id` and `completed_at` once, so a retry is the same
    episode) before anything is sent; ClickException naming each bad line's fields, an episode too large
    for one request at `max_body_bytes`, and an `episode_id` on two lines."""
    prepared: list[Episode] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for number, item in lines:
        try:
            episode = finished_episode(item, max_actions=None)
            request_bodies([episode_to_dict(episode)], max_bytes=max_body_bytes)
        except InvalidEpisode as exc:
            problems += [
                f"{name}:{number}: {path.removeprefix('episodes[0].')}: {why}" for path, why in exc.errors
            ]
            continue
        if episode.episode_id in seen:
            problems.append(
                f"{name}:{number}: episode_id {episode.episode_id!r} is on line {seen[episode.episode_id]} too; "
                "keep one version of an episode"
            )
        seen.setdefault(episode.episode_id, number)
        prepared.append(episode)
    _refuse(problems)
    return prepared


@click.command("import")
@click.argument("file", type=click.File("rb"))
@click.option(
    "--wait", type=click.FloatRange(0, MAX_WAIT), help="Seconds to wait until each batch is recallable."
)
@progress_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"imported": n, "forgotten": [ids], "expired": [ids]} on stdout.',
)
@click.pass_context
def import_command(
    ctx: click.Context, file: IO[bytes], wait: float | None, progress: bool | None, as_json: bool
) -> None:
    """Publish the episodes of a JSONL FILE (as `engram export` writes it; "-" reads stdin), idempotently."""
    lines = _episodes(file)
    episodes = _prepared(file.name, lines, ctx.obj["max_body_bytes"])
    total = len(episodes)
    at = {e.episode_id: (number, e.expires_at) for (number, _), e in zip(lines, episodes, strict=True)}
    # a line past its expires_at is not sent: stored, it would be hidden at once and erased, and as an
    # upsert it would erase a live copy of the episode too
    now = time.time()
    stale = [e.episode_id for e in episodes if e.expires_at is not None and e.expires_at <= now]
    if stale:
        past = set(stale)
        kept = [(line, e) for line, e in zip(lines, episodes, strict=True) if e.episode_id not in past]
        lines, episodes = [line for line, _ in kept], [e for _, e in kept]
    bars = Bars(enabled=progress, units={"import": "episode"})
    done = 0
    waited_out = 0  # the batch published, then not all recallable within --wait (the import stops there)
    forgotten: list[str] = []  # ids this stack forgot: not published, never stored again
    expired = list(stale)  # and those the service found expired (its clock; seen with --wait)

    def publish(client: Any) -> int:
        nonlocal done, waited_out
        bars.phase("import", len(episodes))
        try:
            for start in range(0, len(episodes), IMPORT_BATCH):
                batch = episodes[start : start + IMPORT_BATCH]
                try:
                    result = client.publish(batch, wait=wait)
                except WaitTimeout as exc:  # forgotten or expired ids alone do not stop the import
                    result = exc.result
                    if result is None or any(
                        not a.projected and a.reason not in ("forgotten", "expired") for a in result.results
                    ):
                        waited_out = len(batch) if result is not None else 0
                        raise
                forgotten.extend(a.episode_id for a in result.results if a.forgotten)
                expired.extend(a.episode_id for a in result.results if a.reason == "expired")
                done += len(batch)
                bars.advance(len(batch))
        finally:
            bars.close()
        return done

    try:
        n = call(ctx, publish)
    except click.ClickException:
        if episodes and done < len(episodes):  # an error names an episode by its place in one request
            first, last = lines[done][0], lines[min(done + IMPORT_BATCH, len(lines)) - 1][0]
            click.echo(
                # the service took a batch --wait ran out on: "the error is in the batch" would deny that
                f"published {done + waited_out} of {total} episodes, through line {last} of "
                f"{file.name}; of lines {first}-{last}, those named below are not recallable; "
                "importing again is safe"
                if waited_out
                else f"imported {done} of {total} episodes; the error is in the batch of lines "
                f"{first}-{last} of {file.name}, part of which may be in too; importing again is safe",
                err=True,
            )
        raise
    imported = n - len(forgotten) - (len(expired) - len(stale))
    if as_json:
        click.echo(json.dumps({"imported": imported, "forgotten": forgotten, "expired": expired}))
    if expired:  # published, but hidden at once: not imported, and an error (exit status 1)
        named = [f"{i} ({file.name}:{at[i][0]}, expires_at {format_instant(at[i][1])})" for i in expired]
        one = len(expired) == 1
        raise click.ClickException(
            f"imported {imported} of {total} episodes; {len(expired)} {'was' if one else 'were'} not, as "
            f"{'its' if one else 'their'} expires_at had already passed (an expired episode is hidden from "
            f"every read and erased; give it a later expires_at or none): {_shown(named)}"
            + (f"; {len(forgotten)} forgotten here before: {_shown(forgotten)}" if forgotten else "")
        )
    if forgotten:  # not imported either: exit status 1, as `engram publish` and `engram record` do
        raise click.ClickException(
            f"imported {_episodes_n(imported)}; {len(forgotten)} "
            f"{'was' if len(forgotten) == 1 else 'were'} not, as the episode_id was forgotten here before "
            f"and a forgotten id is never stored again: {_shown(forgotten)}"
        )
    click.echo(f"imported {_episodes_n(n)}", err=True)


def _shown(items: list[str]) -> str:
    """The first 10 of `items`, comma-separated, and how many more."""
    return ", ".join(items[:10]) + (f" and {len(items) - 10} more" if len(items) > 10 else "")


def _episodes_n(n: int) -> str:
    return f"{n} episode" if n == 1 else f"{n} episodes"
