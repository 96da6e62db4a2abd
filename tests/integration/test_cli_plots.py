"""`engram curve --plot` and `engram skills --plot` against a real query service: in the terminal
(plotext) and as PNG files (matplotlib), each PNG checked by its size and by reading it back; and
`engram record` with `--json`."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from shared import streams
from shared.codec import decode
from shared.keys import Keys
from tests.integration.test_query_cli import run
from tests.integration.test_query_support import KEY_A, episode, put

pytest_plugins = ["tests.integration.test_query_support"]

BLUE, RED = (0x2E, 0x86, 0xC1), (0xC0, 0x39, 0x2B)  # cli_plot's success-rate line / weak bars


def pixels_near(image: Image.Image, color: tuple[int, int, int], tolerance: int = 12) -> int:
    return sum(
        n
        for n, (r, g, b) in image.convert("RGB").getcolors(maxcolors=1 << 20) or []
        if abs(r - color[0]) <= tolerance
        and abs(g - color[1]) <= tolerance
        and abs(b - color[2]) <= tolerance
    )


@pytest.fixture
async def seeded(tenants, redis, prefix):
    outcomes = ["failure", "failure", "success", "failure", "success", "success", "success", "success"]
    for i, outcome in enumerate(outcomes):
        await put(
            redis,
            prefix,
            "ns-a",
            episode(
                f"p{i}",
                task=f"upgrade the postgres cluster {i}",
                agent_id="ops",
                category="databases" if i % 2 else "networking",
                outcome=outcome,
                reward=1.0 if outcome == "success" else 0.1,
                completed_at=1_700_000_000.0 + i,
            ),
        )
    for i, outcome in enumerate(["failure", "success", "failure", "failure"]):  # 25%: weak
        await put(
            redis, prefix, "ns-a", episode(f"w{i}", agent_id="ops", category="security", outcome=outcome)
        )
    return tenants


async def test_curve_plot_png_and_terminal(seeded, tmp_path):
    png = tmp_path / "curve.png"
    out = await run(
        seeded, "curve", "--agent-id", "ops", "--window", "3", "--plot", "--out", str(png), key=KEY_A
    )
    assert out.exit_code == 0, out.output
    assert out.output.strip() == f"wrote {png}"
    assert 10_000 < png.stat().st_size < 2_000_000
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (1200, 600)
        assert pixels_near(image, BLUE) > 500  # the success-rate line is drawn, not an empty frame
    out = await run(seeded, "curve", "--agent-id", "ops", "--plot", key=KEY_A)
    assert out.exit_code == 0, out.output
    assert "Learning curve" in out.output and "cumulative reward" in out.output
    assert len(out.output.splitlines()) >= 20


async def test_skills_plot_marks_the_weak_categories(seeded, tmp_path):
    png = tmp_path / "skills.png"
    out = await run(seeded, "skills", "--agent-id", "ops", "--plot", "--out", str(png), key=KEY_A)
    assert out.exit_code == 0, out.output
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] == 1200
        assert pixels_near(image, RED) > 500 and pixels_near(image, BLUE) > 500  # weak and strong bars
    out = await run(seeded, "skills", "--agent-id", "ops", "--plot", key=KEY_A)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert any("security WEAK" in line for line in lines)
    assert not any("databases WEAK" in line or "networking WEAK" in line for line in lines)
    out = await run(seeded, "skills", "--agent-id", "nobody", "--plot", key=KEY_A)
    assert out.exit_code == 1 and "nothing to plot" in out.output


async def test_record_from_options(tenants, redis, prefix):
    out = await run(
        tenants,
        "record",
        "fix the flaky login test",
        "--outcome",
        "success",
        "--category",
        "testing",
        "--reward",
        "0.9",
        "--strategy",
        "iterative",
        "--agent-id",
        "coder",
        "--episode-id",
        "rec-1",
        "--json",
        key=KEY_A,
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["results"][0]["episode_id"] == "rec-1"
    (event,) = [decode(e.payload) for e in await streams.read_range(redis, Keys(prefix).stream)]
    ep = event.episode
    assert (ep.task.description, ep.task.category, ep.outcome, ep.strategy_used, ep.agent_id) == (
        "fix the flaky login test",
        "testing",
        "success",
        "iterative",
        "coder",
    )
    assert ep.feedback is not None and ep.feedback.reward == 0.9
    out = await run(tenants, "record", "t", "--outcome", "won", key=KEY_A)
    assert out.exit_code == 2  # not an outcome


async def test_a_plot_to_a_missing_directory_is_one_line(seeded, tmp_path):
    for command in ("curve", "skills"):
        png = tmp_path / "no-such-dir" / f"{command}.png"
        out = await run(seeded, command, "--agent-id", "ops", "--plot", "--out", str(png), key=KEY_A)
        assert out.exit_code == 1, out.output
        assert f"cannot write {png}" in out.output and "Traceback" not in out.output
