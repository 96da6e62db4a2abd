"""Every relative link in the Markdown files of the repository root and docs/ resolves (pure: reads files only).

A link `[text](path#anchor)` must name a file or folder that exists (relative to the linking file), and its
anchor must be the slug of a heading of the target file, by GitHub's rules: the heading's text as rendered
(inline code and link text kept, markup dropped), lowercased, every character that is not a letter, digit,
space, `-` or `_` removed, spaces turned into `-`; a repeated slug gets `-1`, `-2`, ... Links inside code
blocks or inline code are not links. External links (`http:`, `https:`, `mailto:`) are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
# a closing fence is the fence alone on its line (CommonMark): "``` text" would leave the block open
CLOSING = re.compile(r"^\s*(```|~~~)\s*$")
EXTERNAL = ("http://", "https://", "mailto:")


def prose(text: str) -> str:
    """`text` with fenced code blocks emptied and inline code spans blanked (line numbers kept)."""
    out, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
            out.append("")
        else:
            out.append("" if in_code else line)
    return re.sub(r"`[^`\n]*`", "``", "\n".join(out))


def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "")
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if in_code or not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link; a link's text may wrap onto the next line."""
    text = prose(path.read_text(encoding="utf-8"))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def broken(path: Path) -> list[str]:
    out = []
    for number, target in links(path):
        if target.startswith(EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            out.append(f"{where} (no such file)")
        elif anchor:
            if dest.suffix != ".md" or dest.is_dir():
                out.append(f"{where} (an anchor into something that is not a Markdown file)")
            elif anchor not in anchors(dest):
                out.append(f"{where} (no heading with this slug in {dest.relative_to(ROOT)})")
    return out


def test_the_docs_are_there():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"README.md", "docs/architecture.md", "docs/api.md", "docs/configuration.md"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path):
    assert not broken(path), "\n".join(broken(path))


def test_slugs_follow_githubs_rules():
    assert (
        slug("`POST /v1/recall` — decay-weighted prioritized recall")
        == "post-v1recall--decay-weighted-prioritized-recall"
    )
    assert slug("`GET /v1/episodes/{episode_id}`") == "get-v1episodesepisode_id"
    assert slug("MCP (Claude Desktop / any MCP client)") == "mcp-claude-desktop--any-mcp-client"
    assert slug("Processes: `make run`") == "processes-make-run"
    assert slug("Use Engram from an agent (Python client)") == "use-engram-from-an-agent-python-client"


def test_links_skip_code_and_find_anchors(tmp_path):
    page = tmp_path / "a.md"
    page.write_text(
        "# Title\n## Part\n## Part\n[ok](#part-1) `[no](#nope)`\n```\n[no](missing.md)\n```\n"
        "[bad](#nope) [gone](missing.md) [web](https://example.com/x#y) [wrapped\ntext](#title)\n",
        encoding="utf-8",
    )
    assert anchors(page) == {"title", "part", "part-1"}
    assert [target for _, target in links(page)] == [
        "#part-1",
        "#nope",
        "missing.md",
        "https://example.com/x#y",
        "#title",
    ]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_code_block_closes_with_a_bare_fence(path):
    """A closing fence with text after it ("``` more prose") does not close the block: everything after
    it renders as code, links included."""
    in_code = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            if in_code:
                assert CLOSING.match(line), f"{path.name}:{number}: text after a closing fence"
            in_code = not in_code
    assert not in_code, f"{path.name}: a code block is never closed"
