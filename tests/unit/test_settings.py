from __future__ import annotations

import base64

import pytest

from engram_episodic.errors import ConfigError
from shared.keys import Keys
from shared.settings import Settings, parse_api_keys, parse_duration


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("3600", 3600),
        ("90s", 90),
        ("30m", 1800),
        ("12h", 43200),
        ("1d", 86400),
        ("1w", 604800),
        ("250ms", 0.25),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_values_name_the_variable():
    with pytest.raises(ConfigError, match="ENGRAM_HALF_LIFE='abc' is not a duration"):
        Settings.from_env({"ENGRAM_HALF_LIFE": "abc"})
    with pytest.raises(ConfigError, match="ENGRAM_MAX_DELIVERIES"):
        Settings.from_env({"ENGRAM_MAX_DELIVERIES": "0"})
    with pytest.raises(ConfigError, match="ENGRAM_EMBEDDER"):
        Settings.from_env({"ENGRAM_EMBEDDER": "bert"})


def test_defaults_and_overrides(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# comment\nk1=ns-a\nk2=ns-b\n")
    s = Settings.from_env(
        {
            "REDIS_URL": "redis://x:1/0",
            "ENGRAM_API_KEYS_FILE": str(keys),
            "ENGRAM_API_KEYS": "k3=ns-c",
            "ENGRAM_HALF_LIFE": "12h",
        }
    )
    assert s.redis_url == "redis://x:1/0" and s.half_life == 43200
    assert s.api_keys == {"k1": "ns-a", "k2": "ns-b", "k3": "ns-c"}
    assert Settings.from_env({}).redis_url is None


@pytest.mark.parametrize("text", ["supersecretkey", "supersecretkey=", "ok=a,supersecretkey= \t"])
def test_api_key_errors_do_not_echo_keys(text):
    with pytest.raises(ConfigError) as info:
        parse_api_keys(text)
    assert "supersec" not in str(info.value) and "entry" in str(info.value)  # not even its start


@pytest.mark.parametrize(
    ("namespace", "said"),
    [
        ("a\tb", "control characters"),
        ("a\x1fb", "control characters"),
        ("n" * 300, "at most 256"),
        ("acme\x1f", "whitespace"),  # was stripped: the key opened "acme"
        ("\x1cacme", "whitespace"),
        ("acme\u00a0", "whitespace"),
        ("\u2028acme", "whitespace"),
    ],
)
def test_a_namespace_every_write_would_refuse_is_refused_at_start(namespace, said):
    """Refused where it is configured, naming the entry: the service used to start with it and answer
    every write of that key with a 422 about a `namespace` field the request did not have."""
    text = f"k-ok=fine\nsupersecretkey={namespace}"
    with pytest.raises(ConfigError, match=f"namespace of entry 2 .*{said}") as info:
        parse_api_keys(text, name="ENGRAM_API_KEYS_FILE")
    assert "supersecretkey" not in str(info.value) and "ENGRAM_API_KEYS_FILE" in str(info.value)
    assert parse_api_keys("k=Acme Corp.\u00e9 \u200b(x)") == {"k": "Acme Corp.\u00e9 \u200b(x)"}


def test_the_metrics_key_is_nobody_s_api_key_and_sendable_as_a_bearer_token():
    s = Settings.from_env({"ENGRAM_API_KEYS": "k1=ns-a", "ENGRAM_METRICS_KEY": "metrics-only-key"})
    assert s.metrics_key == "metrics-only-key" and Settings.from_env({}).metrics_key is None
    for key, said in (
        ("k1", "is also an API key"),
        ("has space", "visible ASCII"),
        ("tab\tkey", "visible ASCII"),
        ("k\u00e9y", "visible ASCII"),
    ):
        with pytest.raises(ConfigError, match=said) as info:
            Settings.from_env({"ENGRAM_API_KEYS": "k1=ns-a", "ENGRAM_METRICS_KEY": key})
        assert key not in str(info.value)


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"ENGRAM_LOG_LEVEL": "bogus"}, "ENGRAM_LOG_LEVEL='bogus' must be one of"),
        ({"REDIS_URL": "garbage"}, "REDIS_URL='garbage' must start with redis://"),
        ({"ENGRAM_DEFAULT_NAMESPACE": ""}, "ENGRAM_DEFAULT_NAMESPACE='' must be non-empty"),
        ({"ENGRAM_DEFAULT_NAMESPACE": " lead"}, "ENGRAM_DEFAULT_NAMESPACE=' lead' must be non-empty"),
        ({"ENGRAM_EMBEDDER": "openai"}, "ENGRAM_EMBEDDER=openai needs ENGRAM_OPENAI_URL"),
    ],
)
def test_values_that_used_to_fail_later_are_refused_at_start(env, said):
    """Each was once accepted here, then a traceback in a started process, or (empty default
    namespace) a stack where every ingest was a 422 and every recall a 500."""
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        Settings.from_env(env)
    assert Settings.from_env({"ENGRAM_LOG_LEVEL": "debug"})  # any case: the services upper-case it


