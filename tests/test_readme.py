"""Every Python snippet in the README runs as written, against a real `zq serve`.

The snippets name the default endpoint (``tcp://127.0.0.1:7780``) or, in the security
section, a remote host; the test points them at its own server and changes nothing
else. Each runs in a fresh interpreter in a scratch directory, in README order (later
snippets see what earlier ones published, as a reader's would). The security section
runs whole: its shell lines make the keys, its TOML block is the server's config.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adapters.support import ServerProcess, env, wait_until

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DEFAULT = "tcp://127.0.0.1:7780"
REMOTE = "tcp://10.0.0.5:7780"


def blocks(lang: str, text: str = README) -> list[tuple[int, str]]:
    """(line number, code) of every fenced block of ``lang``."""
    out = []
    for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.M | re.S):
        out.append((text[: m.start()].count("\n") + 1, m.group(1)))
    return out


SECURITY = README.split("## Security", 1)[1].split("\n## ", 1)[0]
PYTHON = [(line, code) for line, code in blocks("python") if REMOTE not in code]
SPARK = "zq.spark"


def run_snippet(code: str, cwd: Path, endpoint: str, timeout: float = 180) -> subprocess.CompletedProcess:
    script = cwd / "snippet.py"
    script.write_text(code.replace(DEFAULT, endpoint).replace(REMOTE, endpoint))
    e = env()
    e["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), e.get("PATH", "")])
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("readme")).start()
    yield s
    assert "Traceback" not in s.terminate()


def test_the_readme_has_the_snippets_this_test_runs():
    assert len(PYTHON) >= 7, [line for line, _ in PYTHON]
    assert any(REMOTE in code for _, code in blocks("python", SECURITY))


@pytest.mark.parametrize(("line", "code"), PYTHON, ids=[f"README.md:{line}" for line, _ in PYTHON])
def test_the_snippet_runs_as_written(server, tmp_path, line, code):
    if SPARK in code:
        pytest.importorskip("pyspark", reason="the Spark snippet needs pip install -e '.[spark]'")
    done = run_snippet(code, tmp_path, server.endpoint)
    assert done.returncode == 0, f"README.md:{line} failed:\n{code}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    if "orders.copy" in code:  # a Spark write to a topic no queue covered made a queue: its rows can be consumed
        from zq.client import Client

        with Client(server.endpoint) as c:
            assert "orders.copy" in {q["name"] for q in c.queues()} and c.peek("orders.copy", limit=1)


def test_the_security_section_runs_as_written(tmp_path):
    """The shell lines make the keys, the TOML block is the config, the snippet connects."""
    (sh,) = blocks("sh", SECURITY)
    (toml,) = blocks("toml", SECURITY)
    (py,) = blocks("python", SECURITY)
    e = env()
    e["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), e.get("PATH", "")])
    made = subprocess.run(["bash", "-euc", sh[1]], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    (tmp_path / "zq.toml").write_text(toml[1])
    server = ServerProcess(tmp_path, config=tmp_path / "zq.toml")
    server.proc = subprocess.Popen(  # not .start(): its readiness probe is a plaintext client, refused here
        [sys.executable, "-m", "zq.cli", "serve", "--data", str(tmp_path / "journal"), "--bind", server.endpoint,
         "--config", str(tmp_path / "zq.toml")], env=env(), stderr=subprocess.PIPE, text=True)
    try:  # the snippet connects to a dispatcher that runs: a refused connection fails at once
        wait_until(lambda: Path(server.endpoint.removeprefix("ipc://")).exists(), what="zq serve to bind")
        done = run_snippet(py[1], tmp_path, server.endpoint)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "'on': True" in done.stdout, done.stdout
    finally:
        assert "Traceback" not in server.terminate()
