"""zq: a journaled ZeroMQ work-queue dispatcher.

>>> import zq                                                    # doctest: +SKIP
>>> c = zq.connect("tcp://127.0.0.1:7780")                        # doctest: +SKIP
>>> c.publish("jobs", b"payload", group="cust-17")                # doctest: +SKIP
>>> with c.subscribe("jobs", max_backlog=16) as sub:              # doctest: +SKIP
...     for msg in sub:
...         msg.ack()
"""

__version__ = "0.1.0"

from zq import build as _build

_build.install()  # compiled or interpreted core: decided before any of it loads (zq.build)

from zq import aio  # noqa: E402
from zq.client import Client, ConnectionLost, Message, Subscription, connect
from zq.server.config import Config
from zq.core.errors import (
    ConfigError,
    JournalError,
    LimitError,
    NotSupportedError,
    ProtocolError,
    UnknownQueueError,
    ZqError,
)
from zq.client.publisher import Publisher
from zq.server import Dispatcher, Server
from zq.client.worker import Worker

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
