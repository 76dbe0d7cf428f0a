"""Build: the hot path (zq.build.COMPILED_MODULES) compiled with mypyc where it can be.

Everything else is in pyproject.toml. No C compiler, no mypyc, ``ZQ_PURE=1`` or a failed
compile: the same package installs interpreted, says why in a banner on stderr (``pip
install -v`` shows it), records why in ``zq/_compiled.py`` (``python -m zq.build`` and
``zq --version`` report it) and, as a wheel, is tagged pure (``py3-none-any``). With
``ZQ_REQUIRE_COMPILED=1`` (CI) a core that does not compile fails the build instead.

mypyc runs only when ``build_ext`` does (not for ``egg_info``, ``sdist`` or the metadata
hooks), at most once per build, and not at all when the cache holds this very build:
compiled modules are kept under ``$ZQ_BUILD_CACHE`` (default ``~/.cache/zq-build``;
``ZQ_BUILD_CACHE=off`` disables it), keyed by the compiled modules' sources, the
Python build, mypy's and msgspec's versions and the mypyc flags, so a reinstall with
unchanged engine sources copies them in (seconds) instead of compiling (minutes).
A build that compiled records a hash of each compiled module's source in
``zq/_compiled.py``; ``zq.build`` runs the compiled modules only while their sources
still match (see there).
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import shutil
import sys
import sysconfig
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
BUILD = runpy.run_path(str(HERE / "zq" / "build.py"))  # the module list and the hash, stdlib only
MYPYC_ARGS = ("--ignore-missing-imports", "--follow-imports=silent")  # third-party types not in the build env: Any
OPT_LEVEL = "3"
CACHE_FORMAT = "1"  # bump when what a cache entry holds changes


def say(message: str) -> None:
    print(f"zq build: {message}", file=sys.stderr)


def banner(why: str) -> None:
    """A failed or impossible compile is loud: the install works, but runs slower."""
    line = "*" * 78
    print(f"\n{line}\n"
          f"zq build: WARNING: the core (the engine) is NOT compiled: {why}.\n"
          f"zq build: zq is installed INTERPRETED: it works, but its hot path runs slower.\n"
          f"zq build: `python -m zq.build` and `zq --version` say so too; ZQ_REQUIRE_COMPILED=1\n"
          f"zq build: makes a core that does not compile fail the install instead.\n"
          f"{line}\n", file=sys.stderr)


def flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def why_not_compiled() -> str | None:
    """Why the core cannot be compiled here (None: try)."""
    if flag("ZQ_PURE"):
        return "ZQ_PURE is set"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    try:
        import mypyc.build  # noqa: F401
    except ImportError as exc:
        return f"mypyc unavailable ({exc})"
    return None


def mypyc_extensions() -> list:
    """mypyc's extensions for the core: type-checks and writes their C as it is called,
    so only build_ext calls it. Raises (SystemExit: type errors) when it cannot."""
    from mypyc.build import mypycify

    paths = [str(BUILD["source_path"](m, Path("."))) for m in BUILD["COMPILED_MODULES"]]
    with cwd(HERE):  # mypyc names the modules by their paths from here
        return mypycify([*MYPYC_ARGS, *paths], opt_level=OPT_LEVEL)


def compiled_extensions() -> list:
    """mypyc's extensions for the core, or [] when it cannot compile (and says why)."""
    why = why_not_compiled()
    if why is not None:
        say(f"{why}: installing the interpreted core")
        return []
    try:
        return mypyc_extensions()
    except (Exception, SystemExit) as exc:  # Ctrl-C (KeyboardInterrupt) is neither: it interrupts
        say(f"mypyc could not compile the core ({exc!r}): installing the interpreted core")
        return []


