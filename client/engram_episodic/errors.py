"""The error hierarchy every layer shares.

Domain code raises these; the HTTP edge maps each class to one status code once
(`services.query.problems`), the consolidator maps them to dead-letter reasons.
"""

from __future__ import annotations


class EngramError(Exception):
    """Base class of every error Engram raises on purpose."""

    episode_ids: tuple[str, ...] = ()  # a failed record/publish: the ids a retry reuses (never copies)


class ConfigError(EngramError):
    """A setting read from the environment is missing or malformed (names the variable)."""


class InvalidEpisode(EngramError):
    """An event or episode violates the schema.

    `errors` is a list of `(field_path, reason)` pairs, e.g. `("feedback.reward", "must be finite")`;
    `str(err)` joins them so a log line or dead-letter reason names every bad field.
    """

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = list(errors)
        super().__init__("; ".join(f"{path}: {reason}" for path, reason in self.errors))


class InvalidRequest(InvalidEpisode):
    """An argument of a call that is not an episode (a recall's filter, a path id, a value JSON cannot
    carry) cannot be sent; nothing was. `errors` as in InvalidEpisode, of which it is a subclass: a
    handler written for that (what such arguments raised before) still catches it."""


class DecodeError(EngramError):
    """A stream entry cannot be decoded: not msgpack, missing envelope keys, wrong types."""


class UnknownEventType(DecodeError):
    """The envelope names an event type this build does not know."""


class UnknownSchemaVersion(DecodeError):
    """The envelope's version is newer than this build, or has no upcaster path."""


class NotFound(EngramError):
    """The requested episode/fact does not exist in the caller's namespace."""


class Conflict(EngramError):
    """The request conflicts with stored state (e.g. an index built with another embedder)."""


class EpisodeForgotten(EngramError):
    """`record()` of an episode_id that was forgotten before: nothing was published, and a forgotten
    episode_id is never stored again (record the episode under a new one). `episode_ids` names it."""

    def __init__(self, episode_id: str):
        super().__init__(
            f"{episode_id}: this episode_id was forgotten before, so nothing was published; a forgotten "
            "episode_id is never stored again (record it under a new one)"
        )
        self.episode_ids = (episode_id,)


class PublishError(EngramError):
    """The SDK could not get Redis to accept an event within its timeout and retries.

    `maybe_stored` is False when Redis refused the events or was never reached (nothing was stored),
    True when an attempt timed out waiting for Redis's reply: the events may have been stored. Either
    way the agent may retry with the same event objects, whose `event_id`s make a duplicate harmless
    downstream (a new `record()` without an `episode_id` would be a new episode).
    """

    def __init__(self, message: str, *, maybe_stored: bool = False):
        super().__init__(message)
        self.maybe_stored = maybe_stored


class Backpressure(PublishError):
    """The consolidator is too far behind (consumer lag above the configured bound).

    Nothing was published. `retry_after` (seconds) is a hint for when to try again; the SDK waits and
    retries by itself until its publish timeout, HTTP ingest answers 429 with `Retry-After`.
    """

    def __init__(self, lag: int, max_lag: int, retry_after: float = 1.0):
        self.lag, self.max_lag, self.retry_after = lag, max_lag, retry_after
        super().__init__(f"consumer lag {lag} exceeds ENGRAM_MAX_LAG={max_lag}; retry in {retry_after:g}s")


# --- the HTTP client's errors -----------------------------------------------------------------------
class ConnectionFailed(EngramError):
    """The query service could not be reached, or did not answer in time.

    `maybe_applied` is False when the request never reached the service (refused connection, DNS,
    connect timeout) and True when it was sent and the answer was lost (read timeout, dropped
    connection): a write may then have taken effect. The client retries only calls that are
    idempotent in effect, so this reaches the caller after its retries, or at once for the others.
    """

    def __init__(self, message: str, *, maybe_applied: bool = False):
        super().__init__(message)
        self.maybe_applied = maybe_applied


class ApiError(EngramError):
    """The query service answered with an RFC 9457 problem (any status >= 400).

    `status` (int), `title`, `detail` (the service's sentence), `errors` (tuple of `(field, reason)`
    pairs for 422; empty otherwise), `retry_after` (seconds, from the `Retry-After` header, or None)
    and `body` (the problem document as a dict; a non-JSON answer is kept as `{"detail": text}`).
    """

    def __init__(self, status: int, body: dict, *, retry_after: float | None = None):
        self.status = status
        self.body = body
        self.title = str(body.get("title") or "error")
        self.detail = str(body.get("detail") or "")
        listed = body.get("errors")
        raw_errors = listed if isinstance(listed, list) else []
        self.errors = tuple(
            (str(e.get("field", "")), str(e.get("reason", ""))) for e in raw_errors if isinstance(e, dict)
        )
        self.retry_after = retry_after
        self.maybe_applied = False  # True when an earlier attempt of this call was sent and its answer lost
        lines = [f"{status} {self.title}" + (f": {self.detail}" if self.detail else "")]
        lines += [f"{field}: {reason}" for field, reason in self.errors]
        super().__init__("; ".join(lines))


class BadRequest(ApiError):
    """400 (malformed JSON), 413 (body too large) or 422 (invalid fields, listed in `errors`)."""


class Unauthorized(ApiError):
    """401: the API key is missing or unknown."""


class ResourceNotFound(ApiError, NotFound):
    """404: no such episode or fact in the caller's namespace (another namespace's ids look the same)."""


class RateLimited(ApiError):
    """429: the consolidator lags past ENGRAM_MAX_LAG; nothing was published. See `retry_after`."""


class ServiceUnavailable(ApiError):
    """503: the memory store is unavailable (Redis down or the stream refused the write)."""


class ServerError(ApiError):
    """Any other 5xx answer."""
