"""docs/configuration.md lists exactly the environment variables the code reads (pure: reads source files only).

The names the code reads are the string constants that are a whole variable name (`"ENGRAM_..."` or
`"REDIS_URL"`): `Settings.from_env` passes each to `env(...)` field declarations / `env.get` / `env_int`, and the
other entry points (`services/run.py`, the client, the MCP server, the demo agent, the test fixtures) to
`env.get` / `os.environ.get`. A message that merely mentions a name is not a whole-string constant, so it
does not count. docker-compose.yml adds `${NAME:-default}` interpolations (the image tag, the host port)
and the Makefile the variables it sets for a target (`make fuzz`).

The documented names are those in the first column of the tables of docs/configuration.md; the first
row naming a setting read by `Settings.from_env` says what its field's one-line docstring says.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"^(ENGRAM_[A-Z0-9_]+|REDIS_URL)$")
MENTION = re.compile(r"\b(ENGRAM_[A-Z0-9_]*[A-Z0-9]|REDIS_URL)\b")
PY_DIRS = ("client", "services", "shared", "deploy", "tests")


def names_in_python(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value)
    }


def settings_names() -> set[str]:
    return names_in_python(ROOT / "shared" / "settings.py")


@functools.cache
def code_names() -> dict[str, set[str]]:
    """Every variable name the code reads → the files that read it."""
    found: dict[str, set[str]] = {}

    def add(names: set[str], where: Path) -> None:
        for name in names:
            found.setdefault(name, set()).add(str(where.relative_to(ROOT)))

    for folder in PY_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != Path(__file__).resolve():  # this file's own examples name no real variable
                add(names_in_python(path), path)
    compose = ROOT / "docker-compose.yml"
    lines = [line for line in compose.read_text().splitlines() if not line.lstrip().startswith("#")]
    text = "\n".join(lines)
    add({n for n in re.findall(r"\$\{(\w+)", text) if NAME.match(n)}, compose)
    add({n for n in re.findall(r"^\s+(\w+):", text, flags=re.M) if NAME.match(n)}, compose)
    makefile = ROOT / "Makefile"
    add({n for n in re.findall(r"\b(\w+)=", makefile.read_text()) if NAME.match(n)}, makefile)
    return found


def documented_names(text: str) -> set[str]:
    """Names in the first cell of every table row of `text` (header and separator rows name none)."""
    out: set[str] = set()
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("|"):
            continue
        first = line.split("|")[1]
        out |= {m for m in re.findall(r"`([^`]+)`", first) if NAME.match(m)}
    return out


def test_settings_reads_names_this_test_can_see():
    names = settings_names()
    # a sanity check of the parsing: these are read by Settings.from_env in three different ways
    assert {
        "REDIS_URL",
        "ENGRAM_HALF_LIFE",
        "ENGRAM_LEASE_MS",
        "ENGRAM_EMBEDDER",
        "ENGRAM_MASTER_KEY_FILE",
    } <= names
    assert len(names) >= 30


def test_every_settings_variable_is_in_the_table():
    missing = settings_names() - documented_names(DOC.read_text())
    assert not missing, (
        f"read by shared/settings.py but missing from docs/configuration.md's tables: {sorted(missing)}"
    )


def test_every_variable_the_code_reads_is_in_the_table():
    documented = documented_names(DOC.read_text())
    missing = {name: sorted(files) for name, files in code_names().items() if name not in documented}
    assert not missing, f"read by the code but missing from docs/configuration.md's tables: {missing}"


def test_the_tables_name_no_variable_the_code_does_not_read():
    unknown = documented_names(DOC.read_text()) - set(code_names())
    assert not unknown, f"docs/configuration.md documents variables nothing reads: {sorted(unknown)}"


def test_every_variable_the_page_mentions_exists():
    known = set(code_names())
    mentioned = set(MENTION.findall(DOC.read_text()))
    unknown = mentioned - known
    assert not unknown, f"docs/configuration.md mentions variables nothing reads: {sorted(unknown)}"


def test_documented_names_reads_first_cells_only():
    text = (
        "| variable | default |\n|---|---|\n| `ENGRAM_A`, `ENGRAM_B` | `ENGRAM_C` |\n"
        "```\n| `ENGRAM_D` | x |\n```\n`ENGRAM_E` in prose\n"
    )
    assert documented_names(text) == {"ENGRAM_A", "ENGRAM_B"}


def settings_docstrings() -> dict[str, str]:
    """{variable: the docstring of its `env(...)` field} for every Settings field read from the environment."""
    tree = ast.parse((ROOT / "shared" / "settings.py").read_text(encoding="utf-8"))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings").body
    out = {}
    for decl, doc in zip(body, body[1:], strict=False):
        call = getattr(decl, "value", None)
        if (
            isinstance(decl, ast.AnnAssign)
            and isinstance(call, ast.Call)
            and getattr(call.func, "id", "") == "env"
        ):
            value = (
                doc.value.value if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) else ""
            )
            out[call.args[0].value] = value
    return out


def first_rows(text: str) -> dict[str, str]:
    """{variable: the last cell of the first table row whose first cell names it alone}."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        names = re.findall(r"`([^`]+)`", cells[0]) if line.startswith("|") else []
        if len(names) == 1 and NAME.match(names[0]):
            rows.setdefault(names[0], cells[-1])
    return rows


def test_each_setting_has_its_docstring_as_its_row():
    docs = settings_docstrings()
    assert len(docs) >= 30 and "REDIS_URL" in docs
    rows = first_rows(DOC.read_text())
    wrong = {
        name: (doc, rows.get(name))
        for name, doc in docs.items()
        if "\n" in doc or not doc or rows.get(name) != doc
    }
    assert not wrong, f"each env() field's docstring is one line, its row's last cell: {wrong}"
