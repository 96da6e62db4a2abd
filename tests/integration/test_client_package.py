"""The client distribution as a user gets it: a wheel of its own, installed alone into an empty venv.

Builds `client/` into a wheel, checks what it ships (one import name, py.typed, no server package, no
server dependency), installs it into a fresh virtualenv (pip fetches only httpx, click and tqdm and their
dependencies), and runs the README's five lines there against a running query service with an API key.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.integration.test_query_e2e import consolidating
from tests.integration.test_query_support import KEY_A

pytestmark = pytest.mark.slow  # spawns processes or servers: `make test-fast` skips it

pytest_plugins = ["tests.integration.test_query_support"]
ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = (
    "torch",
    "scikit-learn",
    "uvloop",
    "prometheus-client",
    "redis",
    "aiohttp",
    "numpy",
    "sentence-transformers",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = out / "client"  # a copy: setuptools writes build/ and egg-info next to the sources
    shutil.copytree(
        ROOT / "client", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
    )
    (built,) = out.glob("engram_episodic-*.whl")
    return built


def test_the_wheel_ships_one_import_name_typed_without_server_dependencies(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"engram_episodic"}, f"only the client's import name is top-level, not {top}"
    assert "engram_episodic/py.typed" in names
    assert "engram_episodic/tools.json" in names  # the tool definitions, read at import
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    required = [
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    core = [r for r in required if "extra ==" not in r]
    assert sorted(re.split(r"[<>=;\[ ]", r)[0].lower() for r in core) == ["click", "httpx", "tqdm"]
    assert not any(r.lower().startswith(SERVER_ONLY) for r in core)
    assert "Name: engram-episodic" in metadata


def _readme_lines() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use Engram from an agent (Python client)", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    assert len(code.strip().splitlines()) == 5, "the README promises five lines"
    return code


async def test_readme_five_lines_recall_from_a_fresh_venv_with_an_api_key(
    wheel, tmp_path, tenants, settings, redis
):
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # nothing of ours
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    install = await asyncio.create_subprocess_exec(
        str(py),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        str(wheel),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await asyncio.wait_for(install.communicate(), 300)
    assert install.returncode == 0, out.decode()[-2000:]
    probe = subprocess.run(
        [
            str(py),
            "-c",
            "import importlib.util as u; print([m for m in ('shared', 'services', "
            "'deploy', 'torch', 'redis', 'aiohttp') if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=env,
    )  # not the checkout
    assert probe.stdout.strip() == "[]", f"the client venv holds server modules: {probe.stdout}"
    tools = subprocess.run(  # the tool definitions are read from the installed package's data
        [str(py), "-c", "from engram_episodic.tools import TOOLS; print(len(TOOLS))"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert tools.stdout.strip() == "8", tools.stderr[-2000:]

    code = _readme_lines().replace("http://127.0.0.1:8080", str(tenants.make_url("")).rstrip("/"))
    code = code.replace('"dev-key"', repr(KEY_A))
    async with consolidating(settings, redis, "readme"):  # the stack's consolidator, while the snippet waits
        proc = await asyncio.create_subprocess_exec(
            str(py),
            "-c",
            code,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    lines = stdout.decode().splitlines()
    assert len(lines) == 1 and lines[0].endswith("success fix the flaky login test"), lines

    # the client's CLI has the API's commands; the operator's are the server's `engram-admin`
    engram = venv / "bin" / "engram"
    helped = subprocess.run([str(engram), "--help"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert helped.returncode == 0 and "record" in helped.stdout, helped.stderr
    assert "replay" not in helped.stdout.split(), helped.stdout
    for command in (["replay"], ["run"], ["dead-letters"]):
        done = subprocess.run([str(engram), *command], capture_output=True, text=True, cwd=tmp_path, env=env)
        assert done.returncode == 2 and f"engram-admin {command[0]}" in done.stderr, done.stderr
    plot = await asyncio.create_subprocess_exec(  # not subprocess.run: this loop serves `tenants`
        *(str(engram), "--url", str(tenants.make_url("")), "--api-key", KEY_A, "curve", "--plot"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    _, err = await asyncio.wait_for(plot.communicate(), 30)
    assert plot.returncode == 1 and "engram-episodic[plot]" in err.decode(), err.decode()
