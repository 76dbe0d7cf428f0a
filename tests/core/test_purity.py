"""The core stays sans-IO: no sockets, no disk, no clock, no global randomness."""

import ast
import pathlib

import zq.core

FORBIDDEN = {"zmq", "lmdb", "time", "random", "socket", "os", "asyncio", "threading", "rich", "typer", "datetime"}


def test_core_modules_import_no_io_clock_or_randomness():
    core = pathlib.Path(zq.core.__file__).parent
    offenders = []
    for path in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
