"""The admin commands' progress bars and summary (client/engram_episodic/cli_progress.py, cli_admin.py)."""

from __future__ import annotations

from engram_episodic.cli_admin import _facts_summary
from engram_episodic.cli_progress import Bars


def test_a_phase_that_did_fewer_units_than_announced_ends_full(capsys):
    """A replay announces a pass's entries when it fixes the pass's end; a forget deleting some
    meanwhile left the bar short of its total, its ETA never reached."""
    bars = Bars(enabled=True)
    bars.phase("stream", 10)
    bars.advance(7)
    stream = bars.bar
    bars.phase("catch-up", 3)
    bars.advance(3)
    bars.close()
    assert stream.total == stream.n == 7
    assert "7/7" in capsys.readouterr().err


def test_the_summary_says_what_was_done_with_the_facts():
    counts = {"facts": 12, "fact_scopes": 3, "facts_indexed": 12, "facts_reembedded": 12}
    assert _facts_summary(counts) == "12 facts of 3 scope(s) re-embedded"
    carried = {**counts, "facts_reembedded": 0, "facts_indexed": 10}
    assert _facts_summary(carried) == (
        "12 facts of 3 scope(s) carried over (2 not indexed: run POST /v1/consolidate)"
    )
    assert _facts_summary({**counts, "facts": 0, "fact_scopes": 0, "facts_indexed": 0}) == "no facts"
