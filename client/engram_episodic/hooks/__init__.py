"""Engram in coding CLIs' lifecycle hooks (Claude Code, Gemini CLI): each task an agent does in a
repository becomes an episode whose outcome and reward are the project's own test results, and each new
prompt gets what worked and what failed on similar tasks of that repository.

`engram hooks install claude-code|gemini-cli` writes the settings (settings.py); the CLI then runs
`engram hook <cli> <event>` (commands.py → runner.py) with the event's JSON on stdin (payloads.py reads
it; testruns.py reads the tests' counts); state.py keeps the open draft per session, the spool and the
log under the user's state directory. docs/integrations.md, "Coding agents", has the walkthrough.
"""
