"""The client's half of reclaiming unstarted work: which deliveries it has not started.

Why the client decides
----------------------
Prefetch (a backlog above 1) keeps a fast worker busy, but a slow one sits on messages
it will not reach for a while as another worker goes idle. A reclaimable subscription
lets the dispatcher ask for such deliveries back (REVOKE). Only the holder knows
whether it has started one, and the answer must be atomic with the hand-over to the
user's code: so the I/O thread answers a REVOKE under the same lock the user's ``get``
takes a message with. A message is released (RELEASE) only if it was never handed
out; one handed out is *kept*. Released work is therefore never processed twice, by
construction, and the dispatcher needs no report of every start (no frame per message).

Two ways to start
-----------------
``reclaimable=True``: taking a message (``get``, ``get_many``, iterating) starts it.
``reclaimable="explicit"``: taking does not; ``msg.start()`` does, and returns False if
the message was given back meanwhile (then skip it: it went to another worker). That
suits ``get_many`` batches worked through one by one.

Deliveries are named by (bookmark, epoch): the same message may come back to the same
subscription later under a newer delivery count, and the old copy must stay given back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from zq.core import limits

REVOKED_KEPT = 2 * limits.BACKLOG_MAX  # given-back deliveries remembered (msg.start() stays False for them)


def reclaim_mode(value: Any) -> bool | str:
    """Check a ``reclaimable`` argument: False, True or "explicit"."""
    if value is False or value is True or value == "explicit":
        return value  # type: ignore[no-any-return]
    raise ValueError(f"reclaimable is False, True or 'explicit', not {value!r}")


class Unstarted:
    """A subscription's deliveries not yet started, and those given back."""

    __slots__ = ("explicit", "lock", "untaken", "revoked", "released")

    def __init__(self, explicit: bool) -> None:
        self.explicit = explicit
        self.lock = threading.Lock()
        self.untaken: set[tuple[int, int]] = set()  # delivered, not started
        self.revoked: dict[tuple[int, int], None] = {}  # given back: skipped if met, oldest forgotten first
        self.released = 0  # deliveries given back (stats for the user)

    def delivered(self, pairs: Iterable[tuple[int, int]]) -> None:
        """A DELIVER arrived (I/O thread): its leased messages are not started."""
        with self.lock:
            self.untaken.update(p for p in pairs if p[1])  # epoch 0: a barrier, nothing leased

    def revoke(self, bookmarks: list[int], epochs: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
        """A REVOKE arrived (I/O thread): give back what was not started. Returns the
        RELEASE's (bookmarks, epochs, kept, kept epochs)."""
        back: list[int] = []
        back_epochs: list[int] = []
        kept: list[int] = []
        kept_epochs: list[int] = []
        with self.lock:
            for b, e in zip(bookmarks, epochs):
                key = (b, e)
                if key in self.untaken:
                    self.untaken.discard(key)
                    self.revoked[key] = None
                    if len(self.revoked) > REVOKED_KEPT:
                        del self.revoked[next(iter(self.revoked))]
                    back.append(b)
                    back_epochs.append(e)
                else:
                    kept.append(b)
                    kept_epochs.append(e)
            self.released += len(back)
        return back, back_epochs, kept, kept_epochs

    def take(self, bookmark: int, epoch: int) -> bool:
        """The user's code takes this delivery: False if it was given back (skip it).
        Taking starts it, unless starts are explicit."""
        key = (bookmark, epoch)
        with self.lock:
            if key in self.revoked:
                del self.revoked[key]  # met once in the inbox: nothing else refers to it
                return False
            if not self.explicit:
                self.untaken.discard(key)
        return True

    def start(self, bookmark: int, epoch: int) -> bool:
        """``msg.start()``: True if the work is this worker's to do (asked again, the same answer)."""
        key = (bookmark, epoch)
        with self.lock:
            if key in self.revoked:
                return False
            self.untaken.discard(key)
        return True

    def settled(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Settled without a start (explicit mode): nothing to give back any more."""
        if self.explicit:
            with self.lock:
                self.untaken.difference_update(pairs)

    def reset(self) -> None:
        """A new session: every delivery of the old one is gone (redelivered)."""
        with self.lock:
            self.untaken.clear()
            self.revoked.clear()
