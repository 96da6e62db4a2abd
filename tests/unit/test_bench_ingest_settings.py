"""The ingest-real phase's embedder-alone side runs the graph its spawned worker runs (the worker
inherits ENGRAM_EMBED_BACKEND from the bench's environment). Pure logic, no I/O."""

from __future__ import annotations

import pytest

from bench.perf_ingest import alone_settings
from engram_episodic.errors import ConfigError


def test_the_alone_side_takes_the_workers_backend_from_the_environment():
    got = alone_settings(
        "auto", 2, 64, {"ENGRAM_EMBED_BACKEND": "openvino-bf16", "ENGRAM_EMBEDDER": "hashing"}
    )
    assert (got.embed_backend, got.embedder, got.embed_threads, got.embed_batch_size) == (
        "openvino-bf16",
        "auto",
        2,
        64,
    )  # only the backend is read: the phase names its own embedder, threads and batch
    assert alone_settings("auto", 1, 16, {}).embed_backend == "auto"


def test_a_backend_the_settings_refuse_is_refused_here_too():
    with pytest.raises(ConfigError, match="ENGRAM_EMBED_BACKEND=.tpu. must be one of"):
        alone_settings("auto", 2, 64, {"ENGRAM_EMBED_BACKEND": "tpu"})
