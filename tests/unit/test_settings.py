from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.settings import Settings, parse_api_keys, parse_duration


@pytest.mark.parametrize("text, seconds", [("3600", 3600), ("90s", 90), ("30m", 1800), ("12h", 43200),
                                           ("1d", 86400), ("1w", 604800), ("250ms", 0.25)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_values_name_the_variable():
    with pytest.raises(ConfigError, match="ENGRAM_HALF_LIFE='abc' is not a duration"):
        Settings.from_env({"ENGRAM_HALF_LIFE": "abc"})
    with pytest.raises(ConfigError, match="ENGRAM_BATCH_SIZE"):
        Settings.from_env({"ENGRAM_BATCH_SIZE": "0"})
    with pytest.raises(ConfigError, match="ENGRAM_EMBEDDER"):
        Settings.from_env({"ENGRAM_EMBEDDER": "bert"})


def test_defaults_and_overrides(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# comment\nk1=ns-a\nk2=ns-b\n")
    s = Settings.from_env({"REDIS_URL": "redis://x:1/0", "ENGRAM_API_KEYS_FILE": str(keys),
                           "ENGRAM_API_KEYS": "k3=ns-c", "ENGRAM_HALF_LIFE": "12h"})
    assert s.redis_url == "redis://x:1/0" and s.half_life == 43200
    assert s.api_keys == {"k1": "ns-a", "k2": "ns-b", "k3": "ns-c"}
    assert Settings.from_env({}).redis_url is None


def test_api_key_errors_do_not_echo_keys():
    with pytest.raises(ConfigError) as info:
        parse_api_keys("supersecretkey")
    assert "supersecretkey" not in str(info.value)
