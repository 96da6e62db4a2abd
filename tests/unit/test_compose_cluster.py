"""deploy/compose.cluster.yml: the cluster profile over docker-compose.yml (Docker is not available on the
project's machine, so the file is checked as data)."""

from __future__ import annotations

from pathlib import Path

import yaml

from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = yaml.safe_load((ROOT / "deploy" / "compose.cluster.yml").read_text())
BASE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_three_cluster_nodes_of_the_official_image_and_an_idempotent_init():
    nodes = [name for name in CLUSTER["services"] if name.startswith("redis-c") and name[-1].isdigit()]
    assert nodes == ["redis-c1", "redis-c2", "redis-c3"]
    for name in nodes:
        node = CLUSTER["services"][name]
        assert node["image"] == BASE["services"]["redis"]["image"] and node["profiles"] == ["cluster"]
        assert "--cluster-enabled" in node["command"] and "noeviction" in node["command"]
    init = CLUSTER["services"]["redis-cluster-init"]
    script = init["entrypoint"][-1]
    assert (
        "--cluster create redis-c1:6379 redis-c2:6379 redis-c3:6379" in script
        and "cluster_state:ok" in script
    )
    assert set(init["depends_on"]) == set(nodes)


def test_the_services_point_at_the_cluster_with_valid_settings():
    for name in ("consolidator", "query"):
        service = CLUSTER["services"][name]
        assert name in BASE["services"]
        assert service["depends_on"]["redis-cluster-init"]["condition"] == "service_completed_successfully"
        env = service["environment"]
        assert env["REDIS_URL"] == "redis+cluster://redis-c1:6379"
        settings = Settings.from_env({k: str(v) for k, v in env.items()})
        assert settings.cluster_search == "coordinator"
