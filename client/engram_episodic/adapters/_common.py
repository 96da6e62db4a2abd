"""What the adapters share: a sync/async client pair and the default scope (no framework imports)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from engram_episodic.client import AsyncEngram, Engram
from engram_episodic.validation import MAX_ID_CHARS, Collector, check_tag_value

if TYPE_CHECKING:  # imported where used: the adapters that only record (langgraph) do not need tools
    from engram_episodic.tools import ToolResult

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


def check_scope(scope: Mapping[str, Any], where: str) -> dict[str, str]:
    """The default scope keyword arguments, checked: only agent_id / user_id / session_id, as strings.

    None values are dropped (an unset default). Raises TypeError naming an unknown key or a bad value.
    """
    unknown = sorted(set(scope) - set(SCOPE_KEYS))
    if unknown:
        raise TypeError(
            f"{where}: unknown scope argument(s) {', '.join(unknown)}; "
            f"the default scope is {', '.join(SCOPE_KEYS)}"
        )
    out = {}
    for key, value in scope.items():
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise TypeError(f"{where}: {key} must be a non-empty string, not {value!r}")
        out[key] = value
    return out


class Clients:
    """An `Engram` and/or an `AsyncEngram`: sync calls use the first, async calls the second.

    With only an `Engram`, async calls run it in a worker thread; with only an `AsyncEngram`, a sync
    call is a TypeError that says what to do (there is no safe way to drive an asyncio client from a
    sync call that may itself run inside an event loop).
    """

    def __init__(self, client: Engram | AsyncEngram, async_client: AsyncEngram | None = None, *, where: str):
        self.where = where
        self.sync: Engram | None = None
        self.aio: AsyncEngram | None = None
        if isinstance(client, Engram):
            self.sync = client
        elif isinstance(client, AsyncEngram):
            self.aio = client
        else:
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

    def need_sync(self) -> Engram:
        """The sync client, or a TypeError explaining how to run this adapter without one."""
        if self.sync is None:
            raise TypeError(
                f"{self.where} was built with an AsyncEngram only: run it asynchronously "
                "(ainvoke / astream), or pass an Engram as client and the AsyncEngram as "
                "async_client"
            )
        return self.sync

    def run(self, fn: Callable[[Engram], T]) -> T:
        """Call `fn` with the sync client."""
        return fn(self.need_sync())

    async def arun(self, afn: Callable[[AsyncEngram], Awaitable[T]], fn: Callable[[Engram], T]) -> T:
        """Await `afn` with the async client, or run `fn` with the sync one in a worker thread."""
        if self.aio is not None:
            return await afn(self.aio)
        sync = self.need_sync()
        return await asyncio.to_thread(fn, sync)

    def dispatch(self, name: str, arguments: Any, scope: Mapping[str, Any]) -> ToolResult:
        """`engram_episodic.tools.dispatch` of tool `name` with `arguments` (a mapping or JSON text) and
        the `scope` keywords, on the sync client (errors raised, as there)."""
        from engram_episodic.tools import dispatch

        return self.run(lambda c: dispatch(c, name, arguments, **scope))

    async def adispatch(self, name: str, arguments: Any, scope: Mapping[str, Any]) -> ToolResult:
        """`dispatch`, awaited: `tools.adispatch` on the async client, or `tools.dispatch` on the sync
        one in a worker thread."""
        from engram_episodic.tools import adispatch, dispatch

        return await self.arun(
            lambda c: adispatch(c, name, arguments, **scope),
            lambda c: dispatch(c, name, arguments, **scope),
        )
