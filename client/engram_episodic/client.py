"""Typed HTTP clients of the Engram query service, on httpx: `Engram` (sync), `AsyncEngram` (asyncio).

Both clients have the same methods with the same arguments (the package docstring shows them in use);
the async ones are coroutines. Every call is one request to one route of the API (docs/api.md); results
are the frozen dataclasses of `engram_episodic.types`; errors are `engram_episodic.errors.ApiError`
subclasses carrying `status`, `detail` and the per-field `errors` of the service's RFC 9457 problem, or
`ConnectionFailed`.

Retries. 429 and 503 answers (the service says nothing was applied) are retried after their
`Retry-After`, as are requests that never reached the service (refused connection, connect
timeout). A request whose answer was lost (read timeout, dropped connection) is retried only when the
call is idempotent in effect: reads, forgets, consolidation, and `record`/`publish`, whose episodes get
their `episode_id` and `completed_at` here before the first attempt, so a repeat is the same episode,
never a copy. A recall with `touch=True` (it counts accesses) is not retried then: it raises
`ConnectionFailed` with `maybe_applied=True`. At most `max_retries` retries, each wait capped by
`max_retry_wait` seconds.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import inspect
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, Unpack

import httpx

from engram_episodic import __version__
from engram_episodic.calls import (
    Call,
    Calls,
    WaitTimeout,
    _waited,
    joined,
    text_errors,
)
from engram_episodic.drafts import EpisodeDraft
from engram_episodic.errors import (
    ApiError,
    BadRequest,
    ConnectionFailed,
    EngramError,
    InvalidRequest,
    RateLimited,
    ResourceNotFound,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
)
from engram_episodic.events import Episode
from engram_episodic.options import (
    EpisodeListOptions,
)
from engram_episodic.parts import DEFAULT_MAX_BODY_BYTES, encode_body
from engram_episodic.types import (
    IngestResult,
    StoredEpisode,
)

DEFAULT_URL = "http://127.0.0.1:8080"
T = TypeVar("T")
P = ParamSpec("P")
H = TypeVar("H", httpx.Client, httpx.AsyncClient)
C = TypeVar("C", bound="_Base[Any]")


# --- the retry rule, shared ------------------------------------------------------------------------------
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_LOST = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
_UNSENDABLE = (httpx.TransportError, httpx.InvalidURL, UnicodeEncodeError)  # what `_attempts` takes


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: ResourceNotFound,
    413: BadRequest,
    422: BadRequest,
    429: RateLimited,
    503: ServiceUnavailable,
}


def _problem(response: httpx.Response) -> ApiError:
    """The ApiError subclass of an error answer's status (ServerError for another 5xx, else ApiError)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"detail": response.text[:500]}
    status = response.status_code
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return kind(status, body, retry_after=_retry_after(response))


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context per process: loading the CA bundle per client costs every short-lived one ~0.1 s."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class _Base(Generic[H]):
    """What both clients share: configuration, and the work of every call as coroutines, which
    `Engram._run` runs to their end and `AsyncEngram` awaits. `H`: httpx.Client or httpx.AsyncClient."""

    _HTTP: type[H]
    # the I/O of the shared coroutines, one per client: the sync client's never suspends (`Engram._run`)
    _request: Callable[[dict[str, Any]], Coroutine[Any, Any, httpx.Response]]
    _sleep: Callable[[float], Coroutine[Any, Any, None]]

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_retry_wait: float = 30.0,
        headers: Mapping[str, str] | None = None,
        http_client: H | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, not {base_url[:40]!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait
        if max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, not {max_body_bytes}")
        self.max_body_bytes = max_body_bytes
        self._headers = {"User-Agent": f"engram-episodic/{__version__}", **(headers or {})}
        if api_key:
            # the service compares keys exactly: padding or a non-ASCII byte would only ever be a 401
            # (or fail in the HTTP layer as a lost answer), so say it here
            if not api_key.isascii() or not api_key.isprintable() or api_key != api_key.strip():
                raise ValueError("api_key must be printable ASCII without leading or trailing whitespace")
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._owns = http_client is None  # a client given is the caller's to close
        self._http: H = http_client or self._HTTP(timeout=timeout, verify=_tls())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> Self:
        """A client from ENGRAM_URL (default http://127.0.0.1:$ENGRAM_PORT, port 8080), ENGRAM_API_KEY and
        ENGRAM_MAX_BODY_BYTES (the service's own setting: the largest request body, default 4 MiB).
        Raises ValueError for a bad ENGRAM_MAX_BODY_BYTES."""
        env = os.environ if env is None else env
        port = env.get("ENGRAM_PORT") or "8080"
        config: dict[str, Any] = {
            "base_url": env.get("ENGRAM_URL") or f"http://127.0.0.1:{port}",
            "api_key": env.get("ENGRAM_API_KEY") or None,
        }
        if env.get("ENGRAM_MAX_BODY_BYTES"):
            try:
                config["max_body_bytes"] = int(env["ENGRAM_MAX_BODY_BYTES"])
            except ValueError:
                raise ValueError(
                    f"ENGRAM_MAX_BODY_BYTES must be an integer (bytes), not {env['ENGRAM_MAX_BODY_BYTES'][:40]!r}"
                ) from None
        return cls(**{**config, **kwargs})

    def _adopt_limit(self, exc: ApiError) -> bool:
        """Take the smaller body limit a 413 `exc` names (the service's ENGRAM_MAX_BODY_BYTES) as
        `max_body_bytes`; whether it did."""
        limit = exc.body.get("max_body_bytes") if exc.status == 413 else None
        if isinstance(limit, int) and not isinstance(limit, bool) and 1024 <= limit < self.max_body_bytes:
            self.max_body_bytes = limit
            return True
        return False

    def _request_args(self, call: Call[Any]) -> dict[str, Any]:
        """The keyword arguments of `httpx.(Async)Client.request` for `call`."""
        args: dict[str, Any] = {
            "method": call.method,
            "url": self.base_url + call.path,
            "headers": self._headers,
            # a `?wait=` call is held that long by the service before it answers: the answer is not late
            "timeout": self.timeout + float((call.params or {}).get("wait", 0)),
        }
        if call.body is not None:
            # encoded here, as `parts.request_bodies` counts it (httpx < 0.28 escapes non-ASCII: 2x larger)
            args["content"] = encode_body(call.body)
            args["headers"] = {**self._headers, "Content-Type": "application/json"}
        if call.params:
            args["params"] = call.params
        return args

    def _read(self, call: Call[T], response: httpx.Response, earlier_lost: bool = False) -> T:
        if response.status_code >= 400:
            error = _problem(response)
            error.maybe_applied = earlier_lost  # the final answer speaks for its own attempt only
            raise error
        try:
            data = response.json()
        except ValueError:
            raise ApiError(response.status_code, {"detail": "the answer is not JSON"}) from None
        return call.parse(data)

    def _wait(self, attempt: int, response: httpx.Response | None = None) -> float:
        hinted = _retry_after(response) if response is not None else None
        backoff = min(self.max_retry_wait, 0.25 * 2**attempt) * (0.5 + random.random() / 2)
        return min(self.max_retry_wait, hinted if hinted is not None else backoff)

    async def _attempts(self, call: Call[T]) -> T:
        """Send one request with the retry rule of the module docstring and read its answer. Raises
        InvalidRequest for a request that cannot be sent (naming each query parameter or body field
        holding text with no UTF-8 form: `calls.text_errors`), ConnectionFailed when the rule says stop."""
        attempt = 0
        lost = False  # an attempt was sent and its answer lost: it may have been applied
        while True:
            retry = attempt < self.max_retries
            try:
                response = await self._request(self._request_args(call))
            except _UNSENDABLE as exc:
                if not isinstance(exc, httpx.TransportError):  # an argument httpx cannot put on the wire
                    # the encoder's position counts into the serialized request: name the field instead
                    named = text_errors(call) if isinstance(exc, UnicodeEncodeError) else []
                    if named:
                        raise InvalidRequest(named) from None
                    raise InvalidRequest(
                        [("request", f"cannot be sent: {type(exc).__name__}: {str(exc)[:200]}")]
                    ) from exc
                sent = not isinstance(exc, _NOT_SENT)
                if not retry or (sent and not (isinstance(exc, _LOST) and call.idempotent)):
                    what = "no answer from" if sent else "cannot reach"
                    note = "; an earlier attempt's answer was lost, so it may have been applied"
                    raise ConnectionFailed(
                        f"{what} {self.base_url}: {type(exc).__name__}: {exc}".rstrip(": ")
                        + (note if lost and not sent else ""),
                        maybe_applied=sent or lost,
                    ) from exc
                lost = lost or sent
                await self._sleep(self._wait(attempt))
            else:
                if not retry or response.status_code not in (429, 503):
                    return self._read(call, response, lost)
                await self._sleep(self._wait(attempt, response))
            attempt += 1

    async def _send_all(
        self,
        prepared: list[Episode],
        calls: list[Call[IngestResult]],
        wait: float | None,
        recorded: str | None = None,
    ) -> IngestResult:
        """Send the requests of `prepared` in order, again split by a smaller limit a 413 names (the same
        episodes: idempotent). `wait`, `recorded`: as `calls._waited`. An EngramError names the episode
        ids used (`exc.episode_ids`), with which a retry is harmless."""
        try:
            try:
                return _waited(joined([await self._attempts(call) for call in calls]), wait, recorded)
            except ApiError as exc:
                if not self._adopt_limit(exc):
                    raise
            _, calls = Calls.publish(prepared, wait, self.max_body_bytes)
            return _waited(joined([await self._attempts(call) for call in calls]), wait, recorded)
        except EngramError as exc:
            exc.episode_ids = tuple(e.episode_id for e in prepared)
            raise

    async def _record(
        self, episode: Episode | Mapping[str, Any] | None, fields: Mapping[str, Any], wait: float | None
    ) -> str:
        """`record`: the id of the episode published."""
        prepared, calls = Calls.record_parts(episode, fields, wait, self.max_body_bytes)
        await self._send_all([prepared], calls, wait, prepared.episode_id)
        return prepared.episode_id

    async def _recallable(self, episode_id: str, timeout: float, interval: float) -> StoredEpisode:
        """`wait_until_recallable`: the episode once stored and completed."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = await self._attempts(Calls.get_episode(episode_id))
                if found.status == "completed":
                    return found
            except ResourceNotFound:
                pass
            if time.monotonic() > deadline:
                raise WaitTimeout(f"episode {episode_id!r} not recallable after {timeout:g}s")
            await self._sleep(interval)


def _sent(route: Callable[P, Call[T]]) -> Callable[Concatenate[Any, P], T]:
    """A client method sending what `route` (a `Calls` method) describes, with its signature and docstring."""

    @functools.wraps(route)
    def send(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.call(route(*args, **kwargs))

    # what `help()` and editors show: the method's own parameters and answer, not the route's `Call[...]`
    route_signature = inspect.signature(route)
    send.__signature__ = route_signature.replace(  # type: ignore[attr-defined]
        parameters=[
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
            *route_signature.parameters.values(),
        ],
        return_annotation=str(route_signature.return_annotation).removeprefix("Call[").removesuffix("]"),
    )
    return send


# --- sync --------------------------------------------------------------------------------------------


class Engram(_Base[httpx.Client]):
    """The synchronous client. Arguments: `base_url` (default http://127.0.0.1:8080), `api_key` (sent as
    a Bearer token), `timeout` (seconds per request), `max_retries`, `max_retry_wait` (seconds), extra
    `headers`, or an `http_client` (an httpx.Client you configured; it is not closed by `close()`).
    Use as a context manager, or call `close()`."""

    _HTTP = httpx.Client

    def close(self) -> None:
        if self._owns:
            self._http.close()

    def __enter__(self) -> Engram:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """`work` (a coroutine of `_Base`) run to its end here: the sync client's I/O never suspends it."""
        try:
            work.send(None)
        except StopIteration as done:
            return done.value
        raise RuntimeError("the sync client's work awaited an event loop")

    async def _request(self, args: dict[str, Any]) -> httpx.Response:
        return self._http.request(**args)

    async def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def call(self, call: Call[T]) -> T:
        """Send one request (with the retry rule of the module docstring) and read its answer."""
        return self._run(self._attempts(call))

    # memory ------------------------------------------------------------------------------------------
    recall = _sent(Calls.recall)
    context = _sent(Calls.context)
    strategy = _sent(Calls.strategy)
    suggest = _sent(Calls.suggest)
    skills = _sent(Calls.skills)
    learning_curve = _sent(Calls.learning_curve)
    search_facts = _sent(Calls.search_facts)
    get_fact = _sent(Calls.get_fact)
    consolidate = _sent(Calls.consolidate)

    # episodes ----------------------------------------------------------------------------------------
    def record(
        self,
        episode: Episode | Mapping[str, Any] | None = None,
        /,
        *,
        wait: float | None = None,
        **fields: Any,
    ) -> str:
        """Publish one finished episode (an Episode, a dict, or keyword fields); returns its `episode_id`.

        Validated here first (InvalidEpisode names every bad field; nothing is sent), then accepted by the
        service (202; an episode larger than one request goes in parts, as `publish` sends them): it becomes recallable once the consolidator projected it. With `wait` (seconds, at
        most 30) the service answers once it is projected (read-your-writes), and WaitTimeout says it was
        accepted but not projected in time. Any failure names the id it used (`exc.episode_ids`):
        `record(episode_id=that, ...)` again is the same episode, never a copy. EpisodeForgotten: that
        episode_id was forgotten before, and nothing was published (with or without `wait`).
        """
        return self._run(self._record(episode, fields, wait))

    def publish(
        self, episodes: Iterable[Episode | Mapping[str, Any]], *, wait: float | None = None
    ) -> IngestResult:
        """Publish finished episodes (`wait`: as `record`, for each request).

        Episodes that fit one request (at most 1,000 episodes, 1,000 actions each and `max_body_bytes`
        of JSON) go in one, which the service applies all or none. More go in parts, in order (see
        `engram_episodic.parts`): each request is all or none, the whole is not, and a failure may
        leave the first parts applied. A failure names the ids it used (`exc.episode_ids`): publishing
        the same episodes again is safe (each is the same episode, never a copy)."""
        prepared, calls = Calls.publish(episodes, wait, self.max_body_bytes)
        return self._run(self._send_all(prepared, calls, wait))

    def episode(
        self,
        task: str | Mapping[str, Any],
        *,
        category: str | None = None,
        complexity: float | None = None,
        **fields: Any,
    ) -> HttpEpisode:
        """Record an episode as it happens: `with memory.episode("task") as ep: ep.action(...); ep.complete(...)`.

        Over HTTP the episode is published once, when it completes (the stream SDK also publishes its
        start and each action as they happen). Leaving the block on an exception records a `failure`
        with the error and re-raises; leaving it without `complete()` records `abandoned`.
        """
        return HttpEpisode(self, EpisodeDraft(task, category=category, complexity=complexity, **fields))

    list_episodes = _sent(Calls.list_episodes)

    def iter_episodes(self, **options: Unpack[EpisodeListOptions]) -> Iterator[Episode]:
        """Every episode of the scope, page after page (`limit` per request), following the cursors."""
        while True:
            page = self.list_episodes(**options)
            yield from page.episodes
            if page.next_cursor is None:
                return
            options["cursor"] = page.next_cursor

    list_facts = _sent(Calls.list_facts)
    get_episode = _sent(Calls.get_episode)

    def wait_until_recallable(
        self, episode_id: str, *, timeout: float = 30.0, interval: float = 0.1
    ) -> StoredEpisode:
        """Poll until the episode is projected and completed (recallable); WaitTimeout after `timeout` s.

        For an id published again, the previous version counts: use `record(..., wait=S)` to wait for
        the new one."""
        return self._run(self._recallable(episode_id, timeout, interval))

    update_episode = _sent(Calls.update_episode)
    forget_episode = _sent(Calls.forget_episode)
    forget_user = _sent(Calls.forget_user)
    forget_agent = _sent(Calls.forget_agent)
    forget_session = _sent(Calls.forget_session)
    forget_episodes = _sent(Calls.forget_episodes)
    forget_job = _sent(Calls.forget_job)
    summary = _sent(Calls.summary)
    dead_letters = _sent(Calls.dead_letters)
    redrive_dead_letters = _sent(Calls.redrive_dead_letters)
    discard_dead_letters = _sent(Calls.discard_dead_letters)
    ready = _sent(Calls.ready)


class _OpenEpisode(Generic[C]):
    """What the sync and async HTTP episodes share. A completion once sent (perhaps applied) is never
    overwritten by the block's exit: a success whose answer was lost must not become a failure."""

    def __init__(self, client: C, draft: EpisodeDraft):
        self.client = client
        self.draft = draft
        self.sent = False

    @property
    def episode_id(self) -> str:
        return self.draft.episode_id

    async def _complete(self, outcome: str, fields: Mapping[str, Any]) -> Episode:
        """Publish the completion: every action recorded, in parts when they do not fit one request."""
        snapshot = self.draft.completion(outcome, keep_actions=None, **fields)
        self.sent = True
        _, calls = Calls.publish([snapshot], max_body_bytes=self.client.max_body_bytes)
        await self.client._send_all([snapshot], calls, None)
        return self.draft.completed_with(snapshot)

    async def _exit(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        """Publish the completion the block's exit calls for: none after `complete()` was sent."""
        if self.draft.completed is None and not self.sent:
            await self._complete(*EpisodeDraft.exit_fields(exc_type, exc))


def _on_draft(method: Callable[Concatenate[EpisodeDraft, P], T]) -> Callable[Concatenate[Any, P], T]:
    """`method` of EpisodeDraft as a method of an open episode, on its draft (same signature and docstring)."""

    @functools.wraps(method)
    def run(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return method(self.draft, *args, **kwargs)

    return run


class HttpEpisode(_OpenEpisode[Engram]):
    """An open episode recorded over HTTP (see `Engram.episode`); actions are kept until completion."""

    action = _on_draft(EpisodeDraft.action)

    def complete(self, outcome: str, **fields: Any) -> Episode:
        """Publish the finished episode; returns it. `fields`: any Episode field (feedback, solution, ...).

        If publishing fails, the error says whether it may have been applied (and names the id), and
        leaving the block does not publish a `failure` over it; call `complete` again to retry."""
        return self.client._run(self._complete(outcome, fields))

    def __enter__(self) -> HttpEpisode:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        return self.client._run(self._exit(exc_type, exc))


# --- async -------------------------------------------------------------------------------------------
def _coroutine(
    method: Callable[Concatenate[Any, P], T],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]:
    """A sync client's (or episode's) `method` as the async one's coroutine method. Only for a method
    that returns what `self.call` or `self._run` returns, or does no I/O: a body that used an answer
    would get the coroutine instead."""

    @functools.wraps(method)
    async def run(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        result: Any = method(self, *args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    return run


class AsyncEngram(_Base[httpx.AsyncClient]):
    """The asyncio client: the methods of `Engram` as coroutines (`http_client`: an httpx.AsyncClient).
    Use as `async with AsyncEngram(...) as memory:`, or `await memory.aclose()`."""

    _HTTP = httpx.AsyncClient

    async def aclose(self) -> None:
        if self._owns:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncEngram:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @staticmethod
    def _run(work: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """`work` itself, for the method that asked to await (`_coroutine`)."""
        return work

    async def _request(self, args: dict[str, Any]) -> httpx.Response:
        return await self._http.request(**args)

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def call(self, call: Call[T]) -> T:
        """Send one request (with the retry rule of the module docstring) and read its answer."""
        return await self._attempts(call)

    recall = _coroutine(Engram.recall)
    context = _coroutine(Engram.context)
    strategy = _coroutine(Engram.strategy)
    suggest = _coroutine(Engram.suggest)
    skills = _coroutine(Engram.skills)
    learning_curve = _coroutine(Engram.learning_curve)
    search_facts = _coroutine(Engram.search_facts)
    get_fact = _coroutine(Engram.get_fact)
    consolidate = _coroutine(Engram.consolidate)
    record = _coroutine(Engram.record)
    publish = _coroutine(Engram.publish)
    list_episodes = _coroutine(Engram.list_episodes)
    list_facts = _coroutine(Engram.list_facts)
    get_episode = _coroutine(Engram.get_episode)
    wait_until_recallable = _coroutine(Engram.wait_until_recallable)
    update_episode = _coroutine(Engram.update_episode)
    forget_episode = _coroutine(Engram.forget_episode)
    forget_user = _coroutine(Engram.forget_user)
    forget_agent = _coroutine(Engram.forget_agent)
    forget_session = _coroutine(Engram.forget_session)
    forget_episodes = _coroutine(Engram.forget_episodes)
    forget_job = _coroutine(Engram.forget_job)
    ready = _coroutine(Engram.ready)
    summary = _coroutine(Engram.summary)
    dead_letters = _coroutine(Engram.dead_letters)
    redrive_dead_letters = _coroutine(Engram.redrive_dead_letters)
    discard_dead_letters = _coroutine(Engram.discard_dead_letters)

    def episode(
        self,
        task: str | Mapping[str, Any],
        *,
        category: str | None = None,
        complexity: float | None = None,
        **fields: Any,
    ) -> AsyncHttpEpisode:
        """See `Engram.episode`; use as `async with memory.episode(...) as ep:`."""
        return AsyncHttpEpisode(self, EpisodeDraft(task, category=category, complexity=complexity, **fields))

    async def iter_episodes(self, **options: Unpack[EpisodeListOptions]) -> AsyncIterator[Episode]:
        """See `Engram.iter_episodes` (an async iterator)."""
        while True:
            page = await self.list_episodes(**options)
            for episode in page.episodes:
                yield episode
            if page.next_cursor is None:
                return
            options["cursor"] = page.next_cursor


class AsyncHttpEpisode(_OpenEpisode[AsyncEngram]):
    """An open episode recorded over HTTP with `AsyncEngram` (see `Engram.episode`)."""

    action = _coroutine(HttpEpisode.action)
    complete = _coroutine(HttpEpisode.complete)
    __aexit__ = _coroutine(HttpEpisode.__exit__)

    async def __aenter__(self) -> AsyncHttpEpisode:
        return self
