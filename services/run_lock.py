"""One `make run` per data directory: the exclusive lock of `ENGRAM_DATA_DIR/run.lock`; the data
directory a `make run` uses (`run_data_dir`).

The supervisor takes it (`lock_data_dir`) and passes the descriptor to every process it starts (the
embedded Redis, the consolidators, the query service): the lock is held while any of them lives, so
what a `make run` killed with `kill -9` leaves behind keeps the data dir, and the refusal names it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "run.lock"
DEFAULT_REDIS_PORT = 6390


def run_data_dir(env: dict[str, str]) -> Path:
    """The data directory of a `make run` with the environment `env`: `ENGRAM_DATA_DIR` when set, else
    `.run` for the default embedded Redis port (6390) and `.run/redis-<port>` for another
    `ENGRAM_REDIS_PORT`. Why per port: the directory holds that Redis's data and the stack's lock, so a
    second stack on other ports (README: `ENGRAM_PORT=18080 ENGRAM_REDIS_PORT=16379
    ENGRAM_METRICS_PORT=19191 make run`) gets its own beside the first instead of being refused for
    sharing it. A port that is not a number is left to `make run`'s own check (`.run` meanwhile)."""
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
    """Create `data_dir` and take the exclusive lock of `data_dir/run.lock`; returns its descriptor (kept
    open, and so locked, for as long as the process — or a child it is passed to — lives).

    Raises DataDirBusy naming the holder's pid, OSError when the directory cannot be created."""
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
    """(pid, command name) of the other processes that hold `path` open: the lock is inherited, so
    after a `make run` is killed its embedded Redis holds it, under a pid the lock file does not name.
    Read from /proc (Linux); empty where it cannot be read."""
    target, found = str(path.resolve()), []
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                found.append((int(proc.name), (proc / "comm").read_text().strip()))
    return sorted(found)


def busy_message(data_dir: Path, holder: str) -> str:
    """Why a `make run` of `data_dir` is refused: the lock holder (`holder`, the pid its lock file names)
    when it lives, else the processes a gone `make run` left holding the lock (`holders`)."""
    alive = False
    if holder.isdigit():
        try:
            os.kill(int(holder), 0)
            alive = True
        except ProcessLookupError:
            pass
        except PermissionError:
            alive = True
    if alive:
        who = f"another `make run` (pid {holder})"
    else:
        left = ", ".join(f"pid {pid} {name}" for pid, name in holders(data_dir / LOCK_FILE)) or "?"
        who = f"a process left by a `make run` that is gone (pid {holder or '?'}): {left}"
    return (
        f"engram: ENGRAM_DATA_DIR={data_dir} is in use by {who}: two stacks must not share "
        f"{data_dir / 'redis'}. Stop it first, or give this one its own ENGRAM_DATA_DIR (and ports)"
    )
