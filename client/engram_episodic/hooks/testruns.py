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


def _tally(pattern: str, text: str, *, every: bool = False) -> tuple[int, int] | None:
    """Counts from the summary `pattern` matches (the last one, or with `every` all of them summed): its
    `N passed` tests pass, its `N failed` and `N error(s)` ones fail."""
    found = list(re.finditer(pattern, text, re.M))
    if not found:
        return None
    summary = "\n".join(m.group(0) for m in (found if every else found[-1:]))
    passed = sum(int(n) for n in re.findall(r"(\d+) passed\b", summary))
    return passed, passed + sum(int(n) for n in re.findall(r"(\d+) (?:failed|errors?)\b", summary))


def _mocha(text: str) -> tuple[int, int] | None:
    # `14 passing (30ms)`, then `2 failing` when there are: the last of each
    found = [re.findall(rf"^\s*(\d+) {word}\b", text, re.M) for word in ("passing", "failing")]
    if not any(found):
        return None
    passed, failed = (int(counts[-1]) if counts else 0 for counts in found)
    return passed, passed + failed


def _maven(text: str) -> tuple[int, int] | None:
    # the last `Tests run:` line is the build's total (each test class prints one before it)
    lines = re.findall(r"Tests run: (\d+), Failures: (\d+), Errors: (\d+), Skipped: (\d+)\s*$", text, re.M)
    if not lines:
        return None
    run, failures, errors, skipped = (int(g) for g in lines[-1])
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


_PARSERS = (  # tried in this order; each gives (passed, total) or None
    # pytest: `=== 1 failed, 2 passed, 1 error in 0.12s ===` or, with -q, `1 failed, 2 passed in 0.12s`
    functools.partial(_tally, r"^[= ]*(?:\d+ \w+(?:, )?)+ in [\d.]+s\b"),
    functools.partial(_tally, r"^Tests:\s+.*\d+ total"),  # jest: `Tests: 1 failed, 2 passed, 3 total`
    functools.partial(_tally, r"^\s*Tests\s+.*\(\d+\)"),  # vitest: `Tests  1 failed | 2 passed (3)`
    # cargo: `test result: FAILED. 1 passed; 2 failed; 0 ignored`, one per test binary: summed
    functools.partial(_tally, r"^test result: \w+\. \d+ passed; \d+ failed", every=True),
    _maven,
    _go,
    _mocha,
)
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
