"""Build: the hot path (zq.build.COMPILED_MODULES) compiled with mypyc where it can be.

Everything else is in pyproject.toml. No C compiler, no mypyc, ``ZQ_PURE=1`` or a failed
compile: the same package installs interpreted, and says why. A build that compiled
records a hash of each compiled module's source in ``zq/_compiled.py``; ``zq.build``
runs the compiled modules only while their sources still match (see there).
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
BUILD = runpy.run_path(str(HERE / "zq" / "build.py"))  # the module list and the hash, stdlib only


def say(message: str) -> None:
    print(f"zq build: {message}", file=sys.stderr)


def compiled_extensions() -> list:
    if os.environ.get("ZQ_PURE", "") not in ("", "0"):
        say("ZQ_PURE is set: installing the interpreted core")
        return []
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        say(f"no C compiler ({compiler}): installing the interpreted core")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        say(f"mypyc unavailable ({exc}): installing the interpreted core")
        return []
    paths = [str(BUILD["source_path"](m, Path("."))) for m in BUILD["COMPILED_MODULES"]]
    try:  # type-checks as it compiles; third-party types not in the build env count as Any
        return mypycify(["--ignore-missing-imports", "--follow-imports=silent", *paths], opt_level="3")
    except BaseException as exc:  # mypyc reports type errors by exiting: fall back, never fail the install
        say(f"mypyc could not compile the core ({exc!r}): installing the interpreted core")
        return []


class BuildCore(build_ext):
    """Compile; on any failure install interpreted. Then record what was compiled."""

    def run(self) -> None:
        manifest = Path(self.get_ext_fullpath("zq.core.queue")).parent.parent / "_compiled.py"
        if manifest.exists():
            manifest.unlink()  # a stale record must never outlive a rebuild
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 -- a failed compile installs the interpreted core
            say(f"compiling the core failed ({exc}): installing the interpreted core")
            for ext in self.extensions:
                built = Path(self.get_ext_fullpath(ext.name))
                if built.exists():
                    built.unlink()
            return
        sources = {m: BUILD["source_hash"](HERE / BUILD["source_path"](m, Path("."))) for m in BUILD["COMPILED_MODULES"]}
        manifest.write_text('"""Written by setup.py: the sources the compiled core was built from (zq.build)."""\n\n'
                            f"SOURCES = {sources!r}\n")
        say(f"core compiled with mypyc ({len(sources)} modules)")


if __name__ == "__main__":  # as pip's build backend runs it (tests import the functions above)
    setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": BuildCore})
