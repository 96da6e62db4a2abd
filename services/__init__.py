"""Engram's server processes: the consolidator, the query service, `make run` and `engram-admin`."""

from __future__ import annotations

import sys
from typing import NoReturn

import click


def refuse(command: str, message: str) -> NoReturn:
    """A configuration error, as `make run` reports one: one line on stderr, exit code 2 (a retry
    cannot fix it; docs/reliability.md)."""
    context = click.get_current_context(silent=True)
    program = context.find_root().info_name if context is not None else None
    click.echo(f"{program or 'engram-admin'} {command}: {message}", err=True)
    sys.exit(2)
