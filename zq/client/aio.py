"""The asyncio client: the same shape as ``zq.Client``, awaitable.

It shares the sync client's I/O thread (one socket owner); confirmations and
replies arrive as futures wrapped for the event loop, deliveries are pushed into an
``asyncio.Queue`` with ``call_soon_threadsafe``.

    async with zq.aio.connect(endpoint) as c:           # or: c = await zq.aio.connect(endpoint)
        await c.publish("jobs", b"x")
        async with c.subscribe("jobs", max_backlog=16) as sub:   # or: sub = await c.subscribe(...)
            async for msg in sub:
                await msg.ack()                             # returns at once: the ack is queued

``connect`` and ``subscribe`` return an ``Opening``: awaited, it gives the client (or
subscription); used with ``async with``, it also closes it at the end (the two shapes
aiohttp and redis-py offer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, TypeVar

from zq.client.client import Client
from zq.client.messages import Message, Subscription, Transaction
from zq.client.session import cancel_options


T = TypeVar("T")


class Opening(Generic[T]):
    """``await opening`` -> the thing; ``async with opening as thing`` -> it, closed at
    the end. ``make`` is called once, by whichever shape is used."""

    def __init__(self, make: Callable[[], Awaitable[T]]) -> None:
        self._make = make
        self._value: Any = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()

    async def __aenter__(self) -> T:
        self._value = await self._make()
        return await self._value.__aenter__()  # type: ignore[no-any-return]

    async def __aexit__(self, *exc: object) -> None:
        await self._value.__aexit__(*exc)


class AsyncSubscription:
    def __init__(self, sub: Subscription, queue: asyncio.Queue[list[Message]]) -> None:
        self.sub = sub
        self.queue = queue  # filled by the subscription's sink, set before it subscribed
        self.local: list[Message] = []

    @property
    def backlog(self) -> int:
        return self.sub.backlog

    def __aiter__(self) -> "AsyncSubscription":
        return self

    async def __anext__(self) -> Message:
        unstarted = self.sub.unstarted
        while True:
            while not self.local:
                batch = await self.queue.get()
                self.local = [m for m in batch if m._generation == self.sub.client.generation]
                self.local.reverse()
            msg = self.local.pop()
            if unstarted is None or unstarted.take(msg.bookmark, msg.deliveries):
                return msg  # (else given back before it was taken: another worker has it)

    async def get(self, timeout: float | None = None) -> Message | None:
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except asyncio.TimeoutError:
            return None

    async def get_many(self, max_messages: int, timeout: float | None = None) -> list[Message]:
        """Up to ``max_messages``: waits for the first, then takes what has arrived."""
        first = await self.get(timeout)
        if first is None:
            return []
        out = [first]
        while len(out) < max_messages:
            if not self.local:
                try:
                    batch = self.queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                self.local = [m for m in batch if m._generation == self.sub.client.generation]
                self.local.reverse()
                continue
            msg = self.local.pop()
            if self.sub.unstarted is None or self.sub.unstarted.take(msg.bookmark, msg.deliveries):
                out.append(msg)
        return out

    def ack_many(self, messages: list[Message]) -> None:
        self.sub.ack_many(messages)

    async def settle(self, op: str, messages: list[Message], *, delay: float | None = None,
                     error: str | BaseException | None = None) -> dict[int, str]:
        """Settle now (``ack``, ``cancel`` or ``expire``) and await the dispatcher's
        verdicts: bookmark -> ``ok`` / ``lost`` / ``done`` / ``unknown`` (fenced leases;
        ``msg.ack(wait=True)`` would block the event loop). ``delay`` (a cancel's):
        the messages go again after that many seconds instead of the queue's backoff."""
        if op not in ("ack", "cancel", "expire"):
            raise ValueError(f"settle op is ack, cancel or expire, not {op!r}")
        if (delay is not None or error is not None) and op != "cancel":
            raise ValueError("only a cancel takes a delay or an error")
        delay_ms, text = cancel_options(delay, error) or (-1, "")
        live = [m for m in messages if m.deliveries]
        return await asyncio.get_running_loop().run_in_executor(None, lambda: self.sub._settle_wait(
            op, live, delay_ms=delay_ms, error=text))

    async def commit(self, messages: list[Message], publish: list[tuple] = [], *, op: str = "ack",  # noqa: B006
                     delay: float | None = None, error: str | BaseException | None = None) -> Transaction:
        """Settle ``messages`` and publish ``publish`` in one commit, awaited
        (``Subscription.commit``; ``msg.ack(publish=...)`` would block the event loop)."""
        outputs = list(publish)
        return await asyncio.get_running_loop().run_in_executor(None, lambda: self.sub.commit(
            messages, outputs, op=op, delay=delay, error=error))

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.sub.close)

    async def __aenter__(self) -> "AsyncSubscription":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncClient:
    def __init__(self, client: Client) -> None:
        self.client = client

    async def publish(self, topic: str, data: bytes | str, **kw: Any) -> int:
        loop = asyncio.get_running_loop()
        fut = await loop.run_in_executor(None, lambda: self.client.publish_async(topic, data, **kw))
        done: asyncio.Future[int] = loop.create_future()

        def settle(f) -> None:  # type: ignore[no-untyped-def]
            exc = f.exception(0)
            if exc is not None:
                loop.call_soon_threadsafe(lambda: done.done() or done.set_exception(exc))
            else:
                value = f.result(0)
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(value))

        fut.add_done_callback(settle)
        return await done

    async def publish_many(self, topic: str, messages: list[bytes | str], **kw: Any) -> list[int]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: self.client.publish_many(topic, messages, **kw))

    def subscribe(self, queue: str, *, max_backlog: int = 1, filter: str | None = None,
                  reclaimable: bool | str = False) -> Opening[AsyncSubscription]:
        """``await c.subscribe(...)`` or ``async with c.subscribe(...) as sub``
        (``reclaimable``: as ``zq.Client.subscribe``)."""
        return Opening(lambda: self._subscribe(queue, max_backlog, filter, reclaimable))

    async def _subscribe(self, queue: str, max_backlog: int, filter: str | None,
                         reclaimable: bool | str = False) -> AsyncSubscription:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[list[Message]] = asyncio.Queue()

        def sink(batch: list[Message]) -> None:  # on the client's I/O thread
            loop.call_soon_threadsafe(inbox.put_nowait, batch)

        sub = await loop.run_in_executor(
            None, lambda: self.client.subscribe(queue, max_backlog=max_backlog, filter=filter, sink=sink,
                                                reclaimable=reclaimable))
        return AsyncSubscription(sub, inbox)

    async def stats(self, queues: list[str] | None = None) -> dict:
        return await asyncio.get_running_loop().run_in_executor(None, lambda: self.client.stats(queues=queues))

    async def _call(self, _method: str, *args: Any, **kw: Any) -> Any:
        """(``_method``, not ``name``: an admin's own ``name=`` argument passes through.)"""
        method = getattr(self.client, _method)
        return await asyncio.get_running_loop().run_in_executor(None, lambda: method(*args, **kw))

    # Request/answer operations: the sync client's, awaited off the event loop.
    async def peek(self, queue: str, limit: int = 100, filter: str | None = None) -> list[dict]:
        return await self._call("peek", queue, limit, filter)

    async def query(self, queue: str, **kw: Any) -> list[dict]:
        return await self._call("query", queue, **kw)

    async def claim(self, queue: str, **kw: Any) -> list[Message]:
        """A long poll that does not block the event loop."""
        return await self._call("claim", queue, **kw)

    async def admin(self, op: str, **args: Any) -> Any:
        return await self._call("admin", op, **args)

    async def create_queue(self, name: str, **settings: Any) -> dict:
        return await self._call("create_queue", name, **settings)  # type: ignore[no-any-return]

    async def alter_queue(self, name: str, **settings: Any) -> dict:
        return await self._call("alter_queue", name, **settings)  # type: ignore[no-any-return]

    async def delete_queue(self, name: str) -> int:
        return await self._call("delete_queue", name)  # type: ignore[no-any-return]

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.client.close)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def connect(endpoint: str | None = None, **kw: Any) -> Opening[AsyncClient]:
    """``await zq.aio.connect(...)`` or ``async with zq.aio.connect(...) as c``."""
    return Opening(lambda: _connect(endpoint, kw))


async def _connect(endpoint: str | None, kw: dict[str, Any]) -> AsyncClient:
    from zq.client.client import connect as sync_connect

    loop = asyncio.get_running_loop()
    return AsyncClient(await loop.run_in_executor(None, lambda: sync_connect(endpoint, **kw)))
