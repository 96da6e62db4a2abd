"""engram_episodic: the client side of Engram, episodic memory for LLM agents.

    from engram_episodic import Engram

    with Engram("http://127.0.0.1:8080", api_key="...") as memory:
        memory.record(task="fix the flaky login test", outcome="success", feedback={"reward": 1.0})
        for hit in memory.recall("the login test fails at night", top_k=3):
            print(hit.priority, hit.episode.task.description)

`Engram` / `AsyncEngram` (engram_episodic.client) are typed HTTP clients of the query service. The
episode model (`engram_episodic.events`), its validation (`.validation`), its JSON shape (`.shapes`),
UTC time helpers and the error hierarchy (`.errors`) live in this package, below every server module,
so an agent that installs only this package builds and validates episodes exactly as the service does.
"""

__version__ = "0.1.0"

from engram_episodic.client import AsyncEngram, Engram, WaitTimeout  # noqa: E402
from engram_episodic.errors import (  # noqa: E402
    ApiError,
    BadRequest,
    ConnectionFailed,
    EngramError,
    EpisodeForgotten,
    InvalidEpisode,
    InvalidRequest,
    RateLimited,
    ResourceNotFound,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
)
from engram_episodic.events import Action, Episode, Feedback, Task  # noqa: E402

__all__ = [
    "Action",
    "ApiError",
    "AsyncEngram",
    "BadRequest",
    "ConnectionFailed",
    "Engram",
    "EngramError",
    "Episode",
    "EpisodeForgotten",
    "Feedback",
    "InvalidEpisode",
    "InvalidRequest",
    "RateLimited",
    "ResourceNotFound",
    "ServerError",
    "ServiceUnavailable",
    "Task",
    "Unauthorized",
    "WaitTimeout",
    "__version__",
]
