"""The sans-IO heart of zq: queue semantics with no sockets, no disk and no clock.

Everything here is driven by method calls that carry ``now_ms`` and answers with
data (journal records to append, deliveries to send). The same engine runs under
the ROUTER server, embedded in a host process, and under the deterministic
simulator in ``zq.testing``. A test walks the imports to keep it that way.

The engine's names load on first use (PEP 562): a client imports ``zq.core.errors``
or ``zq.core.records`` without loading the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from zq.core.errors import LimitError, ProtocolError, UnknownQueueError, ZqError
from zq.core.settings import QueueSettings

if TYPE_CHECKING:
    from zq.core.engine import Deliver, Engine, Output

_LAZY = {"Deliver": "zq.core.engine", "Engine": "zq.core.engine", "Output": "zq.core.engine"}

__all__ = [
    "Deliver",
    "Engine",
    "LimitError",
    "Output",
    "ProtocolError",
    "QueueSettings",
    "UnknownQueueError",
    "ZqError",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
