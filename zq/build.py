"""Which build of the hot path runs: compiled by mypyc, or interpreted.

``pip install`` compiles ``COMPILED_MODULES`` with mypyc where a C compiler is present
(``setup.py``), and records a hash of each module's source beside them
(``zq/_compiled.py``); a build that did not compile records why there instead (``zq
--version`` reports it, and the build printed a warning). At import, before any of
them loads, ``install`` checks those hashes: a compiled module runs only when its
``.py`` is exactly what was compiled.
Otherwise (an edited source in an editable install, ``ZQ_PURE=1``, no record of a
build) every one of them is loaded from its ``.py``, so an edit can never be silently
shadowed by a stale ``.so``; an edit says so on stderr, once. The modules are loaded
all one way or all the other: compiled modules call each other natively.

This module runs inside ``setup.py`` too (for the module list and the hash), so it
imports nothing outside the standard library.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

# The hot path: the sans-IO engine's queue structures and dispatch. msgspec structs and
# exception classes stay in interpreted modules (mypyc drops their class keywords).
COMPILED_MODULES = ("zq.core.queue", "zq.core.ordering", "zq.core.fairshare", "zq.core.engine", "zq.core.depth",
                    "zq.core.manage", "zq.core.inventory", "zq.core.aside", "zq.core.choosing",
                    "zq.core.expiry", "zq.core.browse", "zq.core.grouping",
                    "zq.core.leases", "zq.core.delaying", "zq.core.settling", "zq.core.removal", "zq.core.reclaim",
                    "zq.core.overflow", "zq.core.barriers", "zq.core.causes",
                    "zq.core.host", "zq.core.timeindex", "zq.core.routing", "zq.core.admission",
                    "zq.core.subscriptions", "zq.core.outputs", "zq.core.recovery", "zq.core.views", "zq.core.entering", "zq.core.deadlines")
ROOT = Path(__file__).resolve().parent.parent  # the directory holding the zq package

BUILD = "interpreted"  # or "compiled"
WHY = "not yet checked"


def source_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale_modules(recorded: dict[str, str], root: Path = ROOT) -> list[str]:
    """The compiled modules whose source is no longer what was compiled."""
    return [m for m in COMPILED_MODULES if recorded.get(m) != source_hash(source_path(m, root))]


class SourceFirst:
    """A meta-path finder that loads the compiled modules from their ``.py`` files."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED_MODULES:
            return None
        source = str(source_path(fullname, self.root))
        return importlib.util.spec_from_file_location(fullname, source,
                                                      loader=importlib.machinery.SourceFileLoader(fullname, source))


def install() -> None:
    """Decide the build (see the module docstring); called first thing by ``import zq``."""
    global BUILD, WHY
    if any(m in sys.modules for m in COMPILED_MODULES):
        return  # decided already (or imported some other way): never mix the two
    try:
        from zq import _compiled  # type: ignore[attr-defined]  # written by setup.py
    except ImportError:
        _compiled = None
    SOURCES = getattr(_compiled, "SOURCES", None)
    if os.environ.get("ZQ_PURE", "") not in ("", "0"):
        BUILD, WHY = "interpreted", "ZQ_PURE is set"
    elif not SOURCES:  # the build recorded why it installed interpreted (or left no record)
        BUILD = "interpreted"
        WHY = getattr(_compiled, "WHY", None) or "not compiled at install (no C compiler, mypyc missing, or ZQ_PURE=1 then)"
    else:
        stale = stale_modules(SOURCES)
        if not stale:
            BUILD, WHY = "compiled", "mypyc"
            return
        BUILD = "interpreted"
        WHY = f"{', '.join(stale)} changed since it was compiled"
        print(f"zq: {WHY}: running the interpreted core (`pip install -e .` compiles it again)", file=sys.stderr)
    sys.meta_path.insert(0, SourceFirst(ROOT))


def describe() -> str:
    """One line for ``zq --version`` and ``zq serve``: which build runs, and why."""
    if BUILD == "compiled":
        return "core compiled with mypyc"
    return f"core interpreted: {WHY}"

