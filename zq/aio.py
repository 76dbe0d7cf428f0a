"""``zq.aio.connect``: the public path of the asyncio client (``zq.client.aio``)."""

from zq.client.aio import AsyncClient, connect

__all__ = ["AsyncClient", "connect"]
