"""bench.common.proc_cpu: the CPU a spawned worker used, finer than a clock tick."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.common import proc_cpu

CHILD = """
import sys, time
t = time.process_time()
while time.process_time() - t < 0.003:
    pass
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_childs_cpu_is_read_in_nanoseconds_not_clock_ticks():
    # user + system time from /proc/PID/stat comes in ticks (1/100 s here), so a tiny ingest round's
    # worker could show 0 and its CPU ratio was NaN (a fresh-clone run of test_perf_suite_tiny)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        used = proc_cpu([child])
        ticks = used * os.sysconf("SC_CLK_TCK")
        assert 0.003 <= used < 10.0
        assert abs(ticks - round(ticks)) > 1e-6, f"{used} s is a whole number of clock ticks"
    finally:
        child.communicate(b"")


def test_a_process_that_is_gone_counts_nothing():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert proc_cpu([child]) == 0.0
