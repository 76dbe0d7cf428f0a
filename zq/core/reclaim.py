"""Reclaiming unstarted work: a subscription with credit that got nothing (*hungry*)
while a reclaimable one holds deliveries it may not have started asks the holder for
some back (Kafka's cooperative rebalancing of prefetched work, per message).

After dispatch the engine asks ``plan`` (only when the queue's counters moved since a
look that found nothing, ``seen``): the fullest reclaimable holders are asked for the
newer half of what they may not have started, up to what the hungry can take; grouped
messages are never asked back (a group's order and holder stay as they are). The holder
answers with what it had not started (``take_back``): only deliveries asked for and
still live come back, no delivery counted (``given``: subtracted wherever a limit counts
deliveries), and the holder's credit is withheld until that step's dispatch offered
them to the others (``end_hold``): else the holder could simply take them again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zq.core import leases, limits, settling
from zq.core import records as R
from zq.core.leases import D_MASK, G_SHIFT


if TYPE_CHECKING:
    from collections.abc import Callable

    from zq.core.queue import Queue, Subscription



class Reclaimer:
    """One queue's reclaiming (see the module docstring)."""

    def __init__(self, q: Queue) -> None:
        self.q = q
        self.subs = 0  # reclaimable subscriptions of the queue
        self.given: dict[int, int] = {}  # seq -> times given back unstarted
        self.done: dict[int, int] = {}  # this step's finished messages' (their dead letters carry them)
        self.holding: list[Subscription] = []  # subscriptions whose given-back credit is withheld this step
        self.seen: tuple[int, ...] = ()  # the queue's counters at the last decision that found nothing
        self.revoked = self.reclaimed = 0  # deliveries asked back, and given back (stats)

    def finished(self, seq: int) -> None:
        """``seq`` left the queue: its count goes with its dead letter, if any."""
        n = self.given.pop(seq, 0)
        if n:
            self.done[seq] = n

    def plan(self) -> list[tuple[Subscription, list[int], list[int]]]:
        """Called after dispatch: a subscription with credit that got nothing (*hungry*:
        it holds none) while a reclaimable one holds deliveries it may not have started:
        ask the fullest for the newer half of those back, up to what the hungry can take.
        Returns (holder, bookmarks, epochs) to revoke; the holder answers with what it had
        not started (``take_back``). Grouped messages are never asked back (a group's order
        and holder stay as they are). Called when the queue's counters moved since the
        last call that found nothing (``seen``), so an idle queue costs nothing."""
        q = self.q
        hungry = [s for s in q.subs if s.used == 0 and s.backlog > 0 and not s.held_back]
        if not hungry:
            return []
        lease_of, meta = q.lease_of, q.meta
        for sub in q.subs:
            for known in (sub.revoking, sub.kept):  # forget answers about deliveries that ended
                for seq, epoch in list(known.items()):
                    lease = lease_of.get(seq)
                    if lease is None or lease.sub is not sub or meta[seq] & D_MASK != epoch:
                        del known[seq]
            if sub.revoking:
                return []  # asked already: wait for the answers (or for those deliveries to end)
        want = sum(s.backlog for s in hungry)
        matches = [s.match for s in hungry]
        anyone = any(m is None for m in matches)
        donors: list[tuple[int, int, Subscription, list[int]]] = []
        for i, sub in enumerate(q.subs):
            if not sub.reclaimable or sub.used - len(sub.kept) < 2:
                continue
            cands = self.revocable(sub, anyone, matches)
            if len(cands) >= 2:
                donors.append((-len(cands), i, sub, cands))
        donors.sort()
        out: list[tuple[Subscription, list[int], list[int]]] = []
        for neg, _, sub, cands in donors:
            if want <= 0:
                break
            k = min(-neg // 2, want)  # the older half stays: never its oldest unstarted one
            seqs = cands[:k]
            epochs = [meta[seq] & D_MASK for seq in seqs]
            for seq, epoch in zip(seqs, epochs):
                sub.revoking[seq] = epoch
            self.revoked += k
            want -= k
            out.append((sub, seqs, epochs))
        return out

    def revocable(self, sub: Subscription, anyone: bool, matches: list[Callable[[int], bool] | None]) -> list[int]:
        """``sub``'s deliveries that may be asked back, newest first (at most
        ``RECLAIM_SCAN_MAX`` looked at): ungrouped, not known started,
        given back fewer than ``RECLAIMS_PER_MESSAGE_MAX`` times, and wanted by a hungry
        subscription (``anyone``: one has no filter; else one of ``matches`` takes it)."""
        q = self.q
        lease_of, meta, reclaims = q.lease_of, q.meta, self.given
        out: list[int] = []
        looked = 0
        for lease in reversed(sub.leases):
            if not lease.live:
                continue
            for seq in reversed(lease.seqs):
                if lease_of.get(seq) is not lease:
                    continue
                looked += 1
                if looked > limits.RECLAIM_SCAN_MAX:
                    return out
                if meta[seq] >> G_SHIFT or seq in sub.kept:
                    continue
                if reclaims and reclaims.get(seq, 0) >= limits.RECLAIMS_PER_MESSAGE_MAX:
                    continue
                if not anyone and not any(m is not None and m(seq) for m in matches):
                    continue
                out.append(seq)
        return out

    def take_back(self, sub: Subscription, seqs: list[int], epochs: list[int], kept: list[int],
                  kept_epochs: list[int]) -> list[int]:
        """The holder's answer to a revoke: ``seqs`` (delivered with ``epochs``) it had
        not started come back to their places, no delivery counted; ``kept`` (delivered
        with ``kept_epochs``) it had started. Only deliveries that were asked back and
        are still live are taken, so a client cannot use this to hand back work
        uncounted. Returns those taken back.
        Their credit is withheld from the holder until this step's dispatch has offered
        them to the others (``end_hold``): else the holder could simply take them again."""
        q = self.q
        lease_of, meta = q.lease_of, q.meta
        back: list[int] = []
        for seq, epoch in zip(seqs, epochs):
            if sub.revoking.get(seq) != epoch:
                continue  # not asked for, or answered already
            del sub.revoking[seq]
            lease = lease_of.get(seq)
            if lease is None or lease.sub is not sub or meta[seq] & D_MASK != epoch:
                continue  # that delivery ended meanwhile (settled, expired)
            _, m = leases.release(q, seq)
            q.note_event(R.RECLAIMED, sub.consumer, seq, m & D_MASK)
            self.given[seq] = self.given.get(seq, 0) + 1
            self.reclaimed += 1
            settling.put_back(q, seq, m)
            back.append(seq)
        for seq, epoch in zip(kept, kept_epochs):
            if sub.revoking.get(seq) == epoch:  # (an answer about an older delivery is not about this one)
                sub.kept[seq] = sub.revoking.pop(seq)
        if back:
            sub.given_back += len(back)
            if not sub.held_back:
                self.holding.append(sub)
            sub.held_back += len(back)
            sub.backlog -= len(back)
            q.dirty = True
        return back

    def end_hold(self) -> None:
        """After the dispatch that offered reclaimed messages to the others: their holders
        have their credit again."""
        q = self.q
        holding, self.holding = self.holding, []
        for sub in holding:
            if sub.held_back:
                sub.backlog += sub.held_back
                sub.held_back = 0
                q.credit_opened(sub)
