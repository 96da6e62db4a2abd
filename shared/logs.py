"""Logging of every Engram process, set up once in its entry point: `configure(env)`.

`ENGRAM_LOG_LEVEL` (default INFO) and `ENGRAM_LOG_FORMAT`: `text` (default) writes
`2026-12-01 16:07:29,238 INFO engram.query message`, `json` one JSON object per line (`time` UTC ISO
8601, `level`, `logger`, `message`, then the record's `extra` fields). Both go through
`RedactCredentials`, so no `Authorization` value or Bearer/Basic credential reaches a log line. Values
are read leniently here: `Settings.from_env`, called next by every entry point, refuses a bad one.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

from shared.settings import LOG_FORMATS

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

# a scheme then its credentials, as text or inside the repr() of raw bytes (which escapes \x00 etc.)
_CREDENTIALS = re.compile(r"(?i)\b(bearer|basic|token)([ \t]+|\\t)[^\s'\"\\,;]+")
_AUTH_HEADER = re.compile(r"(?i)(authorization[ \t]*:[ \t]*)[^\r\n'\"]*")


def redact(text: str) -> str:
    """`text` with every `Authorization:` value and Bearer/Basic credential replaced by `[redacted]`."""
    text = _AUTH_HEADER.sub(r"\1[redacted]", text)
    return _CREDENTIALS.sub(r"\1 [redacted]", text)


class RedactCredentials(logging.Filter):
    """Rewrites a record's message and traceback without credentials (on every handler `configure`
    installs, and on aiohttp's loggers: `services.query.server.install_log_redaction`)."""

    _format = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info:
            # formatted once here, redacted, and the exception dropped: a handler formatting exc_info
            # itself would print the raw message again
            record.exc_text = redact(record.exc_text or self._format.formatException(record.exc_info))
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


class EngramJsonFormatter(JsonFormatter):
    """python-json-logger's formatter with Engram's keys (`time`, `level`, `logger`, `message`, then
    the record's extras) and every string extra redacted."""

    def __init__(self) -> None:
        super().__init__(
            "{levelname}{name}{message}",
            style="{",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",
        )

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict) -> None:
        super().add_fields(log_data, record, message_dict)
        for key, value in log_data.items():
            if isinstance(value, str) and key != "time":
                log_data[key] = redact(value)


def log_format(env: Mapping[str, str]) -> str:
    """`ENGRAM_LOG_FORMAT` (`text` or `json`; anything else reads as `text`, Settings refuses it)."""
    value = env.get("ENGRAM_LOG_FORMAT") or "text"
    return value if value in LOG_FORMATS else "text"


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of `fmt` (`text` or `json`)."""
    return EngramJsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def configure(env: Mapping[str, str], *, stream: TextIO | None = None) -> str:
    """Send the root logger's records to `stream` (default stderr) at `ENGRAM_LOG_LEVEL` in
    `ENGRAM_LOG_FORMAT`, with credentials redacted; replaces handlers an earlier call installed.
    Returns the format in force."""
    fmt = log_format(env)
    level = (env.get("ENGRAM_LOG_LEVEL") or "INFO").upper()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(RedactCredentials())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "engram", False)]:
        root.removeHandler(old)
    handler.engram = True  # type: ignore[attr-defined]  # ours: replaced by the next call
    root.addHandler(handler)
    root.setLevel(level if level in logging.getLevelNamesMapping() else "INFO")
    return fmt


def line(fmt: str, message: str, *, logger: str, level: int = logging.INFO) -> str:
    """One line of `message` in `fmt` for a process that prints rather than logs (`make run`'s own
    messages): the text itself, or the JSON object a logger `logger` would write."""
    if fmt != "json":
        return message
    record = logging.makeLogRecord(
        {"name": logger, "levelno": level, "levelname": logging.getLevelName(level)}
    )
    record.msg = redact(message)
    return formatter("json").format(record)
