"""shared/logs.py: the text and JSON formats of every process, and credentials redacted in both."""

from __future__ import annotations

import io
import json
import logging
from datetime import datetime

import pytest

from engram_episodic.errors import ConfigError
from shared import logs
from shared.settings import Settings

KEY = "sk-live-0123456789abcdef"


@pytest.fixture
def capture():
    """configure() into a buffer; the handler is removed afterwards (pytest's own stay)."""
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level

    def setup(**env: str) -> io.StringIO:
        logs.configure(env, stream=out)
        return out

    yield setup
    for h in [h for h in root.handlers if getattr(h, "engram", False)]:
        root.removeHandler(h)
    root.setLevel(level)


def test_json_is_one_object_per_line_with_utc_time_level_logger_message_and_extras(capture):
    out = capture(ENGRAM_LOG_FORMAT="json", ENGRAM_LOG_LEVEL="INFO")
    log = logging.getLogger("engram.test")
    log.info("batch ◆ %d projected", 12, extra={"lag": 3, "consumer": "w1"})
    log.debug("not at INFO")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(x) for x in lines)
    assert (first["level"], first["logger"], first["message"]) == (
        "INFO",
        "engram.test",
        "batch ◆ 12 projected",
    )
    assert (first["lag"], first["consumer"]) == (3, "w1")
    when = datetime.fromisoformat(first["time"])
    assert when.utcoffset() is not None and when.utcoffset().total_seconds() == 0
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc_info"]


def test_no_credential_reaches_either_format_from_any_logger(capture):
    for fmt in ("text", "json"):
        out = capture(ENGRAM_LOG_FORMAT=fmt)
        log = logging.getLogger("engram.anything")  # not one of aiohttp's: the handler redacts too
        log.warning("header Authorization: Bearer %s", KEY)
        log.warning("bare", extra={"header": f"Bearer {KEY}"})
        try:
            raise RuntimeError(f"bad header b'Authorization: Basic {KEY}\\x00'")
        except RuntimeError:
            log.exception("request failed")
        text = out.getvalue()
        assert KEY not in text, (fmt, text)
        assert text.count("[redacted]") >= (3 if fmt == "json" else 2), (fmt, text)


def test_line_formats_a_printed_message_like_a_logger_would():
    assert logs.line("text", "engram ◆ redis up", logger="engram.run") == "engram ◆ redis up"
    record = json.loads(logs.line("json", f"token {KEY}", logger="engram.run", level=logging.ERROR))
    assert (record["logger"], record["level"]) == ("engram.run", "ERROR")
    assert KEY not in record["message"]


def test_a_bad_log_format_is_refused_by_name():
    with pytest.raises(ConfigError, match="ENGRAM_LOG_FORMAT='yaml' must be one of text, json"):
        Settings.from_env({"ENGRAM_LOG_FORMAT": "yaml"})
    assert logs.log_format({"ENGRAM_LOG_FORMAT": "yaml"}) == "text"  # configure() never fails first
