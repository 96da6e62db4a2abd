"""`engram mcp`'s settings from flags and the environment (client/engram_episodic/mcp_server.py)."""

from __future__ import annotations

import click

from engram_episodic.mcp_server import command


def test_the_mcp_server_finds_the_query_service_where_the_cli_and_the_client_do(monkeypatch):
    """`engram mcp` found a stack started with ENGRAM_PORT (the CLI passes its URL on) while its --help
    said 8080, and `python -m engram_episodic.mcp_server` went to 8080: one default for all three."""

    def url(*argv: str) -> str:
        return command.make_context("mcp", list(argv)).params["url"]

    monkeypatch.delenv("ENGRAM_URL", raising=False)
    monkeypatch.delenv("ENGRAM_PORT", raising=False)
    assert url() == "http://127.0.0.1:8080"
    monkeypatch.setenv("ENGRAM_PORT", "8091")
    assert url() == "http://127.0.0.1:8091"
    monkeypatch.setenv("ENGRAM_URL", "http://memory:9000")
    assert url() == "http://memory:9000"
    assert url("--url", "http://x:1") == "http://x:1"
    assert "$ENGRAM_PORT" in command.get_help(click.Context(command))
