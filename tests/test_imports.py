"""Imports by need: ``import zq`` gives a client what it needs (the client, the errors,
the build check) without the server, the engine, LMDB or kazoo; every public name is
still there (the server's load on first use); a cluster without kazoo says which
extra to install. Each check runs in a fresh interpreter: this one has imported
everything already."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import zq

HEAVY = ("zq.server", "zq.core.engine", "zq.core.queue", "zq.journal", "lmdb", "kazoo")

# Every public name of ``zq`` as it was before its imports became lazy.
PUBLIC = ["Client", "Config", "ConfigError", "ConnectionLost", "Dispatcher", "JournalError", "LimitError", "Message",
          "NotSupportedError", "ProtocolError", "Publisher", "Server", "Subscription", "UnknownQueueError", "Worker",
          "ZqError", "__version__", "aio", "connect"]


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != "ZQ_PURE"}
    return subprocess.run([sys.executable, "-c", code], env={**e, **env}, capture_output=True, text=True, timeout=120)


def loaded_after(code: str, **env: str) -> list[str]:
    """The heavy modules in sys.modules after ``code`` runs in a fresh interpreter."""
    run = python(f"{code}\nimport sys, json\n"
                 f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({HEAVY!r}))))", **env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("pure", ["0", "1"])
def test_import_zq_loads_no_server_engine_lmdb_or_kazoo(pure):
    assert loaded_after("import zq", ZQ_PURE=pure) == []


def test_a_client_session_loads_no_server_engine_or_lmdb():
    code = ("import zq\n"
            "from zq import Client, Publisher, Worker, Message, Subscription, ConnectionLost, ZqError, aio, connect\n"
            "import zq.aio, zq.client, zq.wire")
    assert loaded_after(code) == []


def test_every_public_name_is_importable_as_before():
    assert sorted(zq.__all__) == sorted(PUBLIC)
    run = python(f"from zq import {', '.join(PUBLIC)}\n"
                 "import zq, zq.server, zq.core.errors as e\n"
                 "assert Server is zq.server.Server and Dispatcher is zq.server.Dispatcher and Config is zq.server.Config\n"
                 "assert ZqError is e.ZqError and issubclass(ConfigError, ZqError)\n"
                 "print('ok')")
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    for name in PUBLIC:
        assert getattr(zq, name) is not None
        assert name in dir(zq)


def test_server_names_load_on_first_use():
    code = ("import sys, zq\n"
            "assert 'zq.server' not in sys.modules\n"
            "server = zq.Server\n"
            "assert 'zq.server' in sys.modules and server.__module__ == 'zq.server.loop'\n"
            "assert zq.Server is server and zq.Dispatcher.__name__ == 'Dispatcher' and zq.Config.__name__ == 'Config'\n"
            "print('ok')")
    run = python(code)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_subpackages_still_resolve_as_attributes_and_unknown_names_do_not():
    code = ("import zq\n"
            "assert zq.server.Server is zq.Server\n"  # `import zq; zq.server...` worked when zq imported the server
            "try:\n"
            "    zq.no_such_name\n"
            "except AttributeError as exc:\n"
            "    print(exc)\n")
    run = python(code)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "module 'zq' has no attribute 'no_such_name'"
    with pytest.raises(ImportError):
        exec("from zq import no_such_name")


KAZOO_ABSENT = "import sys\nsys.modules['kazoo'] = None  # as if kazoo were not installed (zq[cluster] not asked for)\n"


def test_a_cluster_without_kazoo_names_the_extra_to_install():
    run = python(KAZOO_ABSENT + (
        "from zq.server.election import Coordinator\n"
        "try:\n"
        "    Coordinator('127.0.0.1:9', '/zq', 'n1', 'tcp://127.0.0.1:9', 1000)\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.name, exc, sep='|')\n"))
    assert run.returncode == 0, run.stderr
    kind, name, message = run.stdout.strip().split("|")
    assert kind == "ModuleNotFoundError" and name == "kazoo"
    assert "pip install 'zq[cluster]'" in message and message.count(". ") == 0  # one sentence


def test_zq_and_a_standalone_server_work_without_kazoo(tmp_path):
    code = KAZOO_ABSENT + (
        "import zq\n"
        "from zq import Config, Server, Dispatcher\n"
        "import zq.server.cluster, zq.server.election, zq.server.leadership\n"  # importable: kazoo loads on use
        "print('ok')\n")
    run = python(code)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
