"""What the hooks keep on disk between two invocations, under the user's state directory
(`$XDG_STATE_HOME/engram`, default `~/.local/state/engram`):

    hooks.json            the configuration `engram hooks install` wrote (url, api_key, test_commands,
                          hash_repo); mode 0600
    sessions/<cli>-<h>.json  the open draft of a session (h: a digest of the CLI's session id), read
                          and written under the lock `sessions/.lock`
    spool/<episode_id>.json  finished episodes the service did not take yet (sent by the next hook)
    hooks.log             what the hooks did and every error they swallowed (rotated at 1 MB)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import logging.handlers
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if sys.platform != "win32":  # `engram` itself must import everywhere; the hooks lock where they can
    import fcntl

CONFIG_KEYS = ("url", "api_key", "test_commands", "hash_repo")
log = logging.getLogger("engram.hooks")


def state_dir() -> Path:
    """`$XDG_STATE_HOME/engram`, or `~/.local/state/engram` without it (not created here)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "engram"


def _folder(path: Path) -> Path:
    """`path`, a folder of the state directory, created with it for the user only (they hold prompts)."""
    state_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _private(path: str | Path) -> None:
    """Create the file `path` for the user only, when it does not exist."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))


def _rotate(source: str, dest: str) -> None:
    """The log's rotation: the file it starts is the user's only too (not made by the umask)."""
    os.replace(source, dest)
    _private(source)


def _write(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` atomically (a reader sees the old file or the new one whole),
    readable by the user only from its first byte (it may hold prompts, or the API key)."""
    _folder(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, ensure_ascii=False))
    os.replace(tmp, path)


def read(path: Path) -> dict[str, Any] | None:
    """The JSON object in the file at `path`; None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_config() -> dict[str, Any]:
    """The hooks' configuration (`hooks.json`), {} when there is none or it is unreadable."""
    data = read(state_dir() / "hooks.json") or {}
    return {k: v for k, v in data.items() if k in CONFIG_KEYS}


def save_config(config: dict[str, Any]) -> Path:
    """Write the configuration (the keys of CONFIG_KEYS that are not None) readable by the user only."""
    path = state_dir() / "hooks.json"
    _write(path, {k: v for k, v in config.items() if k in CONFIG_KEYS and v is not None})
    return path


def start_log() -> None:
    """Send the hooks' log records to `hooks.log` (never to stdout or stderr, which the CLI reads)."""
    path = state_dir() / "hooks.log"
    for old in list(log.handlers):  # one process may serve state directories in turn (tests)
        if getattr(old, "baseFilename", None) == str(path.absolute()):
            return
        log.removeHandler(old)
        old.close()
    try:
        _private(_folder(path.parent) / path.name)
        rotating = logging.handlers.RotatingFileHandler(
            path, maxBytes=1_000_000, backupCount=1, encoding="utf-8"
        )
        rotating.rotator = _rotate
        handler: logging.Handler = rotating
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def session(cli: str, session_id: str) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """The session's state (a dict, {} for a new session) under an exclusive lock; what the block leaves
    in it is written back when it exits normally ({} removes the file). Hooks that run at once (parallel
    tool calls) wait for each other here."""
    digest = hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()[:32]
    return session_at(state_dir() / "sessions" / f"{cli}-{digest}.json")


def _files(folder: str) -> list[Path]:
    """The JSON files of a folder of the state directory, oldest first."""
    path = state_dir() / folder
    return sorted(path.glob("*.json") if path.is_dir() else [], key=lambda p: p.stat().st_mtime)


def idle_sessions(seconds: float) -> list[Path]:
    """The session files not written for `seconds` (a CLI that stopped without its end events)."""
    return [p for p in _files("sessions") if time.time() - p.stat().st_mtime > seconds]


@contextlib.contextmanager
def session_at(path: Path) -> Iterator[dict[str, Any]]:
    """`session`, by its file."""
    _folder(path.parent)
    # one lock for every session (a lock file per session would be left behind by each): the block
    # only reads and writes the file; the service is called outside it
    with open(path.parent / ".lock", "a+") as lock:
        if sys.platform != "win32":
            fcntl.flock(lock, fcntl.LOCK_EX)
        state = read(path) or {}
        yield state
        if state:
            _write(path, state)
        else:
            path.unlink(missing_ok=True)


def spool(episode: dict[str, Any]) -> Path:
    """Keep a finished episode (JSON-shaped, with its `episode_id`) to send later."""
    path = state_dir() / "spool" / f"{episode['episode_id']}.json"
    _write(path, episode)
    return path


def spooled() -> list[Path]:
    """The spooled episodes' files, oldest first."""
    return _files("spool")
