"""zq: a journaled ZeroMQ work-queue dispatcher.

>>> import zq                                                    # doctest: +SKIP
>>> c = zq.connect("tcp://127.0.0.1:7780")                        # doctest: +SKIP
>>> c.publish("jobs", b"payload", group="cust-17")                # doctest: +SKIP
>>> with c.subscribe("jobs", max_backlog=16) as sub:              # doctest: +SKIP
...     for msg in sub:
...         msg.ack()

``import zq`` loads what a client needs and no more: the server side (``Config``,
``Dispatcher``, ``Server``: the dispatcher, its engine, LMDB) loads on first use of one
of its names (PEP 562), and any ``zq.<subpackage>`` on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from zq import build as _build

_build.install()  # compiled or interpreted core: decided before any of it loads (zq.build)

from zq import aio  # noqa: E402
from zq.client import Client, ConnectionLost, Message, Subscription, connect  # noqa: E402
from zq.client.publisher import Publisher  # noqa: E402
from zq.client.worker import Worker  # noqa: E402
from zq.core.errors import (  # noqa: E402
    ConfigError,
    JournalError,
    LimitError,
    NotSupportedError,
    ProtocolError,
    UnknownQueueError,
    ZqError,
)

if TYPE_CHECKING:  # for type checkers and readers; at run time they load on first use (__getattr__)
    from zq.server import Config, Dispatcher, Server

# The server side: name -> the module it comes from, imported on first use.
_LAZY = {"Config": "zq.server", "Dispatcher": "zq.server", "Server": "zq.server"}

__all__ = [
    "Client",
    "Config",
    "ConfigError",
    "ConnectionLost",
    "Dispatcher",
    "JournalError",
    "LimitError",
    "Message",
    "NotSupportedError",
    "ProtocolError",
    "Publisher",
    "Server",
    "Subscription",
    "UnknownQueueError",
    "Worker",
    "ZqError",
    "__version__",
    "aio",
    "connect",
]


def __getattr__(name: str) -> Any:
    """PEP 562: the server-side names, and ``zq.<subpackage>``, loaded on first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once: later lookups do not come here
        return value
    if not name.startswith("_"):
        try:  # `import zq; zq.server.Config` worked while `import zq` imported the server
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the module exists and failed to import something: say that
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
