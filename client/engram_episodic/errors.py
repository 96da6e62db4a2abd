"""The error hierarchy every layer shares.

Domain code raises these; the HTTP edge maps each class to one status code once
(`services.query.problems`), the consolidator maps them to dead-letter reasons.
"""

from __future__ import annotations


class EngramError(Exception):
    """Base class of every error Engram raises on purpose."""


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
