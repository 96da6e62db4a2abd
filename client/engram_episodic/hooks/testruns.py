"""The project's tests, as a coding agent runs them: which shell commands run tests, and the counts their
output reports (pure: text in, counts out).

Recognised runners: pytest, jest, vitest, mocha (directly or through `npm`/`yarn`/`pnpm test`), `go
test`, `cargo test`, `mvn test` and `make test`, plus the commands named in the hooks' configuration
(`test_commands`). The counts are those the runner's own summary prints; skipped tests count in neither.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

_RUNNERS = re.compile(  # a runner's name as a word of its own: not `jest-cli`, not `pytest.ini`
    r"(?<![\w.-])(?:pytest|py\.test|(?:npm|yarn|pnpm|bun)\s+(?:run\s+)?test|vitest|jest|mocha|go\s+test|cargo\s+test"
    r"|mvnw?\b[^|;&]*\btest|gradlew?\b[^|;&]*\btest|make\s+test|tox|nox)(?![\w.-])"
)
MAX_FAILURE_LINES = 3
"""Failing tests named in the feedback message (the first ones the output lists)."""


@dataclass(frozen=True, slots=True)
class TestRun:
    """One run of the tests: `passed` of `total` (failed and errored tests included in `total`); `failures`
    the first failing tests the output names (`FAILED tests/test_x.py::test_y - AssertionError`)."""

    __test__ = False  # not a pytest test class

    passed: int
    total: int
    failures: tuple[str, ...] = ()

    def summary(self) -> str:
        """`3/4 tests passed` (`no test ran` for a run that errored before any)."""
        return f"{self.passed}/{self.total} tests passed" if self.total else "no test ran"


def runs_tests(command: str, extra: Iterable[str] = ()) -> bool:
    """Whether the shell `command` runs the project's tests: a known runner, or contains one of `extra`
    (the configured `test_commands`, matched as substrings)."""
    return bool(_RUNNERS.search(command)) or any(e and e in command for e in extra)


def _count(pattern: str, text: str) -> int:
    return sum(int(n) for n in re.findall(pattern, text))


def _last(pattern: str, text: str) -> re.Match[str] | None:
    found = list(re.finditer(pattern, text, re.M))
    return found[-1] if found else None


def _pytest(text: str) -> tuple[int, int] | None:
    # `=== 1 failed, 2 passed, 1 error in 0.12s ===` or, with -q, `1 failed, 2 passed in 0.12s`
    line = _last(r"^[= ]*((?:\d+ \w+(?:, )?)+) in [\d.]+s\b", text)
    if line is None:
        return None
    counts = dict((word, int(n)) for n, word in re.findall(r"(\d+) (\w+)", line.group(1)))
    passed = counts.get("passed", 0)
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    return passed, passed + failed


def _tally(pattern: str, text: str) -> tuple[int, int] | None:
    """jest's `Tests: 1 failed, 2 passed, 3 total` or vitest's `Tests  1 failed | 2 passed (3)`."""
    line = _last(pattern, text)
    if line is None:
        return None
    failed, passed = _count(r"(\d+) failed", line.group(1)), _count(r"(\d+) passed", line.group(1))
    return passed, passed + failed


_jest = functools.partial(_tally, r"^Tests:\s+(.*\d+ total)")
_vitest = functools.partial(_tally, r"^\s*Tests\s+(.*\(\d+\))")


def _mocha(text: str) -> tuple[int, int] | None:
    passing, failing = _last(r"^\s*(\d+) passing\b", text), _last(r"^\s*(\d+) failing\b", text)
    if passing is None and failing is None:
        return None
    passed, failed = (int(m.group(1)) if m else 0 for m in (passing, failing))
    return passed, passed + failed


def _cargo(text: str) -> tuple[int, int] | None:
    # one `test result:` line per test binary: summed
    lines = re.findall(r"^test result: \w+\. (\d+) passed; (\d+) failed", text, re.M)
    if not lines:
        return None
    passed, failed = sum(int(p) for p, _ in lines), sum(int(f) for _, f in lines)
    return passed, passed + failed


def _maven(text: str) -> tuple[int, int] | None:
    # the last `Tests run:` line is the build's total (each test class prints one before it)
    line = _last(r"Tests run: (\d+), Failures: (\d+), Errors: (\d+), Skipped: (\d+)\s*$", text)
    if line is None:
        return None
    run, failures, errors, skipped = (int(g) for g in line.groups())
    return run - skipped - failures - errors, run - skipped


def _go(text: str) -> tuple[int, int] | None:
    # `go test -v` prints a line per test; without -v only failing tests and one line per package
    passed, failed = len(re.findall(r"^--- PASS: ", text, re.M)), len(re.findall(r"^--- FAIL: ", text, re.M))
    if passed:
        return passed, passed + failed
    ok, bad = len(re.findall(r"^ok[ \t]+\S", text, re.M)), len(re.findall(r"^FAIL[ \t]+\S", text, re.M))
    if ok or bad:
        return ok, ok + bad
    return None


_PARSERS = (_pytest, _jest, _vitest, _cargo, _maven, _go, _mocha)
_FAILURE_LINE = re.compile(
    r"^(?:FAILED \S+.*|ERROR \S+.*|--- FAIL: \S+.*|test \S+ \.\.\. FAILED|\s*[✕×] .+|\s*● .+ › .+)$", re.M
)


def parse_test_output(text: str, *, failed: bool = False) -> TestRun | None:
    """The counts the runner's summary in `text` reports, with the first failing tests it names.

    `failed`: the command exited non-zero. Output without a recognised summary is None (not a test run)
    unless the command failed: then it is a run where no test passed (`0/0`: a collection or build
    error before any test ran)."""
    failures = tuple(m.group(0).strip()[:200] for m in _FAILURE_LINE.finditer(text))[:MAX_FAILURE_LINES]
    for parse in _PARSERS:
        counts = parse(text)
        if counts is not None:
            passed, total = counts
            return TestRun(max(0, passed), max(0, total), failures)
    return TestRun(0, 0, failures) if failed else None
