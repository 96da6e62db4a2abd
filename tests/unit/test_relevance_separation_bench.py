"""`bench.relevance_separation`: its AUC is the Mann-Whitney statistic, and a one-conversation run
with the hashing embedder reports every mode (skipped where LoCoMo is not on disk)."""

from __future__ import annotations

import numpy as np
import pytest

from bench import relevance_separation as sep
from bench.locomo import DEFAULT_DATA


def test_auc_counts_ties_half():
    assert sep.auc(np.array([0.9, 0.8]), np.array([0.1, 0.2])) == 1.0
    assert sep.auc(np.array([0.1]), np.array([0.9])) == 0.0
    assert sep.auc(np.array([0.5, 0.5]), np.array([0.5])) == 0.5


@pytest.mark.skipif(not DEFAULT_DATA.exists(), reason="LoCoMo is not on disk")
def test_one_conversation_reports_every_mode():
    result = sep.report(sep.pairs(DEFAULT_DATA, sep.embedder_of("hashing"), conversations=1))
    assert set(result) == {"hybrid", "vector", "keyword"}
    for line in result.values():
        assert 0.0 <= line["AUC one-word"] <= 1.0 and 0.0 <= line["R@10"] <= 100.0
