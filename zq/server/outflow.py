"""Bytes sent to a peer that it has not read: bounded per peer, in bytes.

libzmq bounds what waits for one peer by its high-water mark, which counts *frames*
(1,000), not bytes: a peer that asks for big answers (RANGE, PEEK, STATS, a replay) and
never reads its socket made the dispatcher hold 12 x 16 MiB answers, then 120 (1.9 GiB),
and nothing a client says can prove it read anything (bookmarks are guessable).

So the dispatcher asks the kernel. For a TCP peer, ``TCP_INFO``'s ``tcpi_bytes_acked``
counts the bytes the peer's host has acknowledged: bytes that left this process. The
bytes zq handed to libzmq for the peer (``Peer.out_bytes``, counted as they are sent)
minus those is an upper bound of what waits here for it (the acknowledged count
includes ZMTP framing and heartbeats, so the estimate errs low only by those few bytes
a frame). The peer's connection is found through the file descriptor libzmq gives with
each frame it receives (``ZMQ_SRCFD``), checked against the address seen then, since a
closed connection's descriptor number is soon another's.

What waits is compared with ``server.max_unread`` (64 MiB by default):

* over it, a request whose answer can be large (``PULL_COMMANDS``) is refused with
  ``limit`` (a small frame) until the peer reads;
* deliveries to it wait in the dispatcher as bookmarks (``Peer.paused``), not as
  frames, and leave in order once it reads (the journal holds their bytes anyway);
* a peer over it that does not read a quarter of the limit within its dead-peer
  window (heartbeat x liveness), nor get back under the limit, is cut off: its session
  ends (its leases go back) and its TCP connection is shut down, which makes libzmq
  drop what it held for it. (Reading a trickle is not reading.)

Many peers each within that limit could still hold, together, more than the machine
has (10,000 connections x 64 MiB). So the dispatcher also keeps a total against
``server.max_unread_total`` (1 GiB by default). Every byte handed to libzmq is counted
(``sent_since``); the total is reckoned again (``reckon``: the peers that hold bytes,
the biggest measured first until the estimate is within the budget) once half the
budget has been sent since, and every 250 ms while the total is over the budget. Over
it, the connections of ended sessions that still hold bytes are shut (no session,
nothing lost), and every peer holding more than its share (the budget over the number
of holders) is *squeezed*: it gets nothing more until it has read everything it holds,
and is cut off like any peer over its limit if it reads nothing for its dead-peer
window. At 1.5 x the budget the dispatcher is *full*: only peers holding at most 1 MiB
(or 1/64 of the budget) unread (readers: a bystander, a worker keeping up) get big answers and deliveries; at
2 x it is *brimful*: no measured peer does, until a reckoning finds the total back
under. So what waits here stays under 2 x the budget plus one answer, plus the RANGE
answers under way (``server.max_range_requests`` of them, counted once sent).

Only TCP peers can be measured: in-process links are the host itself, and ``ipc://``
peers are local users of the machine (documented in docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import msgspec

from zq import wire
from zq.core import limits

if TYPE_CHECKING:
    from zq.server.sessions import Peer

log = logging.getLogger("zq.server")

# Requests whose answers can be megabytes: refused while the peer's unread bytes are over
# the limit. (Deliveries wait instead; everything else answers in a few bytes.)
PULL_COMMANDS: frozenset[type] = frozenset({
    wire.Range, wire.Peek, wire.Stats, wire.Queues, wire.QueryCmd, wire.Replay, wire.Admin, wire.Claim,
})

_TCP_INFO_BYTES = 232  # struct tcp_info up to and past tcpi_bytes_acked (Linux >= 4.1)
_BYTES_ACKED_OFFSET = 120  # __u64 tcpi_bytes_acked: 8 one-byte + 24 u32 fields + 2 u64 before it
_TCP_INFO = getattr(socket, "TCP_INFO", None)


def peer_address(fd: int) -> tuple | None:
    """The remote address of TCP socket ``fd``, or None if it is not one (ipc, closed)."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
            return None
        return s.getpeername()
    except OSError:
        return None
    finally:
        s.detach()  # libzmq's descriptor: never closed here


