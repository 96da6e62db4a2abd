"""One `make run` per data directory: the exclusive lock of `ENGRAM_DATA_DIR/run.lock`, passed to every
process of the stack, so what a `make run` killed with `kill -9` leaves behind keeps it, and the
refusal names it; the data directory a `make run` uses (`run_data_dir`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "run.lock"
DEFAULT_REDIS_PORT = 6390


def run_data_dir(env: dict[str, str]) -> Path:
    """The data directory of a `make run` with `env`: `ENGRAM_DATA_DIR`, else `.run` for the
    default Redis port and `.run/redis-<port>` for another (so a second stack on other ports gets its
    own); a port that is not a number is left to `make run`'s own check."""
    given = env.get("ENGRAM_DATA_DIR")
    if given:
        return Path(given)
    port = (env.get("ENGRAM_REDIS_PORT") or "").strip()
    if not port.isdigit() or int(port) == DEFAULT_REDIS_PORT:
        return Path(".run")
    return Path(".run") / f"redis-{int(port)}"


class DataDirBusy(Exception):
    """Another `make run` holds the lock of the data directory."""


def lock_data_dir(data_dir: Path) -> int:
    """Create `data_dir` and lock `data_dir/run.lock`; returns the descriptor (locked while it, or a
    child it is passed to, lives). Raises DataDirBusy naming the holder's pid, OSError when the
    directory cannot be created."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip()
        os.close(fd)
        raise DataDirBusy(holder) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def holders(path: Path) -> list[tuple[int, str]]:
    """(pid, command name) of the other processes holding `path` open (after a `make run` is killed,
    its embedded Redis), read from /proc; empty where it cannot be read."""
    target, found = str(path.resolve()), []
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                found.append((int(proc.name), (proc / "comm").read_text().strip()))
    return sorted(found)


def busy_message(data_dir: Path, holder: str) -> str:
    """Why a `make run` of `data_dir` is refused: the lock holder when it lives, else what a gone
    `make run` left holding the lock."""
    alive = False
    if holder.isdigit():
        try:
            os.kill(int(holder), 0)
            alive = True
        except ProcessLookupError:
            pass
        except PermissionError:  # alive, another user's
            alive = True
    if alive:
        who = f"another `make run` (pid {holder})"
    else:
        left = ", ".join(f"pid {pid} {name}" for pid, name in holders(data_dir / LOCK_FILE)) or "?"
        who = f"a process left by a `make run` that is gone (pid {holder or '?'}): {left}"
    return (
        f"ENGRAM_DATA_DIR={data_dir} is in use by {who}: two stacks must not share "
        f"{data_dir / 'redis'}. Stop it first, or give this one its own ENGRAM_DATA_DIR (and ports)"
    )
