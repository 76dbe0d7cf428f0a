"""The sans-IO heart of zq: queue semantics with no sockets, no disk and no clock.

Everything here is driven by method calls that carry ``now_ms`` and answers with
data (journal records to append, deliveries to send). The same engine runs under
the ROUTER server, embedded in a host process, and under the deterministic
simulator in ``zq.testing``. A test walks the imports to keep it that way.
"""

from zq.core.engine import Deliver, Engine, Output
from zq.core.errors import LimitError, ProtocolError, UnknownQueueError, ZqError
from zq.core.settings import QueueSettings

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