@contextlib.contextmanager
def connection(fd: int, address: tuple) -> Iterator[socket.socket | None]:
    """libzmq's socket ``fd`` as a Python socket, or None if ``fd`` is no longer the
    connection to ``address`` (closed, or its number reused by another). Never closed
    here: it is detached on the way out."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        yield None
        return
    try:
        try:
            same = s.getpeername() == address
        except OSError:
            same = False
        yield s if same else None
    finally:
        s.detach()


def bytes_acked(fd: int, address: tuple) -> int | None:
    """Bytes the peer at ``address`` acknowledged on ``fd``; None if ``fd`` is no longer
    that connection or the kernel cannot say."""
    if _TCP_INFO is None:
        return None
    with connection(fd, address) as s:
        if s is None:
            return None
        try:
            info = s.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _TCP_INFO_BYTES)
        except OSError:
            return None
    if len(info) < _BYTES_ACKED_OFFSET + 8:
        return None  # a kernel before 4.1
    return int(struct.unpack_from("=Q", info, _BYTES_ACKED_OFFSET)[0])


def shut_down(fd: int, address: tuple) -> bool:
    """Shut the TCP connection down under libzmq, which then drops it (and what it held
    for it). Only if ``fd`` is still the connection to ``address``."""
    with connection(fd, address) as s:
        if s is None:
            return False
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            return False
        return True


UNSQUEEZED = 1 << 62  # ``Peer.unread_cap`` of a peer the total has not squeezed
RECKON_INTERVAL_S = 0.25  # while over the budget: how often every holder is measured again
CHANGED, EVERYONE = 1, 2  # what a reckoning measures (``Outflow.due``)
FULL_ALLOWANCE = 1 << 20  # unread bytes of a peer still served while the dispatcher is full (or 1/64 of the budget)


class Outflow:
    """The per-peer accounting (the counters live on ``Peer``; this holds the rule) and
    the dispatcher-wide total."""

    def __init__(self, limit_bytes: int, total_bytes: int = 1 << 30) -> None:
        self.limit = limit_bytes
        self.total_limit = total_bytes
        self.allowance = min(FULL_ALLOWANCE, total_bytes >> 6)  # what a reader may hold while full
        self.refused = 0  # requests refused while their peer's unread bytes were over the limit
        self.paused_deliveries = 0  # delivery batches that waited for their peer to read
        self.cut_off = 0  # peers cut off for reading nothing while over the limit
        self.measured = 0  # TCP_INFO reads
        self.sent_since = 0  # bytes handed to libzmq since the total was last reckoned (``reckon``)
        self.total = 0  # what every measured peer held unread at the last reckoning
        self.reckonings = 0
        self.reckoned_at = 0.0  # time.monotonic() of the last reckoning
        # While ``sent_since`` stays at or below this, no reckoning is due and the
        # dispatcher is not full: a peer's own counts decide (the fast path, every delivery).
        self.quiet_until = total_bytes >> 1
        self.squeezed = 0  # peers squeezed because the total was over its budget
        self.shut_leftovers = 0  # ended sessions' connections shut because the total was over

    def due(self) -> int:
        """Is it time to reckon the total again? ``EVERYONE``: measure every holder that
        matters; ``CHANGED``: only those sent something since they were last measured."""
        estimate = self.total + self.sent_since
        if estimate > self.total_limit and time.monotonic() - self.reckoned_at >= RECKON_INTERVAL_S:
            return EVERYONE  # over: often enough that peers that have read since are seen to
        if self.sent_since > self.total_limit >> 1:
            return CHANGED
        if self.sent_since > self.allowance and estimate > self.total_limit + (self.total_limit >> 1):
            return CHANGED  # full, if the bytes sent since are still unread: are they?
        return 0

    def full(self) -> bool:
        """Does the dispatcher hold so much unread that only peers that read what they are
        sent (``FULL_ALLOWANCE``) may be sent more?"""
        return self.total + self.sent_since > self.total_limit + (self.total_limit >> 1)

    def brimful(self) -> bool:
        """... so much that no measured peer may be sent more?"""
        return self.total + self.sent_since > self.total_limit << 1

    def attach(self, peer, fd: int) -> None:  # type: ignore[no-untyped-def]
        """Learn ``peer``'s connection from a frame it sent (``ZMQ_SRCFD``)."""
        if fd < 0:
            peer.fd = -2  # no descriptor (inproc://): not measured
            return
        address = peer_address(fd)
        if address is None:
            peer.fd = -2  # not TCP: not measured (ipc:// peers are the machine's own users)
            return
        acked = bytes_acked(fd, address)
        if acked is None:
            return
        # A new connection (a first one, or the same routing id come back): what waited on
        # an earlier one went with it; counting starts from what has been sent so far.
        peer.fd, peer.address = fd, address
        peer.cleared = peer.out_bytes
        peer.acked_base = acked - peer.cleared
        peer.stalled_since = 0

    def unread(self, peer, force: bool = False) -> int:  # type: ignore[no-untyped-def]
        """An upper bound of the bytes waiting here for ``peer``; measured only when the
        count alone says it may be over the limit, or ``force`` (a system call then)."""
        waiting = peer.out_bytes - peer.cleared
        if peer.fd < 0:
            return 0  # not measured: not a TCP peer, or its connection not learnt yet
        if waiting <= self.limit and not force:
            return waiting
        self.measured += 1
        peer.measured_out = peer.out_bytes
        acked = bytes_acked(peer.fd, peer.address)
        if acked is None:
            peer.fd = -1  # its connection is gone or replaced: learnt again from its next frame
            return 0
        cleared = acked - peer.acked_base
        if cleared > peer.cleared:
            peer.cleared = cleared
            if cleared - peer.window_cleared >= self.limit >> 2:
                # It reads at a pace that matters (a quarter of the limit since its window
                # began): the window starts again. A trickle (16 KiB/s against 4 MiB held)
                # once kept 40 peers that asked for 590 KB answers alive and growing.
                peer.stalled_since = 0
        return peer.out_bytes - peer.cleared

    def over(self, peer) -> bool:  # type: ignore[no-untyped-def]
        """Is ``peer`` over its limit (``server.max_unread``, or 0 while squeezed)?"""
        cap = peer.unread_cap
        limit = self.limit if cap > self.limit else cap
        waiting = peer.out_bytes - peer.cleared
        if waiting <= limit:
            if waiting <= 0 and cap != UNSQUEEZED:
                peer.unread_cap = UNSQUEEZED  # measured: it read everything it held
            return False
        if peer.fd < 0:
            return False  # not measured (not TCP, or its connection not learnt yet)
        waiting = self.unread(peer, force=True)
        if waiting <= 0 and cap != UNSQUEEZED:
            peer.unread_cap = UNSQUEEZED  # it read everything it held: the squeeze is over
            return False
        return waiting > limit

    def reckon(self, peers: Mapping[bytes, Peer], leftovers: dict[bytes, Peer], how: int = EVERYONE) -> list[Peer]:
        """Reckon what every peer holds unread; if it is over ``total_limit``, shut the
        connections of ended sessions that hold bytes, then squeeze every peer holding more
        than its share (returned, so the caller starts their dead-peer windows)."""
        self.sent_since = 0
        self.reckonings += 1
        self.reckoned_at = time.monotonic()
        holders = [p for p in (*peers.values(), *leftovers.values())
                   if p.fd >= 0 and p.out_bytes > p.cleared]
        total = sum(p.out_bytes - p.cleared for p in holders)
        if total > self.total_limit:
            # The counts over-state what readers hold (each is measured only past its own
            # limit): measure the biggest first, until the estimate is within the budget.
            holders.sort(key=lambda p: p.out_bytes - p.cleared, reverse=True)
            for p in holders:
                if total <= self.total_limit:
                    break
                if how == CHANGED and p.measured_out == p.out_bytes:
                    continue  # sent nothing since it was measured (a squeezed peer): as it was
                before = p.out_bytes - p.cleared
                total -= before - max(self.unread(p, force=True), 0)
        if total > self.total_limit:
            for p in holders:  # ended sessions first: nothing is lost with them
                if leftovers.get(p.peer_id) is p and p.fd >= 0:
                    total -= max(p.out_bytes - p.cleared, 0)
                    del leftovers[p.peer_id]
                    self.shut_leftovers += 1
                    shut_down(p.fd, p.address)
                    p.fd = -1
        self.total = total
        if total <= self.total_limit:
            self.quiet_until = min(self.total_limit >> 1, self.total_limit - total)
            return []
        self.quiet_until = -1  # over the budget: every check looks at the total
        holding = [p for p in holders if p.fd >= 0 and p.out_bytes > p.cleared]
        share = self.total_limit // max(1, len(holding))
        squeezed: list[Peer] = []
        for p in holding:
            if p.out_bytes - p.cleared > share and p.unread_cap == UNSQUEEZED:
                p.unread_cap = 0
                self.squeezed += 1
                squeezed.append(p)
        return squeezed

    @staticmethod
    def inherit(peer, old) -> None:  # type: ignore[no-untyped-def]
        """A new session on a connection whose last one left bytes unread (a BYE or a
        second HELLO, then more requests): it starts from the old counts, else each new
        session would get the limit afresh while libzmq still holds the old one's."""
        peer.out_bytes, peer.cleared, peer.acked_base = old.out_bytes, old.cleared, old.acked_base
        peer.fd, peer.address, peer.ranges_waiting = old.fd, old.address, old.ranges_waiting
        peer.stalled_since = old.stalled_since  # (a HELLO every 0.3 s once kept the window from ever ending)
        peer.window_cleared = old.window_cleared
        peer.unread_cap = old.unread_cap

    def cut(self, peer) -> bool:  # type: ignore[no-untyped-def]
        """Shut ``peer``'s connection down (its session is ended by the caller)."""
        self.cut_off += 1
        done = peer.fd >= 0 and shut_down(peer.fd, peer.address)
        peer.fd = -1
        return done

    def stats(self) -> dict[str, int]:
        return {"max_unread_bytes": self.limit, "refused_unread": self.refused,
                "paused_deliveries": self.paused_deliveries, "cut_off_unread": self.cut_off,
                "max_unread_total_bytes": self.total_limit, "unread_total": self.total,
                "reckonings": self.reckonings, "squeezed": self.squeezed, "shut_leftovers": self.shut_leftovers,
                "full": self.full(), "brimful": self.brimful()}


def frames_of(raws: list[msgspec.Raw]) -> list[list[msgspec.Raw]]:
    """Records split into DELIVER frames of at most DELIVER_BATCH_MAX records and about
    DELIVER_FRAME_BYTES (one bigger record goes alone)."""
    if len(raws) <= limits.DELIVER_BATCH_MAX and sum(map(len, raws)) <= limits.DELIVER_FRAME_BYTES:
        return [raws]  # the common case: one frame, without a Python step per record
    out: list[list[msgspec.Raw]] = []
    part: list[msgspec.Raw] = []
    size = 0
    for raw in raws:
        n = len(raw)
        if part and (len(part) >= limits.DELIVER_BATCH_MAX or size + n > limits.DELIVER_FRAME_BYTES):
            out.append(part)
            part, size = [], 0
        part.append(raw)
        size += n
    if part:
        out.append(part)
    return out
