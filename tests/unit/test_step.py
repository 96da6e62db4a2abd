"""deploy/step.py: a Makefile step says when it starts, that it still runs, and how long it took."""

from __future__ import annotations

import re
import sys

from deploy import step


def test_a_step_says_start_heartbeat_and_its_time(capsys):
    code = step.run("2/4", "sleeping", [sys.executable, "-c", "import time; time.sleep(0.3)"], heartbeat=0.1)
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "engram ◆ [2/4] sleeping ..."
    assert any(line.startswith("engram ◆ [2/4] still sleeping (") for line in out[1:-1]), out
    assert re.fullmatch(r"engram ◆ \[2/4\] sleeping: done in 0\.\ds", out[-1]), out


def test_a_failing_step_says_so_with_its_exit_code(capsys):
    assert step.main(["1/1", "failing", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert "failing: FAILED with exit code 3 after" in capsys.readouterr().out
    assert step.main(["no", "separator"]) == 2