@contextmanager
def cwd(path: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def version_of(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "none"


def cache_key(root: Path = HERE) -> str:
    """What a compiled build depends on: the compiled sources, this Python build, the
    compiler's tools' versions and the flags (and the compiler named by CC)."""
    parts = {
        "format": CACHE_FORMAT,
        "sources": {m: BUILD["source_hash"](BUILD["source_path"](m, root)) for m in BUILD["COMPILED_MODULES"]},
        "python": sys.version,
        "implementation": sys.implementation.cache_tag,
        "soabi": sysconfig.get_config_var("EXT_SUFFIX"),
        "platform": sysconfig.get_platform(),
        "mypy": version_of("mypy"),
        "msgspec": version_of("msgspec"),
        "mypy_extensions": version_of("mypy_extensions"),
        "flags": [*MYPYC_ARGS, OPT_LEVEL],
        "cc": os.environ.get("CC", ""),
        "cflags": os.environ.get("CFLAGS", ""),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def cache_root() -> Path | None:
    """Where compiled builds are kept (None: no cache)."""
    configured = os.environ.get("ZQ_BUILD_CACHE", "")
    if configured.lower() in ("off", "0", "no", "false"):
        return None
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zq-build"


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cache_load(entry: Path) -> dict[str, Path] | None:
    """The cached build in ``entry`` (extension name -> file), if whole and intact."""
    try:
        index = json.loads((entry / "index.json").read_text())
        files = {name: entry / info["file"] for name, info in index["extensions"].items()}
        if not files or any(file_hash(path) != index["extensions"][name]["sha256"] for name, path in files.items()):
            return None
        return files
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cache_store(entry: Path, built: dict[str, Path]) -> None:
    """Keep this build's extensions under ``entry``, whole or not at all."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        index = {}
        for name, path in built.items():
            shutil.copy2(path, staging / path.name)
            index[name] = {"file": path.name, "sha256": file_hash(path)}
        (staging / "index.json").write_text(json.dumps({"extensions": index}, indent=1, sort_keys=True))
        if entry.exists():
            shutil.rmtree(entry)  # a damaged entry (cache_load refused it)
        os.rename(staging, entry)  # atomic: a concurrent build sees all of it or none
    except OSError:
        pass  # another build stored it first, or the cache is not writable: not a reason to fail
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def place(source: Path, target: Path) -> None:
    """Copy a cached module in: always (whatever the mtimes say), and as a new file, so a
    process that has the old one loaded keeps its mapping intact."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copyfile(source, staging)
    os.chmod(staging, 0o755)
    os.replace(staging, target)


class BuildCore(build_ext):
    """Compile (or copy from the cache); on failure install interpreted, loudly. Then
    record what was built (``zq/_compiled.py``)."""

    def run(self) -> None:
        manifest = Path(self.get_ext_fullpath("zq.core.queue")).parent.parent / "_compiled.py"
        if manifest.exists():
            manifest.unlink()  # a stale record must never outlive a rebuild
        why = why_not_compiled()
        if why is None:
            try:  # a failed compile installs the interpreted core; Ctrl-C (KeyboardInterrupt) interrupts
                why = self.build_core()
            except SystemExit as exc:  # how mypyc reports type errors
                why = f"mypyc stopped (exit status {exc.code}; its errors are printed above)"
            except Exception as exc:  # noqa: BLE001 -- a C compile error, a mypyc crash
                why = f"compiling the core failed ({exc!r})"
        if why is None:
            sources = {m: BUILD["source_hash"](HERE / BUILD["source_path"](m, Path("."))) for m in BUILD["COMPILED_MODULES"]}
            manifest.write_text('"""Written by setup.py: the sources the compiled core was built from (zq.build)."""\n\n'
                                'BUILD = "compiled"\n'
                                f"SOURCES = {sources!r}\n")
            return
        self.remove_built()
        self.use_extensions([])  # nothing compiled: nothing to install or list
        if flag("ZQ_PURE"):  # asked for: no alarm
            say(f"{why}: installing the interpreted core")
        else:
            banner(why)
            if flag("ZQ_REQUIRE_COMPILED"):
                raise SystemExit(f"zq build: ZQ_REQUIRE_COMPILED=1 and the core is not compiled: {why}")
        manifest.write_text('"""Written by setup.py: this install of zq runs the interpreted core (zq.build)."""\n\n'
                            'BUILD = "interpreted"\n'
                            f"WHY = {'not compiled at install: ' + why!r}\n"
                            "SOURCES = None\n")
        wheel = self.distribution.command_obj.get("bdist_wheel")
        if wheel is not None:
            wheel.root_is_pure = True  # no compiled code in it: a py3-none-any wheel says so

    def build_core(self) -> str | None:
        """Copy the core from the cache, or compile it (and cache it). None when built,
        else why not."""
        root = cache_root()
        entry = root / cache_key() if root is not None else None
        cached = cache_load(entry) if entry is not None else None
        if cached is not None:
            self.use_extensions([Extension(name, sources=[]) for name in cached])
            for name, path in cached.items():  # as build_ext.run: into build_lib, then (editable) the source tree
                place(path, self.ext_path(name, inplace=False))
                if self.inplace:
                    place(path, self.ext_path(name, inplace=True))
            say(f"core compiled with mypyc: reused from the build cache ({entry}), not compiled again")
            return None
        self.use_extensions(mypyc_extensions())  # mypyc: once per build, here only
        inplace = self.inplace
        try:
            super().run()
        finally:
            self.inplace = inplace  # (setuptools leaves it False when the compile raises)
        if entry is not None:
            cache_store(entry, {ext.name: self.ext_path(ext.name, inplace=False) for ext in self.extensions})
        say(f"core compiled with mypyc ({len(BUILD['COMPILED_MODULES'])} modules)"
            + (f"; cached in {entry}" if entry is not None else ""))
        return None

    def use_extensions(self, extensions: list) -> None:
        """Build these instead of the placeholder (as finalize_options would have set them up)."""
        self.distribution.ext_modules = extensions
        self.extensions = extensions
        self.ext_map = {}
        for ext in extensions:
            ext._full_name = self.get_ext_fullname(ext.name)
            self.ext_map[ext._full_name] = ext
            self.ext_map[ext._full_name.split(".")[-1]] = ext
            ext._links_to_dynamic = False
            ext._needs_stub = False

    def ext_path(self, name: str, inplace: bool) -> Path:
        """Where extension ``name`` goes: build_lib, or (inplace, editable) the source tree."""
        was, self.inplace = self.inplace, inplace
        try:
            return Path(self.get_ext_fullpath(name))
        finally:
            self.inplace = was

    def remove_built(self) -> None:
        """A failed build leaves no compiled module behind, nor one an earlier build left
        in build_lib (a wheel would carry it) or, editable, in the source tree."""
        places = [False, True] if self.inplace else [False]
        for name in {ext.name for ext in self.extensions} | set(BUILD["COMPILED_MODULES"]):
            for inplace in places:
                self.ext_path(name, inplace).unlink(missing_ok=True)
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        for root in [Path(self.build_lib), HERE] if self.inplace else [Path(self.build_lib)]:
            for shared in root.glob(f"*__mypyc{suffix}"):  # mypyc's shared library, beside the package
                shared.unlink()


# A placeholder: it tells setuptools there is an extension to build (so build_ext runs and a
# compiled wheel is tagged for this platform) without running mypyc; build_ext replaces it.
PLACEHOLDER = [Extension("zq.core.queue", sources=[])]

if __name__ == "__main__":  # as pip's build backend runs it (tests import the functions above)
    setup(ext_modules=PLACEHOLDER, cmdclass={"build_ext": BuildCore})
