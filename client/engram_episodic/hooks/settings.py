"""Engram's entries in a coding CLI's settings: merged in by `engram hooks install`, taken out by
`engram hooks uninstall`, and nothing else touched.

Engram's hook entries are recognised by their command (`... hook <cli> <Event>`), its MCP server by
the name `engram` under `mcpServers`. Install keeps every other entry, adds Engram's once (running it
again changes nothing) and first copies the file to `<file>.engram-backup`; uninstall removes Engram's
entries, puts back an `engram` MCP server the file had before, and when what is left is what the backup
held, writes the backup's bytes back (the file is byte-identical to before install; a file install
created is removed again); either way the backup is removed.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engram_episodic.hooks.payloads import EVENTS

MCP_NAME = "engram"
BACKUP_SUFFIX = ".engram-backup"
# seconds (Claude Code) / milliseconds (Gemini CLI): above the hook's own bounds, so the CLI never has
# to kill it; a hook that waits for the service longer spools instead
TIMEOUTS = {"claude-code": 10, "gemini-cli": 10_000}
_OURS = re.compile(r"\bhook (?:claude-code|gemini-cli) \w+$")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a CLI keeps its hooks and its MCP servers, for one scope (`project` or `user`)."""

    hooks_file: Path
    mcp_file: Path

    def files(self) -> dict[Path, tuple[bool, bool]]:
        """Each settings file, hooks file first, with what of Engram's goes in it: (hooks, MCP server)."""
        if self.hooks_file == self.mcp_file:
            return {self.hooks_file: (True, True)}
        return {self.hooks_file: (True, False), self.mcp_file: (False, True)}


def target(cli: str, scope: str, project: Path, home: Path) -> Target:
    """The settings files of `cli` (claude-code: `.claude/settings.json`, its MCP servers in `.mcp.json`
    for a project or `~/.claude.json` for the user; gemini-cli: `.gemini/settings.json` for both)."""
    base = project if scope == "project" else home
    if cli == "claude-code":
        mcp = project / ".mcp.json" if scope == "project" else home / ".claude.json"
        return Target(base / ".claude" / "settings.json", mcp)
    return Target(base / ".gemini" / "settings.json", base / ".gemini" / "settings.json")


def _is_ours(hook: Any) -> bool:
    return isinstance(hook, Mapping) and bool(_OURS.search(str(hook.get("command", ""))))


def hook_entries(cli: str, command: list[str]) -> dict[str, dict[str, Any]]:
    """Engram's matcher group per event of `cli`, each calling `<command> hook <cli> <Event>` (`command`:
    the `engram` program's argv)."""
    out = {}
    for event in EVENTS[cli]:
        hook: dict[str, Any] = {"type": "command", "command": shlex.join([*command, "hook", cli, event])}
        if cli == "gemini-cli":
            hook["name"] = f"engram-{event}"
        hook["timeout"] = TIMEOUTS[cli]
        group: dict[str, Any] = {"hooks": [hook]}
        if EVENTS[cli][event] == "tool":  # every tool
            group = {"matcher": "*", **group}
        out[event] = group
    return out


def mcp_entry(command: list[str], env: Mapping[str, str]) -> dict[str, Any]:
    """The `engram` MCP server entry (`<command> mcp`), with `env` when given."""
    entry: dict[str, Any] = {"command": command[0], "args": [*command[1:], "mcp"]}
    if env:
        entry["env"] = dict(env)
    return entry


