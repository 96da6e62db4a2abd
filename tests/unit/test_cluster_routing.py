"""Where `shared.cluster.EngramCluster` sends each search command (no I/O): the shard-local routing of
the embedded module, and `ENGRAM_CLUSTER_SEARCH=coordinator`, which passes every command through to
redis-py for Redis 8's Query Engine to distribute. The coordinator path is exercised here only: there
is no Redis 8 coordinator on this machine (docs/scaling.md says so)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import redis

from deploy.embedded_redis import free_port
from shared import cluster
from shared.cluster import SEARCH_COORDINATOR, SEARCH_SHARD, EngramCluster, decide
from shared.index import VectorParams
from shared.redis_conn import connect

SEARCHES = ["FT.SEARCH", "FT.AGGREGATE", "FT.INFO", "FT.CREATE", "FT.DROPINDEX", "FT._LIST", "FT.ALIASUPDATE"]


@pytest.mark.parametrize("command", [*SEARCHES, "HGET", "EVALSHA"])
@pytest.mark.parametrize("namespace", [None, "team-a"])
def test_coordinator_mode_passes_every_command_through(command, namespace):
    assert decide(SEARCH_COORDINATOR, command, namespace) == cluster.PASS


def test_shard_mode_routes_search_by_namespace_and_keeps_index_definitions_in_meta():
    assert decide(SEARCH_SHARD, "HGET", "team-a") == cluster.PASS
    assert decide(SEARCH_SHARD, "FT.SEARCH", "team-a", targeted=True) == cluster.PASS  # already on its node
    assert decide(SEARCH_SHARD, "FT.SEARCH", "team-a") == cluster.ROUTED
    assert decide(SEARCH_SHARD, "FT.AGGREGATE", "team-a") == cluster.ROUTED
    assert decide(SEARCH_SHARD, "FT.INFO", "team-a") == cluster.ROUTED
    assert decide(SEARCH_SHARD, "FT.INFO", None) == cluster.EXISTS
    assert decide(SEARCH_SHARD, "FT.EXPLAIN", None) == cluster.EXISTS  # shared.index.index_exists
    assert decide(SEARCH_SHARD, "FT.EXPLAIN", "team-a") == cluster.ROUTED
    assert decide(SEARCH_SHARD, "FT.SEARCH", None) == cluster.UNROUTED
    assert decide(SEARCH_SHARD, "FT.CURSOR", "team-a") == cluster.CURSOR  # names its index second
    assert decide(SEARCH_SHARD, "FT.CURSOR", None) == cluster.UNROUTED
    assert decide(SEARCH_SHARD, "FT.CREATE", None) == cluster.RECORD
    assert decide(SEARCH_SHARD, "FT.DROPINDEX", "team-a") == cluster.DROP
    assert decide(SEARCH_SHARD, "FT._LIST", None) == cluster.LIST
    assert (
        decide(SEARCH_SHARD, "FT.ALIASADD", None)
        == decide(SEARCH_SHARD, "FT.ALIASUPDATE", None)
        == cluster.ALIAS_SET
    )
    assert decide(SEARCH_SHARD, "FT.ALIASDEL", None) == cluster.ALIAS_DEL


async def test_a_coordinator_client_creates_no_shard_indexes_and_pipelines_search_as_redis_py_does():
    # a port nobody listens on: any I/O would raise ConnectionError
    client = connect(f"redis+cluster://127.0.0.1:{free_port()}", cluster_search=SEARCH_COORDINATOR)
    assert isinstance(client, EngramCluster) and client.search == SEARCH_COORDINATOR
    await cluster.ensure_shards(client, ["engram:idx:episodes:g1"], ["team-a"])  # nothing to do, no I/O
    pipe = client.pipeline()
    pipe.execute_command("FT.SEARCH", "engram:idx:episodes", "*")
    assert pipe._searches is None and len(pipe) == 1  # queued for redis-py's slot routing, not run apart
    shard = connect(f"redis+cluster://127.0.0.1:{free_port()}")
    assert shard.search == SEARCH_SHARD  # type: ignore[attr-defined]
    pipe = shard.pipeline()
    pipe.execute_command("FT.SEARCH", "engram:idx:episodes", "*")
    assert pipe._searches and len(pipe) == 0  # run one by one through the routing


def test_a_flat_index_takes_a_block_size_and_hnsw_ignores_none():
    flat = VectorParams(dim=8, algorithm="FLAT", block_size=64).schema_args()
    assert flat[-2:] == ["BLOCK_SIZE", 64] and flat[3] == 8
    assert "BLOCK_SIZE" not in VectorParams(dim=8, algorithm="FLAT").schema_args()
    assert "BLOCK_SIZE" not in VectorParams(dim=8).schema_args()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_cluster_module_touches_no_private_redis_py_name():
    """redis-py's private names change between releases without notice (one already broke an override
    of `RedisCluster._determine_slot`): `shared/cluster.py` reads only private names it defines itself
    (its routing goes through `target_nodes`, `get_node_from_key`, `keyslot`, `get_primaries`, ...),
    and none it defines on its subclasses is a name redis-py uses, which would override or shadow it."""
    tree = ast.parse(Path(cluster.__file__).read_text())
    defined_on_classes = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defined_on_classes.add(node.name)
            elif isinstance(node, ast.AnnAssign | ast.Assign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in (t for t in targets for t in ast.walk(t)):
                    if isinstance(target, ast.Name) or (
                        isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    ):
                        defined_on_classes.add(target.id if isinstance(target, ast.Name) else target.attr)
    module_level = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and _private(n.attr)}
    assert read <= defined_on_classes | module_level, "private names of redis-py read"
    package = Path(redis.__file__).parent
    theirs = {
        name
        for path in package.rglob("*.py")
        for name in re.findall(r"\b_[A-Za-z]\w*", path.read_text(encoding="utf-8"))
        if _private(name)
    }
    assert {n for n in defined_on_classes if _private(n)} & theirs == set(), "redis-py names overridden"
