"""The mpnet model is unpacked once for all processes: two that load it at the same time on a first start
(`make run`'s query service and consolidator) share one extraction under a file lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.embedding import MPNetEmbedder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
LOAD = (
    "import logging, sys; logging.basicConfig(level='INFO', format='%(message)s');"
    "from shared.embedding import MPNetEmbedder;"
    "print(MPNetEmbedder(cache_dir=sys.argv[1]).model_path(), flush=True)"
)


def test_two_processes_starting_together_unpack_the_model_once(tmp_path):
    if not MPNetEmbedder.available():
        pytest.skip("the [mpnet] extra is not installed")
    cache = tmp_path / "models"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD, str(cache)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=280) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    paths = {out.strip() for out, _ in outs}
    assert paths == {str(cache / "all-mpnet-base-v2")}
    said = "".join(err for _, err in outs)
    assert said.count("model extracted") == 1, said  # one unpacked, the other waited and reused it
    assert (cache / "all-mpnet-base-v2" / "modules.json").exists()
    assert not [p for p in cache.iterdir() if p.name.startswith(".mpnet-")]  # no leftovers
