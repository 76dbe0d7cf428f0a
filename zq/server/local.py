"""In-process sessions of an embedded dispatcher: the direct path (``LocalLink``).

Why it exists
-------------
An embedding process (a trading or analytics process with ``zq.Dispatcher`` inside)
that publishes over ``inproc://`` pays two hand-offs between threads per message: its
thread to the dispatcher's loop thread, and the loop thread to the worker's. On a
2-core machine each is a wake-up and a GIL transfer, and together they were most of the
embedded latency (p99 ~310 us, docs/performance.md). A ``LocalLink`` removes the first:
the thread that sends a frame steps the dispatcher itself (under the server's lock:
receive, engine, journal commit, sends), and what the step sends to another local
session lands in that session's inbox and wakes its thread. Publish to worker is then
one hand-off.

What it keeps: the protocol. A link carries the same encoded ZQP/1 frames as a socket
(HELLO, PUBLISH, SUBSCRIBE, ACK, ...), handled by the same handlers inside the same
safety net, committed by the same commit before any answer or delivery leaves. So
``zq.Publisher`` and ``zq.Worker`` run unchanged over it (they see a socket-shaped
object), and durability, flow control and leases mean what they mean over tcp.

What differs: no socket, so no CurveZMQ: a local session is the embedding process
itself and has every right. The loop thread still owns the ROUTER socket: frames a
local step addresses to remote peers wait in the server's outbox until the loop thread
sends them (woken through its pipe), so only one thread ever touches the socket.
"""

from __future__ import annotations

import collections
import threading
from typing import Protocol

import zmq

from zq.core.errors import ConnectionLost

_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


class LinkClosedError(ConnectionLost):
    """The embedded dispatcher behind a local session has stopped."""


class Stepper(Protocol):
    """What a link needs of the dispatcher (``zq.server.loop.Server``; named by shape,
    so this module does not import the loop that uses it)."""

    def local_step(self, link: LocalLink, frame: bytes) -> None: ...

    def close_link(self, link: LocalLink) -> None: ...


class LocalLink:
    """One in-process session: socket-shaped for the client (``send``, ``recv``,
    ``getsockopt(EVENTS)``, ``close``) and its own poller (``poll``).

    ``send`` runs the dispatcher's step in the caller's thread; ``push`` (called by the
    dispatcher, under its lock, from any thread) queues a frame and wakes the owner."""

    def __init__(self, server: Stepper, peer_id: bytes) -> None:
        self.server = server
        self.peer_id = peer_id
        self.inbox: collections.deque[bytes] = collections.deque()
        self.arrived = threading.Event()
        self.closed = False

    # ------------------------------------------------- the dispatcher's side

    def push(self, frame: bytes) -> None:
        self.inbox.append(frame)
        self.arrived.set()

    def end(self) -> None:
        """The dispatcher stopped: wake the owner, whose next call says so."""
        self.closed = True
        self.arrived.set()

    # --------------------------------------------------------- the client's side

    def send(self, frame: bytes, flags: int = 0) -> None:
        if self.closed:
            raise LinkClosedError("the embedded dispatcher has stopped")
        self.server.local_step(self, frame)

    def recv(self, flags: int = 0) -> bytes:
        while not self.inbox:
            if flags & _NOBLOCK:
                raise zmq.Again()
            self.poll(None)
        return self.inbox.popleft()

    def getsockopt(self, option: int) -> int:
        if option == _EVENTS:
            return _POLLIN if self.inbox else 0
        raise ValueError(f"a local link has no socket option {option}")

    def poll(self, timeout_ms: int | None = None) -> list[tuple[LocalLink, int]]:
        """Wait up to ``timeout_ms`` (None: forever) for a frame: ``zmq.Poller.poll``'s shape."""
        if not self.inbox and timeout_ms != 0:
            if self.closed:
                raise LinkClosedError("the embedded dispatcher has stopped")
            self.arrived.clear()
            if not self.inbox:  # a push between the check and the clear set it again: no lost wake-up
                self.arrived.wait(None if timeout_ms is None else timeout_ms / 1000)
        return [(self, _POLLIN)] if self.inbox else []

    def close(self, linger: int = 0) -> None:
        if not self.closed:
            self.closed = True
            self.server.close_link(self)
