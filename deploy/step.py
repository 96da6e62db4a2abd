"""One step of `make install` (or any long Makefile step), said as it happens: a line when it starts, one
every `HEARTBEAT` seconds while it runs, and one with its time when it ends.

    python3 deploy/step.py "2/4" "torch 2.13.0 (CPU wheel, the largest download)" -- pip install ...

Standard library only: it runs with the system `python3` before the virtual environment exists. Exits
with the command's code; a failing step says which one failed and after how long.
"""

from __future__ import annotations

import subprocess
import sys
import time

HEARTBEAT = 30.0
"""Seconds between the "still ..." lines of a running step (pip -q prints nothing for minutes)."""


def _say(text: str) -> None:
    print(f"engram ◆ {text}", flush=True)


def run(label: str, what: str, argv: list[str], *, heartbeat: float = HEARTBEAT) -> int:
    """Run `argv`, saying `[label] what ...` first, a heartbeat meanwhile and the elapsed time at the end;
    returns its exit code."""
    started = time.monotonic()
    _say(f"[{label}] {what} ...")
    proc = subprocess.Popen(argv)
    while True:
        try:
            code = proc.wait(timeout=heartbeat)
            break
        except subprocess.TimeoutExpired:
            _say(f"[{label}] still {what} ({time.monotonic() - started:.0f}s so far)")
    elapsed = time.monotonic() - started
    if code == 0:
        _say(f"[{label}] {what}: done in {elapsed:.1f}s")
    else:
        _say(f"[{label}] {what}: FAILED with exit code {code} after {elapsed:.1f}s")
    return code


def main(args: list[str]) -> int:
    if len(args) < 4 or args[2] != "--":
        print("usage: step.py LABEL WHAT -- COMMAND ...", file=sys.stderr)
        return 2
    return run(args[0], args[1], args[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
