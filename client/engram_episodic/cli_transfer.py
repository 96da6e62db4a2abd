"""`engram export` and `engram import`: a namespace (or one user's, agent's, session's episodes) as JSONL.

    engram export --out memory.jsonl                 # every episode of the API key's namespace, oldest first
    engram export --agent-id coder-1 > coder-1.jsonl
    engram import memory.jsonl                       # into another stack (or back): idempotent

Export pages through `GET /v1/episodes` (the client's `iter_episodes`) and writes one episode per line
in its ingest shape: its `episode_id`, `started_at` / `completed_at` / `expires_at`, its actions with
their `action_id` and `timestamp`, feedback, metadata and every other field (derived fields such as
`duration_s` are dropped; the vector is not exported: the importing stack embeds the text again).
Import publishes the lines back in batches (`publish`, which sends them in requests of at most
`--max-body-bytes` / ENGRAM_MAX_BODY_BYTES, an episode larger than one in parts), each episode with its own `episode_id` and
`completed_at`, so importing a file twice, or into a stack that holds some of it, changes nothing: a
re-published episode is the same episode (docs/api.md, The episode model). Event ids are not carried:
the importing stack records new events for the same episodes.
"""

from __future__ import annotations

import json
from typing import IO, Any

import click

from engram_episodic.cli_progress import Bars, progress_option
from engram_episodic.shapes import episode_to_dict

IMPORT_BATCH = 500  # episodes per `publish` call (one progress step); it splits them by the body limit


@click.command("export")
@click.option("--agent-id")
@click.option("--user-id")
@click.option("--session-id")
@click.option("--out", "out", type=click.File("w", encoding="utf-8"), default="-", help="Default: stdout.")
@click.pass_context
def export_command(ctx: click.Context, out: IO[str], **scope: Any) -> None:
    """Write the namespace's episodes (or a user's, an agent's, a session's) as JSONL, oldest first."""
    from engram_episodic.cli import _run, _scope

    def export(client: Any) -> int:
        n = 0
        for episode in client.iter_episodes(order="asc", limit=1000, **_scope(**scope)):
            out.write(json.dumps(episode_to_dict(episode, include_vector=False), ensure_ascii=False) + "\n")
            n += 1
        return n

    n = _run(ctx, export)
    out.flush()
    click.echo(f"exported {n} episodes", err=True)


def _episodes(file: IO[bytes]) -> list[dict[str, Any]]:
    out = []
    for number, raw in enumerate(file, 1):  # bytes, so that a bad byte is named with its line
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise click.ClickException(f"{file.name}:{number} is not UTF-8 ({exc.reason})") from None
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise click.ClickException(f"{file.name}:{number} is not JSON: {exc}") from None
        if not isinstance(item, dict):
            raise click.ClickException(f"{file.name}:{number} is not an episode (a JSON object)")
        out.append(item)
    return out


@click.command("import")
@click.argument("file", type=click.File("rb"))
@click.option("--wait", type=click.FloatRange(0, 30), help="Seconds to wait until each batch is recallable.")
@progress_option
@click.pass_context
def import_command(ctx: click.Context, file: IO[bytes], wait: float | None, progress: bool | None) -> None:
    """Publish the episodes of a JSONL FILE (as `engram export` writes it; "-" reads stdin), idempotently."""
    from engram_episodic.cli import _run

    episodes = _episodes(file)
    bars = Bars(enabled=progress, units={"import": "episode"})

    def publish(client: Any) -> int:
        bars.phase("import", len(episodes))
        done = 0
        try:
            for start in range(0, len(episodes), IMPORT_BATCH):
                batch = episodes[start : start + IMPORT_BATCH]
                client.publish(batch, wait=wait)
                done += len(batch)
                bars.advance(len(batch))
        finally:
            bars.close()
        return done

    n = _run(ctx, publish)
    click.echo(f"imported {n} episodes", err=True)
