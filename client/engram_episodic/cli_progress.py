"""Progress bars of the long commands (`replay`, `reindex`, `redrive`, `import`): tqdm on stderr, with
the rate and the ETA; drawn on a terminal, or wherever `--progress` asks."""

from __future__ import annotations

import sys
from typing import Any

import click


class Bars:
    """Where a long run (a replay, a redrive) reports how far it is: one tqdm bar per phase, with the
    rate and the ETA (`enabled=False`: none)."""

    def __init__(self, *, enabled: bool | None, units: dict[str, str] | None = None):
        from tqdm import tqdm

        self._tqdm = tqdm
        self.enabled = enabled
        self.units = units or {}
        self.bar: Any = None

    def phase(self, name: str, total: int | None) -> None:
        """A new phase: the previous one is done, so its bar ends full even when it did fewer units than
        announced (a replay's total counts entries deleted since, by a forget)."""
        if self.bar is not None and self.bar.total and self.bar.n < self.bar.total:
            self.bar.total = self.bar.n
            self.bar.refresh()
        self.close()
        self.bar = self._tqdm(
            total=total,
            desc=name,
            unit=self.units.get(name, "it"),
            file=sys.stderr,
            disable=None if self.enabled is None else not self.enabled,  # None: only on a terminal
            dynamic_ncols=True,
            mininterval=0.2,
        )

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="Draw a progress bar on stderr (default: when stderr is a terminal).",
)
