"""setup.py's build of the core, driven through setuptools' own commands in a scratch
copy of the build files, with a stand-in for mypyc (``mypyc.build.mypycify``) that
logs each call and returns one tiny real C extension, so each build takes a second:

* mypyc runs only when build_ext does (not for egg_info or sdist), once per build;
* a rebuild with unchanged compiled sources copies the cached build in, and runs no
  mypyc; an edited source, or no cache, compiles again;
* a failed compile installs interpreted with a loud warning and records why; with
  ZQ_REQUIRE_COMPILED=1 it fails the build; Ctrl-C interrupts the build.

The scratch tree has no pyproject.toml (the metadata is not what is tested, and the
suite's setuptools may be older than the build's); tests/test_build_package.py
builds the real package with the real mypyc."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zq import build

ROOT = Path(__file__).resolve().parent.parent
EXT_SUFFIX = __import__("sysconfig").get_config_var("EXT_SUFFIX")

# The stand-in: mypycify logs its call and, as asked by STUB_MODE, returns one real
# (tiny) C extension named like the core's first module, exits as mypyc does on type
# errors, or is interrupted (Ctrl-C).
STUB = '''
import os
from pathlib import Path
from setuptools import Extension

def mypycify(paths, opt_level="3", **kwargs):
    with open(os.environ["STUB_LOG"], "a") as log:
        log.write(" ".join(paths) + "\\n")
    mode = os.environ.get("STUB_MODE", "ok")
    if mode == "type-errors":
        print("zq/core/queue.py:1: error: a type error")
        raise SystemExit(2)
    if mode == "interrupt":
        raise KeyboardInterrupt
    c = Path("build") / "stub_queue.c"
    c.parent.mkdir(exist_ok=True)
    c.write_text("""#include <Python.h>
static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "queue", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_queue(void) { PyObject *o = PyModule_Create(&m);
  if (o) PyModule_AddStringConstant(o, "STUB", "%s"); return o; }
""" % os.environ.get("STUB_MARK", "compiled"))
    sources = [str(c)] if mode != "bad-c" else [str(c), "build/missing.c"]
    return [Extension("zq.core.queue", sources)]
'''


@pytest.fixture
def tree(tmp_path):
    """A copy of what setup.py reads (no pyproject.toml), the stub mypyc, a cache dir."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: these builds compile a (tiny) extension")
    t = tmp_path / "tree"
    (t / "zq").mkdir(parents=True)
    shutil.copy(ROOT / "setup.py", t)
    shutil.copy(ROOT / "zq" / "build.py", t / "zq")
    (t / "zq" / "__init__.py").write_text("")
    for module in build.COMPILED_MODULES:
        path = build.source_path(module, t)
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(f"# {module}\n")
    stub = tmp_path / "stub" / "mypyc"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (stub / "build.py").write_text(textwrap.dedent(STUB))
    return t


def setup_py(tree: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("ZQ_PURE", "ZQ_REQUIRE_COMPILED", "CC")}
    stub = tree.parent / "stub"
    base.update(PYTHONPATH=str(stub), STUB_LOG=str(tree.parent / "mypyc.log"),
                ZQ_BUILD_CACHE=str(tree.parent / "cache"), SETUPTOOLS_USE_DISTUTILS="local")
    return subprocess.run([sys.executable, "setup.py", *args], cwd=tree, env={**base, **env}, capture_output=True,
                          text=True, timeout=300)