def without_ours(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` (a settings object) without Engram's hook entries: groups left empty, events left without
    a group and a `hooks` object left empty (when it was only Engram's) are removed too."""
    out = dict(data)
    hooks = data.get("hooks")
    if not isinstance(hooks, Mapping):
        return out
    kept: dict[str, Any] = {}
    for event, groups in hooks.items():
        if not isinstance(groups, list):
            kept[event] = groups
            continue
        new_groups = []
        for group in groups:
            inner = group.get("hooks") if isinstance(group, Mapping) else None
            if isinstance(inner, list) and any(_is_ours(h) for h in inner):
                rest = [h for h in inner if not _is_ours(h)]
                if rest:
                    new_groups.append({**group, "hooks": rest})
            else:
                new_groups.append(group)
        if new_groups:
            kept[event] = new_groups
    if kept:
        out["hooks"] = kept
    else:
        out.pop("hooks")
    return out


def with_hooks(data: Mapping[str, Any], entries: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with Engram's hook `entries` (per event, one group), replacing any Engram entry before."""
    out = without_ours(data)
    hooks = dict(out.get("hooks") or {})
    for event, group in entries.items():
        hooks[event] = [*(hooks.get(event) or []), group]
    out["hooks"] = hooks
    return out


def with_mcp(data: Mapping[str, Any], entry: Mapping[str, Any] | None) -> dict[str, Any]:
    """`data` with `mcpServers.engram` set to `entry` (None: removed, and `mcpServers` with it when left
    empty)."""
    out = dict(data)
    servers = dict(out.get("mcpServers") or {})
    if entry is None:
        servers.pop(MCP_NAME, None)
    else:
        servers[MCP_NAME] = dict(entry)
    if servers:
        out["mcpServers"] = servers
    else:
        out.pop("mcpServers", None)
    return out


class SettingsError(Exception):
    """A settings file that is not a JSON object: nothing was changed."""


def read(path: Path) -> tuple[bytes | None, dict[str, Any]]:
    """The file's bytes (None when it does not exist) and its JSON object. Raises SettingsError."""
    if not path.exists():
        return None, {}
    raw = path.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8-sig")) if raw.strip() else {}
    except ValueError as exc:
        raise SettingsError(f"{path} is not JSON ({exc}): fix or move it, nothing was changed") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path} holds JSON but not an object: nothing was changed")
    return raw, data


def _dump(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


def _backup(path: Path) -> Path:
    return path.with_name(path.name + BACKUP_SUFFIX)


def install(path: Path, hooks: Mapping[str, Any] | None, mcp: Mapping[str, Any] | None) -> bool:
    """Add Engram's `hooks` (`with_hooks`) and its `mcp` server entry (`with_mcp`), those given, to the
    file at `path`; whether it changed. The file's first state is kept in `<file>.engram-backup` (an
    empty backup: the file did not exist). Raises SettingsError."""
    raw, data = read(path)
    new = with_hooks(data, hooks) if hooks is not None else data
    new = with_mcp(new, mcp) if mcp is not None else new
    if new == data and raw is not None:
        return False
    backup = _backup(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not backup.exists():
        backup.write_bytes(raw or b"")
    path.write_bytes(_dump(new))
    return True


def uninstall(path: Path, hooks: bool, mcp: bool) -> bool:
    """Remove Engram's hook entries (`hooks`) and its MCP server (`mcp`) from the file at `path`, putting
    back an `engram` MCP server its backup had; byte-identical to the backup when nothing else changed
    since install. Whether it changed."""
    raw, data = read(path)
    if raw is None:
        return False
    backup = _backup(path)
    before = read(backup) if backup.exists() else (None, {})
    new = without_ours(data) if hooks else dict(data)
    if mcp:
        servers = before[1].get("mcpServers")
        new = with_mcp(new, servers.get(MCP_NAME) if isinstance(servers, Mapping) else None)
    if backup.exists() and new == before[1]:
        if before[0]:
            path.write_bytes(before[0])
        else:
            path.unlink()  # install created it
    elif new != data:
        path.write_bytes(_dump(new))  # the file changed since install: the changes stay
    else:
        return False
    backup.unlink(missing_ok=True)  # used: a later install takes a fresh one
    if not path.exists() and path.parent.name in (".claude", ".gemini"):  # the folder install made
        with contextlib.suppress(OSError):  # not empty: someone else's files are in it
            path.parent.rmdir()
    return True


def their_mcp(path: Path) -> bool:
    """Whether the file had an `engram` MCP server of its own before Engram's install (what its backup
    holds; without one, the file): install replaces it, uninstall puts it back. Raises SettingsError."""
    backup = _backup(path)
    servers = read(backup if backup.exists() else path)[1].get("mcpServers")
    return isinstance(servers, Mapping) and MCP_NAME in servers


def installed(path: Path) -> dict[str, Any]:
    """What of Engram a settings file holds: `{"hooks": [events], "mcp": bool, "json": bool}` (`json`
    False: the file is not a JSON object, so nothing of it was read)."""
    try:
        _, data = read(path)
    except SettingsError:
        return {"hooks": [], "mcp": False, "json": False}
    hooks = data.get("hooks")
    hooks = hooks if isinstance(hooks, Mapping) else {}
    left = without_ours(data).get("hooks") or {}
    events = [event for event, groups in hooks.items() if groups and left.get(event) != groups]
    servers = data.get("mcpServers")
    return {"hooks": events, "mcp": isinstance(servers, Mapping) and MCP_NAME in servers, "json": True}
