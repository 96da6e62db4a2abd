"""The learning curve's figure (client/engram_episodic/cli_plot.py), without I/O."""

from __future__ import annotations

import pytest

from engram_episodic.types import CurvePoint

pytest.importorskip("matplotlib")  # the client's plot extra; `make test` installs it


def test_a_short_learning_curve_has_whole_episode_ticks():
    """A three-episode curve has x ticks at whole episodes, not at 1.5 and 2.5."""
    from engram_episodic.cli_plot import _pyplot, curve_figure

    points = [
        CurvePoint(
            episode=i,
            episode_id=f"e{i}",
            completed_at=1_700_000_000.0 + i,
            reward=0.5,
            outcome="success",
            cumulative_reward=0.5 * i,
            success_rate=1.0,
            avg_reward=0.5,
        )
        for i in (1, 2, 3)
    ]
    fig = curve_figure(points, window=3)
    try:
        ticks = fig.axes[0].get_xticks()
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    finally:
        _pyplot().close(fig)
