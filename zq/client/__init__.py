"""What runs in a client process: ``Client`` (``zq.connect``: an I/O thread, every
request), ``aio`` (the asyncio face of it), ``Publisher`` (single-threaded, for the
lowest publish latency) and ``Worker`` (single-threaded consuming). They share the
session code (``session``) and message types (``messages``), and speak only ``zq.wire``: nothing here imports the server."""

from zq.client.client import Client, connect
from zq.client.messages import Message, Subscription
from zq.client.session import ConnectionLost

__all__ = ["Client", "ConnectionLost", "Message", "Subscription", "connect"]
