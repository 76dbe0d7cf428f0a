"""The compiled core (mypyc) and its guard: an edited source is never shadowed by a
stale compiled module, ZQ_PURE=1 forces the interpreted one, and `zq --version` says
which runs. CI sets ZQ_REQUIRE_COMPILED=1: there the suite must run compiled."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zq import build

ROOT = Path(__file__).resolve().parent.parent
PROBE = "import zq, zq.core.queue as q, zq.build as b; print(b.BUILD, q.__file__)"


def python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("ZQ_PURE",)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env={**e, **env}, capture_output=True, text=True,
                          timeout=120)


def unforced() -> tuple[str, str]:
    """The build a process runs here without ZQ_PURE, and how it says so. This process's
    own may be forced interpreted: the suite also runs whole with ZQ_PURE=1."""
    run = python("import zq, zq.build as b; print(b.BUILD); print(b.describe())", ROOT)
    assert run.returncode == 0, run.stderr
    state, described = run.stdout.splitlines()
    return state, described


def test_ci_runs_the_suite_on_the_compiled_core():
    if os.environ.get("ZQ_REQUIRE_COMPILED") != "1":
        pytest.skip("ZQ_REQUIRE_COMPILED is not set (CI sets it): this run may be interpreted")
    assert build.BUILD == "compiled", build.describe()
    import zq.core.engine
    import zq.core.queue

    assert zq.core.queue.__file__.endswith(".so") and zq.core.engine.__file__.endswith(".so")


def test_zq_pure_runs_the_interpreted_core_and_version_says_which(tmp_path):
    run = python(PROBE, tmp_path, ZQ_PURE="1")
    assert run.returncode == 0 and run.stdout.split()[0] == "interpreted", run.stderr
    assert run.stdout.split()[1].endswith("zq/core/queue.py")
    version = subprocess.run([sys.executable, "-m", "zq.cli", "--version"], capture_output=True, text=True,
                             env={**os.environ, "ZQ_PURE": "1"}, timeout=60)
    assert "(core interpreted: ZQ_PURE is set)" in version.stdout
    version = subprocess.run([sys.executable, "-m", "zq.cli", "--version"], capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if k != "ZQ_PURE"}, timeout=60)
    assert f"({unforced()[1]})" in version.stdout


def test_an_edited_source_runs_interpreted_and_says_so(tmp_path):
    """A copy of the installed tree: unchanged, it runs as built; with one compiled
    module's source edited, every compiled module loads from source, with a warning."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "zq", tree / "zq", ignore=shutil.ignore_patterns("__pycache__"))
    for lib in ROOT.glob("*__mypyc*.so"):  # mypyc's shared library sits beside the package
        shutil.copy(lib, tree)
    built, described = unforced()
    run = python(PROBE, tree)
    assert run.returncode == 0 and run.stdout.split()[0] == built and run.stderr == "", run.stderr
    if built != "compiled":
        pytest.skip(f"this install is interpreted ({described}): no compiled module to shadow")
    with open(tree / "zq" / "core" / "ordering.py", "a") as f:
        f.write("\n# an edit after the build\n")
    run = python(PROBE + "; import zq.core.engine as e; print(e.__file__)", tree)
    assert run.returncode == 0, run.stderr
    state, queue_file, engine_file = run.stdout.split()
    assert state == "interpreted" and queue_file.endswith(".py") and engine_file.endswith(".py")
    assert "zq.core.ordering changed since it was compiled: running the interpreted core" in run.stderr


def test_the_stale_check_compares_each_compiled_source(tmp_path):
    for module in build.COMPILED_MODULES:
        path = build.source_path(module, tmp_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {module}\n")
    recorded = {m: build.source_hash(build.source_path(m, tmp_path)) for m in build.COMPILED_MODULES}
    assert build.stale_modules(recorded, tmp_path) == []
    build.source_path("zq.core.engine", tmp_path).write_text("# edited\n")
    assert build.stale_modules(recorded, tmp_path) == ["zq.core.engine"]
    assert build.stale_modules({}, tmp_path) == list(build.COMPILED_MODULES)  # nothing recorded: nothing trusted


def test_the_install_falls_back_to_the_interpreted_core_without_a_compiler_or_with_zq_pure(capsys, monkeypatch):
    setup = runpy.run_path(str(ROOT / "setup.py"), run_name="zq_setup")
    monkeypatch.delenv("ZQ_PURE", raising=False)  # (the suite may itself run with it)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert setup["compiled_extensions"]() == []
    assert "no C compiler (/nonexistent/cc): installing the interpreted core" in capsys.readouterr().err
    monkeypatch.delenv("CC")
    monkeypatch.setenv("ZQ_PURE", "1")
    assert setup["compiled_extensions"]() == []
    assert "ZQ_PURE is set" in capsys.readouterr().err
