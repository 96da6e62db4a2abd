"""`engram mcp`'s settings from flags and the environment (client/engram_episodic/mcp_server.py)."""

from __future__ import annotations

from engram_episodic.mcp_server import _settings, parser


def test_the_mcp_server_finds_the_query_service_where_the_cli_and_the_client_do():
    """`engram mcp` found a stack started with ENGRAM_PORT (the CLI passes its URL on) while its --help
    said 8080, and `python -m engram_episodic.mcp_server` went to 8080: one default for all three."""
    args = parser().parse_args([])
    assert _settings(args, {})["url"] == "http://127.0.0.1:8080"
    assert _settings(args, {"ENGRAM_PORT": "8091"})["url"] == "http://127.0.0.1:8091"
    env = {"ENGRAM_PORT": "8091", "ENGRAM_URL": "http://memory:9000"}
    assert _settings(args, env)["url"] == "http://memory:9000"
    assert _settings(parser().parse_args(["--url", "http://x:1"]), env)["url"] == "http://x:1"
    assert "$ENGRAM_PORT" in parser().format_help()
