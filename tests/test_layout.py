"""The tree shows the architecture (docs/architecture.md): every module lives in a room,
each room imports only the rooms below it, and no modules import each other in a circle.
Imports are read from the source (``ast``), including those inside functions and
under ``TYPE_CHECKING``: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "zq"

# room -> the rooms it may import from (itself included); docs/architecture.md has the table.
ALLOWED = {
    "zq.core": {"zq.core"},
    "zq.journal": {"zq.core", "zq.journal"},
    "zq.wire": {"zq.core", "zq.wire"},
    "zq.keys": {"zq.core", "zq.keys"},
    "zq.build": {"zq.build", "zq._compiled"},  # which build of the core runs (imported first by zq)
    "zq._compiled": {"zq._compiled"},  # written by setup.py when the core was compiled
    "zq.server": {"zq.core", "zq.journal", "zq.wire", "zq.keys", "zq.server"},
    "zq.client": {"zq.core", "zq.wire", "zq.keys", "zq.client"},
    "zq.spark": {"zq.core", "zq.journal", "zq.wire", "zq.keys", "zq.client", "zq.spark"},
    "zq.top": {"zq.core", "zq.wire", "zq.keys", "zq.client", "zq.top"},
    "zq.cli": None,  # the outermost room: anything
    "zq.testing": None,
    "zq": None,  # the package's public face (zq/__init__.py, zq/aio.py): re-exports
}
PUBLIC_FACE = {"zq", "zq.aio"}
# Inside the dispatcher: the loop uses the others; none of them uses the loop.
SERVER_TOP = {"zq.server", "zq.server.loop", "zq.server.dispatcher", "zq.server.cluster"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def type_only_blocks(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``: imports for annotations only, never run."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def imports_of(path: Path, runtime_only: bool = False) -> set[str]:
    """Every zq module ``path`` imports, anywhere in it (``runtime_only``: not those
    under ``if TYPE_CHECKING:``, which only annotations read)."""
    out = set()
    known = modules()
    tree = ast.parse(path.read_text())
    skip = type_only_blocks(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("zq")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zq"):
            assert node.level == 0, f"{path}: use absolute imports"
            for a in node.names:  # "from zq.server import admin" imports the module zq.server.admin
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in known else node.module)
    return out


def room_of(name: str) -> str:
    if name in PUBLIC_FACE:
        return "zq"
    for room in sorted(ALLOWED, key=len, reverse=True):
        if room != "zq" and (name == room or name.startswith(room + ".")):
            return room
    raise AssertionError(f"{name} is in no room: place it in one (docs/architecture.md)")


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_imports_only_the_rooms_below_its_own(name):
    room = room_of(name)
    allowed = ALLOWED[room]
    for imported in sorted(imports_of(modules()[name])):
        if allowed is not None:
            assert room_of(imported) in allowed, f"{name} ({room}) imports {imported} ({room_of(imported)})"
        if name.startswith("zq.server.") and name not in SERVER_TOP:
            assert imported not in SERVER_TOP, f"{name} imports {imported}: the loop uses it, not the reverse"


def test_no_modules_import_each_other_in_a_circle():
    # A part of the core annotates the coordinator it serves (``q: Queue``) for mypyc's
    # typed attribute access; that type-only import is not a circle at run time.
    graph = {name: {i for i in imports_of(path, runtime_only=True) if i in modules() and i != name}
             for name, path in modules().items()}
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            raise AssertionError("import circle: " + " -> ".join(stack[stack.index(name):] + [name]))
        if name in done:
            return
        for nxt in sorted(graph[name]):
            visit(nxt, stack + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_the_checker_sees_a_lower_room_importing_a_higher_one(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from zq.server.loop import Server\n    return Server\n")
    assert "zq.server.loop" in imports_of(bad)
    assert room_of("zq.server.loop") not in ALLOWED["zq.client"]


def test_every_command_a_client_can_send_has_exactly_one_handler():
    import typing

    from zq import wire
    from zq.server.commands import HANDLERS

    assert set(typing.get_args(wire.ClientCommand)) == set(HANDLERS)


def test_the_path_of_a_message_in_the_architecture_doc_names_real_functions():
    import re

    from zq import wire
    from zq.client.client import Client
    from zq.client.messages import Message, Subscription
    from zq.client.publisher import Publisher
    from zq.client.worker import Worker
    from zq.core import entering, settling
    from zq.core.admission import Admission
    from zq.core.engine import Engine
    from zq.core.queue import Queue
    from zq.journal.lmdb_journal import LmdbJournal
    from zq.server.commands import Commands
    from zq.server.loop import Server

    owners = {c.__name__: c for c in (Client, Message, Subscription, Publisher, Worker, Engine, Admission, Queue,
                                       LmdbJournal, Commands, Server)}
    owners["wire"] = wire
    owners["entering"], owners["settling"] = entering, settling  # the queue's parts the picture names
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    picture = doc.split("## The path of a message", 1)[1].split("```")[1]
    named = re.findall(r"\b([A-Z][A-Za-z]+|wire|entering|settling)\.([a-z_A-Z]+)", picture)
    assert len(named) > 15
    for owner, attr in named:
        assert owner in owners, f"the picture names {owner}.{attr}: add {owner} here or fix the doc"
        assert hasattr(owners[owner], attr), f"docs/architecture.md names {owner}.{attr}, which does not exist"