def test_every_setting_is_declared_once_and_an_empty_environment_gives_the_defaults():
    """A field names its variable, default and parser once, and from_env reads exactly those; at most
    45 variables are operator questions (tuned constants are plain fields)."""
    import dataclasses

    from shared.settings import Settings

    declared = [f.metadata["env"] for f in dataclasses.fields(Settings) if "env" in f.metadata]
    assert len(declared) == len(set(declared)) and 30 < len(declared) <= 45
    assert Settings.from_env({}) == Settings()
    # empty means unset (a compose file passes `VAR=` for unset ones), except where empty is refused
    refused = {"ENGRAM_PREFIX", "ENGRAM_DEFAULT_NAMESPACE"}
    assert Settings.from_env({name: "" for name in declared if name not in refused}) == Settings()
    assert Settings.from_env({"ENGRAM_STREAM_RETENTION": "off"}).stream_retention is None


def test_a_cluster_url_is_accepted_and_its_search_mode_checked():
    s = Settings.from_env(
        {"REDIS_URL": "redis+cluster://127.0.0.1:7000", "ENGRAM_CLUSTER_SEARCH": "coordinator"}
    )
    assert s.redis_url == "redis+cluster://127.0.0.1:7000" and s.cluster_search == "coordinator"
    assert Settings.from_env({}).cluster_search == "shard"
    with pytest.raises(ConfigError, match="ENGRAM_CLUSTER_SEARCH='fanout' must be one of shard, coordinator"):
        Settings.from_env({"ENGRAM_CLUSTER_SEARCH": "fanout"})
    # sealed publishing works on a cluster (its checks live in each partition's slot: shared.keys)
    key = base64.b64encode(b"k" * 32).decode()
    sealed = Settings.from_env({"REDIS_URL": "redis+cluster://h:7000", "ENGRAM_MASTER_KEY": key})
    assert sealed.master_key == b"k" * 32 and sealed.partitions == 16 and sealed.keys.partitions == 16
    assert Settings.from_env({}).partitions == 1 and Settings.from_env({}).keys == Keys("engram:")
    assert Settings.from_env({"ENGRAM_STREAM_PARTITIONS": "4"}).keys == Keys("engram:", 4)
    for bad in ("0", "257", "four"):
        with pytest.raises(ConfigError, match="ENGRAM_STREAM_PARTITIONS"):
            Settings.from_env({"ENGRAM_STREAM_PARTITIONS": bad})
    with pytest.raises(ConfigError, match="ENGRAM_PREFIX='a{b}:' must not contain braces"):
        Settings.from_env({"ENGRAM_PREFIX": "a{b}:"})


def test_a_vector_block_size_needs_the_flat_algorithm():
    s = Settings.from_env({"ENGRAM_VECTOR_ALGORITHM": "FLAT", "ENGRAM_VECTOR_BLOCK_SIZE": "64"})
    assert s.vector_block_size == 64
    assert Settings.from_env({}).vector_block_size == 0
    with pytest.raises(ConfigError, match="ENGRAM_VECTOR_BLOCK_SIZE=64 needs ENGRAM_VECTOR_ALGORITHM=FLAT"):
        Settings.from_env({"ENGRAM_VECTOR_BLOCK_SIZE": "64"})
    with pytest.raises(ConfigError, match="ENGRAM_VECTOR_BLOCK_SIZE"):
        Settings.from_env({"ENGRAM_VECTOR_ALGORITHM": "FLAT", "ENGRAM_VECTOR_BLOCK_SIZE": "-1"})
