"""The package as pip builds it: pyproject.toml's metadata (an SPDX license, mypy pinned
for the build, kazoo only in the cluster extra), and real wheels built by pip from a
copy of this tree with the real mypyc: the first compiles and fills the build cache,
the second copies the compiled core from it, one without a C compiler is pure and
says why. (tests/test_build_cache.py covers the same logic in seconds, with a stand-in
mypyc.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement(reqs: list[str], name: str) -> Requirement:
    (found,) = [r for r in map(Requirement, reqs) if r.name == name]
    return found


def test_the_license_is_an_spdx_expression_and_the_build_setuptools_reads_it():
    assert PYPROJECT["project"]["license"] == "MIT"  # PEP 639; the table form is deprecated
    assert not any(c.startswith("License ::") for c in PYPROJECT["project"].get("classifiers", []))  # (both: an error)
    setuptools = requirement(PYPROJECT["build-system"]["requires"], "setuptools")
    assert not setuptools.specifier.contains("76.9"), "setuptools reads an SPDX license string from 77 on"


def test_mypy_is_pinned_for_the_build_to_the_range_the_suite_runs():
    mypy = requirement(PYPROJECT["build-system"]["requires"], "mypy")
    installed = Version(version("mypy"))
    assert mypy.specifier.contains(installed), f"the build's {mypy} excludes the tested mypy {installed}"
    assert not mypy.specifier.contains(f"{installed.major + 1}.0"), f"{mypy}: no upper bound"
    assert any(s.operator == "<" for s in mypy.specifier)
    assert requirement(PYPROJECT["project"]["optional-dependencies"]["dev"], "mypy").specifier == mypy.specifier


def test_kazoo_is_the_cluster_extra_and_the_test_suite_has_it():
    deps = PYPROJECT["project"]["dependencies"]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not any(Requirement(d).name == "kazoo" for d in deps)
    assert requirement(extras["cluster"], "kazoo")
    assert requirement(extras["dev"], "kazoo")


def copy_tree(dest: Path) -> Path:
    """This checkout's files, without what a build or a venv left in it."""
    skip = shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", "*.so", "_compiled.py",
                                  "zq-data", ".pytest_cache", "bench")
    shutil.copytree(ROOT, dest, ignore=skip)
    return dest


def pip_wheel(tree: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("ZQ_PURE", "ZQ_REQUIRE_COMPILED", "CC")}
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(tree)],
                          env={**base, **env}, capture_output=True, text=True, timeout=900)


def wheel_files(out: Path) -> tuple[Path, dict[str, bytes]]:
    (wheel,) = out.glob("zq-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return wheel, {n: z.read(n) for n in z.namelist()
                       if n.endswith((".so", "_compiled.py", "METADATA", "WHEEL"))}


@pytest.mark.slow
def test_pip_builds_compile_once_then_reuse_the_cache_and_a_pure_build_says_so(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler: nothing to compile")
    tree = copy_tree(tmp_path / "tree")
    cache = tmp_path / "cache"

    first = pip_wheel(tree, tmp_path / "w1", ZQ_BUILD_CACHE=str(cache))
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-5000:]
    assert "cached in" in first.stdout + first.stderr
    wheel, files = wheel_files(tmp_path / "w1")
    assert re.fullmatch(r"zq-0\.1\.0-cp3\d+-cp3\d+-linux_\w+\.whl", wheel.name), wheel.name
    compiled = {n: b for n, b in files.items() if n.endswith(".so")}
    assert any(n.startswith("zq/core/queue.") for n in compiled) and any("__mypyc" in n for n in compiled)
    assert b'BUILD = "compiled"' in files["zq/_compiled.py"]
    metadata = next(b for n, b in files.items() if n.endswith("METADATA")).decode()
    assert "License-Expression: MIT" in metadata
    assert re.search(r"^Requires-Dist: kazoo>=2\.10; extra == \"cluster\"$", metadata, re.M), metadata
    assert not re.search(r"^Requires-Dist: kazoo[^;]*$", metadata, re.M)

    second = pip_wheel(tree, tmp_path / "w2", ZQ_BUILD_CACHE=str(cache))
    assert second.returncode == 0, second.stdout[-5000:] + second.stderr[-5000:]
    assert "reused from the build cache" in second.stdout + second.stderr
    _, files2 = wheel_files(tmp_path / "w2")
    assert {n: b for n, b in files2.items() if n.endswith(".so")} == compiled  # the same compiled modules
    assert files2["zq/_compiled.py"] == files["zq/_compiled.py"]

    pure = pip_wheel(tree, tmp_path / "w3", ZQ_BUILD_CACHE=str(cache), CC="/nonexistent/cc")
    assert pure.returncode == 0, pure.stdout[-5000:] + pure.stderr[-5000:]
    assert "WARNING: the core (the engine) is NOT compiled: no C compiler (/nonexistent/cc)" in pure.stdout + pure.stderr
    wheel, files3 = wheel_files(tmp_path / "w3")
    assert wheel.name == "zq-0.1.0-py3-none-any.whl"
    assert not any(n.endswith(".so") for n in files3)
    assert "Root-Is-Purelib: true" in next(b for n, b in files3.items() if n.endswith("WHEEL")).decode()
    assert b"WHY = 'not compiled at install: no C compiler (/nonexistent/cc)'" in files3["zq/_compiled.py"]