def rebuild(tree: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """setup.py again in a fresh build directory, as pip builds (distutils would otherwise
    skip an extension whose output is not a whole second older than its C source)."""
    shutil.rmtree(tree / "build", ignore_errors=True)
    built_module(tree).unlink(missing_ok=True)  # (so is setuptools 65's copy into the source tree)
    return setup_py(tree, *args, **env)


def mypyc_calls(tree: Path) -> int:
    log = tree.parent / "mypyc.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def manifest(tree: Path) -> dict:
    path = tree / "zq" / "_compiled.py"
    assert path.exists(), "no zq/_compiled.py written"
    space: dict = {}
    exec(path.read_text(), space)
    return {k: v for k, v in space.items() if k in ("BUILD", "WHY", "SOURCES")}


def built_module(tree: Path) -> Path:
    return tree / "zq" / "core" / f"queue{EXT_SUFFIX}"


def stub_mark(tree: Path) -> str:
    """Load the built zq.core.queue (the stub's extension) and read its mark."""
    run = subprocess.run([sys.executable, "-c", "import zq.core.queue as q; print(q.STUB, q.__file__)"], cwd=tree,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    mark, file = run.stdout.split()
    assert file.endswith(EXT_SUFFIX)
    return mark


def test_mypyc_runs_only_when_build_ext_does(tree):
    for command in (["egg_info"], ["sdist", "--dist-dir", str(tree.parent / "dist")]):
        run = setup_py(tree, *command)
        assert run.returncode == 0, run.stderr
        assert mypyc_calls(tree) == 0, f"`setup.py {command[0]}` ran mypyc"
    run = setup_py(tree, "build_ext", "--inplace")
    assert run.returncode == 0, run.stdout + run.stderr
    assert mypyc_calls(tree) == 1
    assert stub_mark(tree) == "compiled"
    m = manifest(tree)
    assert m["BUILD"] == "compiled"
    assert m["SOURCES"] == {mod: build.source_hash(build.source_path(mod, tree)) for mod in build.COMPILED_MODULES}


def test_a_rebuild_with_unchanged_sources_copies_the_cached_build_in(tree):
    run = setup_py(tree, "build_ext", "--inplace", STUB_MARK="first")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "cached in" in run.stderr
    entries = list((tree.parent / "cache").iterdir())
    assert len(entries) == 1 and json.loads((entries[0] / "index.json").read_text())["extensions"].keys() == {"zq.core.queue"}
    shutil.rmtree(tree / "build")
    built_module(tree).unlink()
    (tree / "zq" / "_compiled.py").unlink()

    run = setup_py(tree, "build_ext", "--inplace", STUB_MARK="second")
    assert run.returncode == 0, run.stdout + run.stderr
    assert mypyc_calls(tree) == 1, "the rebuild ran mypyc again"
    assert "reused from the build cache" in run.stderr
    assert stub_mark(tree) == "first"  # the cached module, not a new compile
    assert manifest(tree)["BUILD"] == "compiled"
    assert (tree / "build").is_dir() and list((tree / "build").rglob(f"queue{EXT_SUFFIX}"))  # build_lib too (wheels)

    # An edited compiled source is a different build: compiled again, and cached beside.
    with open(build.source_path("zq.core.engine", tree), "a") as f:
        f.write("# edited\n")
    run = rebuild(tree, "build_ext", "--inplace", STUB_MARK="third")
    assert run.returncode == 0, run.stdout + run.stderr
    assert mypyc_calls(tree) == 2 and "reused" not in run.stderr
    assert stub_mark(tree) == "third"
    assert len(list((tree.parent / "cache").iterdir())) == 2

    # The edit undone: the first build again, from the cache, over the newer module in the tree.
    build.source_path("zq.core.engine", tree).write_text("# zq.core.engine\n")
    shutil.rmtree(tree / "build")
    run = setup_py(tree, "build_ext", "--inplace", STUB_MARK="fourth")
    assert run.returncode == 0, run.stdout + run.stderr
    assert mypyc_calls(tree) == 2 and "reused from the build cache" in run.stderr
    assert stub_mark(tree) == "first"
    assert manifest(tree)["SOURCES"]["zq.core.engine"] == build.source_hash(build.source_path("zq.core.engine", tree))


def test_a_damaged_cache_entry_is_compiled_again(tree):
    assert setup_py(tree, "build_ext", "--inplace", STUB_MARK="first").returncode == 0
    (entry,) = (tree.parent / "cache").iterdir()
    (so,) = entry.glob(f"*{EXT_SUFFIX}")
    so.write_bytes(b"truncated")
    run = rebuild(tree, "build_ext", "--inplace", STUB_MARK="second")
    assert run.returncode == 0, run.stdout + run.stderr
    assert mypyc_calls(tree) == 2 and stub_mark(tree) == "second"
    assert rebuild(tree, "build_ext", "--inplace", STUB_MARK="third").returncode == 0  # the entry was replaced
    assert mypyc_calls(tree) == 2 and stub_mark(tree) == "second"


def test_no_cache_when_it_is_turned_off(tree):
    for mark in ("first", "second"):
        run = rebuild(tree, "build_ext", "--inplace", STUB_MARK=mark, ZQ_BUILD_CACHE="off")
        assert run.returncode == 0, run.stdout + run.stderr
    assert mypyc_calls(tree) == 2 and stub_mark(tree) == "second"
    assert not (tree.parent / "cache").exists()


@pytest.mark.parametrize("mode, why", [("type-errors", "mypyc stopped (exit status 2"),
                                       ("bad-c", "compiling the core failed")])
def test_a_failed_compile_installs_interpreted_loudly_and_records_why(tree, mode, why):
    assert setup_py(tree, "build_ext", "--inplace").returncode == 0  # an earlier, good build
    assert built_module(tree).exists()
    run = rebuild(tree, "build_ext", "--inplace", STUB_MODE=mode, ZQ_BUILD_CACHE="off")
    assert run.returncode == 0, run.stdout + run.stderr  # the install goes on, interpreted
    assert "WARNING: the core (the engine) is NOT compiled" in run.stderr
    assert len([line for line in run.stderr.splitlines() if line.startswith("zq build:")]) >= 4  # a banner, not a line
    assert why in run.stderr
    m = manifest(tree)
    assert m["BUILD"] == "interpreted" and m["SOURCES"] is None
    assert m["WHY"].startswith("not compiled at install: ") and why in m["WHY"]
    assert not built_module(tree).exists()  # nothing compiled left to load
    probe = subprocess.run([sys.executable, "-c", "import zq.build as b; b.install(); print(b.describe())"],
                           cwd=tree, capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "ZQ_PURE"})  # (the suite may run with it)
    assert probe.stdout.strip() == f"core interpreted: {m['WHY']}", probe.stderr


def test_a_failed_build_leaves_no_compiled_module_in_build_lib(tree):
    """What a wheel is made of: no module from an earlier build may ride along."""
    assert setup_py(tree, "build_ext").returncode == 0
    (lib,) = (tree / "build").glob("lib*")
    assert (lib / "zq" / "core" / f"queue{EXT_SUFFIX}").exists()
    (lib / "zq" / "core" / f"engine{EXT_SUFFIX}").write_bytes(b"an earlier build's")
    (lib / f"0123abcd__mypyc{EXT_SUFFIX}").write_bytes(b"an earlier build's")
    run = setup_py(tree, "build_ext", STUB_MODE="type-errors", ZQ_BUILD_CACHE="off")
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(lib.rglob(f"*{EXT_SUFFIX}")) == []
    assert b'BUILD = "interpreted"' in (lib / "zq" / "_compiled.py").read_bytes()


def test_zq_require_compiled_fails_a_build_that_does_not_compile(tree):
    run = setup_py(tree, "build_ext", "--inplace", STUB_MODE="type-errors", ZQ_REQUIRE_COMPILED="1")
    assert run.returncode != 0
    assert "ZQ_REQUIRE_COMPILED=1 and the core is not compiled" in run.stderr


def test_zq_pure_builds_interpreted_without_running_mypyc(tree):
    run = setup_py(tree, "build_ext", "--inplace", ZQ_PURE="1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert mypyc_calls(tree) == 0 and not built_module(tree).exists()
    assert "NOT compiled" not in run.stderr  # asked for: no alarm
    assert manifest(tree)["WHY"] == "not compiled at install: ZQ_PURE is set"


def test_ctrl_c_interrupts_the_build(tree):
    run = setup_py(tree, "build_ext", "--inplace", STUB_MODE="interrupt")
    assert run.returncode != 0, "the build swallowed KeyboardInterrupt"
    assert "interrupted" in run.stderr or "KeyboardInterrupt" in run.stderr  # (setuptools says "interrupted")
    assert not (tree / "zq" / "_compiled.py").exists()  # and recorded nothing


def test_the_cache_key_follows_the_sources_and_the_tools(tree, monkeypatch):
    import runpy

    monkeypatch.setenv("PYTHONPATH", str(tree.parent / "stub"))
    setup = runpy.run_path(str(tree / "setup.py"), run_name="zq_setup")
    key = setup["cache_key"](tree)
    assert setup["cache_key"](tree) == key
    monkeypatch.setenv("CC", "clang")
    assert setup["cache_key"](tree) != key
    monkeypatch.delenv("CC")
    assert setup["cache_key"](tree) == key
    build.source_path("zq.core.depth", tree).write_text("# edited\n")
    assert setup["cache_key"](tree) != key
