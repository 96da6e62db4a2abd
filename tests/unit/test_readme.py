"""README.md stays readable: no paragraph (or list item) of more than 8 lines (pure: reads the file)."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
MAX_LINES = 8


def _blocks(text: str) -> list[tuple[int, list[str]]]:
    """Paragraphs and list items outside code fences, each with its first line number."""
    blocks: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start, fenced = 0, False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            current = []
            continue
        if fenced or not line.strip() or line.startswith(("#", "|")):
            current = []
            continue
        if line.startswith(("- ", "* ")) or not current:
            current = [line]
            start = n
            blocks.append((start, current))
        else:
            current.append(line)
    return blocks


def test_no_readme_paragraph_is_longer_than_eight_lines():
    long = [(n, len(b)) for n, b in _blocks(README.read_text(encoding="utf-8")) if len(b) > MAX_LINES]
    assert not long, f"README.md paragraphs over {MAX_LINES} lines (line, length): {long}"


def test_the_check_sees_a_long_paragraph():
    assert [len(b) for _, b in _blocks("a\n" * 9 + "\n- b\n  c\n")] == [9, 2]
