"""What the adapters share: a sync/async client pair and the default scope (no framework imports)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from engram_episodic.client import AsyncEngram, Engram
from engram_episodic.validation import MAX_ID_CHARS, Collector, check_tag_value

if TYPE_CHECKING:  # imported where used: the adapters that only record (langgraph) do not need tools
    from engram_episodic.tools import ToolResult, ToolSpec

T = TypeVar("T")
SCOPE_KEYS = ("agent_id", "user_id", "session_id")
DIGEST_PREFIX = "sha256:"


def as_tag(value: str, max_chars: int = MAX_ID_CHARS) -> str:
    """A framework's identifier (a LangGraph thread id, a tool name) as an Engram id or tag value.

    `value` itself when the service takes it (1..`max_chars` characters, no control characters, no
    leading or trailing whitespace, valid Unicode); otherwise "sha256:" and the hex SHA-256 of its UTF-8
    (a lone surrogate encoded as such): 71 characters, the same for the same value, and two values
    never merge as a cut to `max_chars` characters would merge every pair that share a prefix.
    """
    if check_tag_value(value, "id", Collector(), max_chars=max_chars, required=True) == value:
        return value
    return DIGEST_PREFIX + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


class Clients:
    """An `Engram` and/or an `AsyncEngram`, and the default scope, of one adapter (`where` names it in errors).

    Sync calls use the `Engram`; async calls the `AsyncEngram`, or the `Engram` in a worker thread. With
    only an `AsyncEngram`, a sync call is a TypeError that says what to do (there is no safe way to drive
    an asyncio client from a sync call that may itself run inside an event loop). `scope` is checked: only
    agent_id / user_id / session_id, as non-empty strings (None dropped); else TypeError.
    """

    def __init__(
        self,
        client: Engram | AsyncEngram,
        async_client: AsyncEngram | None = None,
        *,
        where: str,
        scope: Mapping[str, Any],
    ):
        self.where = where
        self.sync = client if isinstance(client, Engram) else None
        self.aio = client if isinstance(client, AsyncEngram) else None
        if self.sync is None and self.aio is None:
            raise TypeError(
                f"{where}: client must be an engram_episodic.Engram or AsyncEngram, "
                f"not {type(client).__name__}"
            )
        if async_client is not None:
            if not isinstance(async_client, AsyncEngram):
                raise TypeError(
                    f"{where}: async_client must be an engram_episodic.AsyncEngram, "
                    f"not {type(async_client).__name__}"
                )
            if self.aio is not None:
                raise TypeError(
                    f"{where}: client is already an AsyncEngram; pass an Engram as client "
                    "and the AsyncEngram as async_client"
                )
            self.aio = async_client
        unknown = sorted(set(scope) - set(SCOPE_KEYS))
        if unknown:
            raise TypeError(
                f"{where}: unknown scope argument(s) {', '.join(unknown)}; "
                f"the default scope is {', '.join(SCOPE_KEYS)}"
            )
        for key, value in scope.items():
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{where}: {key} must be a non-empty string, not {value!r}")
        self.scope: dict[str, str] = {k: v for k, v in scope.items() if v is not None}

    def run(self, fn: Callable[[Engram], T]) -> T:
        """`fn` with the sync client, or a TypeError explaining how to run this adapter without one."""
        if self.sync is None:
            raise TypeError(
                f"{self.where} was built with an AsyncEngram only: run it asynchronously "
                "(ainvoke / astream), or pass an Engram as client and the AsyncEngram as "
                "async_client"
            )
        return fn(self.sync)

    async def arun(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(client)` awaited with the async client, or run with the sync one in a worker thread (the
        clients' methods have the same names, so one `fn` serves both)."""
        if self.aio is not None:
            return await fn(self.aio)
        return await asyncio.to_thread(self.run, fn)

    def dispatch(self, name: str, arguments: Any, errors: Literal["result", "raise"]) -> ToolResult:
        """`engram_episodic.tools.dispatch` of tool `name` with `arguments` (a mapping or JSON text) and
        the default scope, on the sync client."""
        from engram_episodic.tools import dispatch

        return self.run(lambda c: dispatch(c, name, arguments, errors=errors, **self.scope))

    async def adispatch(self, name: str, arguments: Any, errors: Literal["result", "raise"]) -> ToolResult:
        """`dispatch`, awaited: `tools.adispatch` on the async client, or `tools.dispatch` on the sync
        one in a worker thread."""
        from engram_episodic.tools import adispatch

        if self.aio is None:
            return await asyncio.to_thread(self.dispatch, name, arguments, errors)
        return await adispatch(self.aio, name, arguments, errors=errors, **self.scope)


def tool_clients(
    client: Engram | AsyncEngram,
    async_client: AsyncEngram | None,
    names: Iterable[str] | None,
    errors: str,
    scope: Mapping[str, Any],
    where: str,
) -> tuple[Clients, tuple[ToolSpec, ...]]:
    """The clients and the tools (all, or `names`) of a tool adapter. Raises ValueError for an `errors`
    other than "result" / "raise" or a bad scope id, TypeError as `Clients`, UnknownTool for a bad name."""
    from engram_episodic.tools import Toolset

    if errors not in ("result", "raise"):
        raise ValueError(f"errors must be 'result' or 'raise', not {errors!r}")
    clients = Clients(client, async_client, where=where, scope=scope)
    return clients, Toolset(client, names=names, **clients.scope).tools  # checks the ids and the names
