"""The dispatcher's ROUTER socket, bound with its options and security.

Its own room so that a cluster node can open it once and keep it: as a standby it
answers clients there that it is not the leader (``zq.server.standby.NotLeader``),
and on winning the election hands it to the dispatcher, with the HELLOs of clients
that arrived meanwhile still queued in it (a rebind would drop them and leave a gap).
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

import zmq

from zq.core import limits
from zq.core.errors import ZqError
from zq.server.config import Config
from zq.server.security import Security
from zq.server.sessions import is_local

log = logging.getLogger("zq.server")


@dataclass
class Router:
    sock: zmq.Socket[bytes]
    endpoints: list[str]
    security: Security | None
    security_monitor: zmq.Socket | None

    def close(self, linger_ms: int = 0) -> None:
        self.sock.close(linger=linger_ms)
        if self.security is not None:
            self.security.close()


def seed_routing_ids() -> bool:
    """Seed libc's ``rand`` from the OS before a ROUTER is made.

    libzmq (4.3.5, and master) names a peer that gives no routing id ``\\x00`` + a
    32-bit counter that starts at ``rand()`` when the ROUTER is created, and never seeds
    ``rand``: every process's first ROUTER hands out the same ids (``\\x00\\x6b\\x8b\\x45\\x67``
    first), and a generated id is not checked against ids peers chose for themselves, so
    a peer that takes the next ones makes libzmq abort when the next client connects.
    Seeding makes the start unguessable (zq never shows a routing id to a client); only
    a patched libzmq closes the rest (docs/reliability.md). Returns whether it seeded."""
    try:
        libc = ctypes.CDLL(None)
        libc.srand(ctypes.c_uint(int.from_bytes(os.urandom(4), "little")))
    except (OSError, AttributeError) as exc:  # no libc to load (not a glibc/musl platform)
        log.warning("could not seed libzmq's routing ids (%s): they start at the same value after every restart", exc)
        return False
    return True


def open_router(config: Config, ctx: zmq.Context) -> Router:
    """A ROUTER bound to ``config.bind``, heartbeats and frame limits set, CurveZMQ on
    with a ``[security]`` block (set before binding: it applies to every connection)."""
    seed_routing_ids()  # before the socket: libzmq draws the first generated id when it is made
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, config.heartbeat_ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, config.heartbeat_ms * config.heartbeat_liveness)
    # Frames up to twice the message limit are read and refused with an error
    # naming the limit; only absurd ones are cut off by libzmq (connection closed).
    sock.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_max(config.max_message_bytes))
    security: Security | None = None
    monitor = None
    if config.security is not None:
        security = Security(config.security, ctx)
        monitor = security.apply(sock)
    endpoints: list[str] = []
    try:
        for ep in config.bind:
            sock.bind(ep)
            endpoints.append(sock.getsockopt_string(zmq.LAST_ENDPOINT) or ep)
    except zmq.ZMQError as exc:
        sock.close(0)
        if security is not None:
            security.close()
        hint = f" (an endpoint names its transport: write tcp://{ep}, or ipc://PATH)" if "://" not in ep else ""
        raise ZqError(f"cannot bind {ep}: {exc}{hint}") from None
    if security is None:
        for ep in endpoints:
            if not is_local(ep):
                log.warning("serving WITHOUT authentication on %s: anyone who reaches it may publish, consume "
                            "and administer (add a [security] block to zq.toml)", ep)
    return Router(sock, endpoints, security, monitor)
