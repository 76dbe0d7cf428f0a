"""The dispatcher's ROUTER socket, bound with its options and security.

Its own room so that a cluster node can open it once and keep it: as a standby it
answers clients there that it is not the leader (``zq.server.standby.NotLeader``),
and on winning the election hands it to the dispatcher, with the HELLOs of clients
that arrived meanwhile still queued in it (a rebind would drop them and leave a gap).
"""

from __future__ import annotations

import logging
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


def open_router(config: Config, ctx: zmq.Context) -> Router:
    """A ROUTER bound to ``config.bind``, heartbeats and frame limits set, CurveZMQ on
    with a ``[security]`` block (set before binding: it applies to every connection)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, config.heartbeat_ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, config.heartbeat_ms * config.heartbeat_liveness)
    # Frames up to twice the message limit are read and refused with an error
    # naming the limit; only absurd ones are cut off by libzmq (connection closed).
    sock.setsockopt(zmq.MAXMSGSIZE, max(limits.FRAME_BYTES_MAX, 2 * config.max_message_bytes))
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
        raise ZqError(f"cannot bind {ep}: {exc}") from None
    if security is None:
        for ep in endpoints:
            if not is_local(ep):
                log.warning("serving WITHOUT authentication on %s: anyone who reaches it may publish, consume "
                            "and administer (add a [security] block to zq.toml)", ep)
    return Router(sock, endpoints, security, monitor)
