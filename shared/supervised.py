"""A service started by `make run` goes when its supervisor goes.

`make run` (services/run.py) sets `ENGRAM_SUPERVISOR_PID` in the environment of the consolidators and
the query service it starts. Each asks the kernel for SIGTERM when its parent dies (Linux
`prctl(PR_SET_PDEATHSIG)`), so a supervisor killed with SIGKILL does not leave workers that reconnect to
the next Redis on the same port and consume its stream, or a query service that keeps the port. SIGTERM
is the graceful stop of both (the batch in hand is acked; requests in flight are answered).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Mapping

SUPERVISOR_PID = "ENGRAM_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def follow_supervisor(env: Mapping[str, str]) -> bool:
    """Ask for SIGTERM when the parent process dies, when `env` names a supervisor pid; returns False
    when that supervisor is already gone (this process was orphaned before it asked: the caller exits),
    True otherwise (no supervisor named, or a system without prctl: nothing asked)."""
    raw = env.get(SUPERVISOR_PID, "")
    if not raw.isdigit():
        return True
    with contextlib.suppress(OSError, AttributeError):  # not Linux: no prctl, the orphan stays
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    # the parent may have died between fork and prctl: then the signal never comes
    return os.getppid() == int(raw)
