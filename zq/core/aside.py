"""Messages set aside by content filters, and each filtered subscription's cursor into them.

With content-filtered subscriptions a waiting message may be refused by every
subscription with credit; it is then *set aside* (``keys``: a sorted array of ranks, the
sequence number itself in a FIFO queue), not dropped and not blocking the messages behind
it (Qpid: "a cursor per subscription that skips non-matching entries"). Each filtered
subscription keeps a cursor (``Subscription.skip_cursor``): entries below it were already
judged for it. ``gen`` moves when that judgment may have gone stale (an entry inserted
below a cursor, a group freed, a subscription gone), which sends every cursor back to
the start. Entries taken out of the middle are marked ``gone`` and compacted later. A
set-aside group message *holds* its group (``Group.held``): the group's later messages
wait behind it, keeping group order.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import TYPE_CHECKING

from zq.core import grouping, leases, removal
from zq.core import records as R
from zq.core.ordering import SEQ_MASK

if TYPE_CHECKING:
    from zq.core.queue import Queue, Subscription


class SetAside:
    """The set-aside messages of one queue (see the module docstring)."""

    def __init__(self, q: Queue) -> None:
        self.q = q
        self.ordered = q.ordered
        self.floor = q.key_floor  # below every rank
        self.keys: array[int] | list[int] = self.fresh()
        self.gids = array("I")  # each entry's group (0: none)
        self.gone: set[int] = set()  # ranks taken out of ``keys`` (lazily compacted)
        self.gen = 0
        self.high = self.floor  # the highest cursor handed out (ranks of ordered queues are negative)

    def fresh(self) -> array[int] | list[int]:
        return [] if self.ordered else array("Q")  # ranks may be negative or wide

    def index_of(self, key: int) -> int:
        """Where live entry ``key`` is in ``keys``, or -1."""
        keys = self.keys
        if not keys or key in self.gone:
            return -1
        i = bisect_left(keys, key)
        return i if i < len(keys) and keys[i] == key else -1

    def has_before(self, offered: int, limit: int) -> bool:
        """Is an entry ranked in [``offered``, ``limit``) (not yet offered in this dispatch)?"""
        keys = self.keys
        i = bisect_left(keys, offered)
        return i < len(keys) and keys[i] < limit

    def add(self, key: int, seq: int, gid: int, judged: bool = False) -> int:
        """Nobody with credit matches ``seq`` (of rank ``key``): keep it waiting here.

        With ``judged`` (every set-aside message ranked below it was just offered), the
        cursors of subscriptions with credit move past it: they refused it already.
        Returns the new "offered" bound for ``Queue.dispatch``.
        """
        q = self.q
        keys = self.keys
        if key in self.gone:  # its old, taken entry is still there: drop it first
            i = bisect_left(keys, key)
            assert keys[i] == key
            del keys[i]
            del self.gids[i]
            self.gone.discard(key)
        if key < self.high:  # some cursor is already past it
            if judged:  # every subscription with credit just refused it: only those without rewind
                for sub in q.subs:
                    if sub.used >= sub.backlog and sub.skip_cursor > key:
                        sub.skip_cursor = key
            else:
                self.gen += 1  # they never judged it: every cursor starts over
        if keys and key < keys[-1]:
            i = bisect_left(keys, key)
            keys.insert(i, key)
            self.gids.insert(i, gid)
        else:
            keys.append(key)
            self.gids.append(gid)
        if gid:
            q.groups[gid].held = seq
        if not judged:
            return self.floor
        gen = self.gen
        for sub in q.subs:
            if sub.used < sub.backlog and sub.skip_gen == gen and sub.skip_cursor <= key:
                sub.skip_cursor = key + 1
        if key + 1 > self.high:
            self.high = key + 1
        return key + 1

    def offer(self, limit: int, now_ms: int, budget: int) -> None:
        """Offer set-aside messages ranked before ``limit`` to subscriptions with credit
        (until ``budget`` filter evaluations: a subscription's cursor keeps its place)."""
        q = self.q
        keys, gids, gone = self.keys, self.gids, self.gone
        removed, groups = q.removed, q.groups
        for sub in q.subs:
            if sub.used >= sub.backlog:
                continue
            if sub.skip_gen != self.gen:
                sub.skip_gen = self.gen
                sub.skip_cursor = self.floor
            i = bisect_left(keys, sub.skip_cursor)
            n = len(keys)
            while i < n and sub.used < sub.backlog:
                key = keys[i]
                if key >= limit or q.matches >= budget:
                    break
                i += 1
                if key in gone:
                    continue
                seq = key & SEQ_MASK
                if removed and seq in removed:
                    gone.add(key)
                    removal.drop_removed(q, seq, gids[i - 1])
                    continue
                gid = gids[i - 1]
                grp = groups[gid] if gid else None
                if grp is not None:
                    owner = grp.owner
                    if q.owned and owner is not None and owner is not sub:
                        if grp.inflight or owner.match is None:
                            continue
                        q.matches += 1
                        if owner.match(seq):
                            continue
                        grouping.disown(q, grp)
                    if not q.owned and grp.inflight:
                        continue
                if sub.match is not None:
                    q.matches += 1
                    if not sub.match(seq):
                        continue
                if q.last_holder and q.last_holder.get(seq) == sub.consumer and self.someone_else_takes(sub, seq):
                    i -= 1  # (its cursor stays here: the other one takes it in this pass)
                    break
                gone.add(key)
                if grp is not None:
                    grp.held = 0
                leases.grant(q, sub, seq, grp, now_ms)
                if grp is not None and grp.has_pending():
                    grouping.became_pending(q, grp)
            sub.skip_cursor = keys[i] if i < n else (keys[-1] + 1 if n else self.floor)
            if sub.skip_cursor > self.high:
                self.high = sub.skip_cursor
            if q.matches >= budget:
                break  # (the subscriptions after it keep their cursors for the next step)
        self.compact()

    def someone_else_takes(self, sub: Subscription, seq: int) -> bool:
        """Another consumer than ``sub``'s has credit and a filter that takes ``seq``."""
        q = self.q
        for s in q.subs:
            if s.consumer != sub.consumer and s.used < s.backlog:
                if s.match is None:
                    return True
                q.matches += 1
                if s.match(seq):
                    return True
        return False

    def take_out(self, seq: int, key: int) -> bool:
        """Remove waiting ``seq`` (of rank ``key``) if it is set aside here: it leaves the
        queue now, so a group it holds is free at once. False if it is not here."""
        i = self.index_of(key)
        if i < 0:
            return False
        q = self.q
        gid = self.gids[i]
        self.gone.add(key)
        q.depth -= 1
        q.finish(seq, gid)
        grp = q.groups.get(gid) if gid else None
        if grp is not None and grp.held == seq:
            grp.held = 0
            self.gen += 1
            if grp.has_pending():
                grouping.became_pending(q, grp)
        q.dirty = True
        return True

    def compact(self) -> None:
        gone = self.gone
        if not gone:
            return
        if len(gone) == len(self.keys):
            self.keys = self.fresh()
            self.gids = array("I")
            gone.clear()
            return
        if len(gone) > 64 and len(gone) * 2 > len(self.keys):
            keep = [i for i, s in enumerate(self.keys) if s not in gone]
            keys = self.fresh()
            keys.extend(self.keys[i] for i in keep)
            self.keys = keys
            self.gids = array("I", (self.gids[i] for i in keep))
            gone.clear()

    def expire(self, watermark: int) -> None:
        """Too-old set-aside messages expire (a group one held frees its group)."""
        q = self.q
        keys, gone = self.keys, self.gone
        for i, key in enumerate(keys):
            seq = key & SEQ_MASK
            if seq > watermark:
                if self.ordered:
                    continue  # ranks, not ages, order the array
                break
            if key in gone:
                continue
            gone.add(key)
            gid = self.gids[i]
            if seq in q.removed:
                removal.drop_removed(q, seq, gid)
                continue
            if gid and q.groups[gid].held == seq:
                grp = q.groups[gid]
                grp.held = 0
                if grp.has_pending():
                    grouping.became_pending(q, grp)
            q.depth -= 1
            q.expire_waiting(seq, gid, R.REASON_EXPIRED)
        self.compact()

    def live(self) -> list[int]:
        """Ranks of the set-aside messages still waiting, in order."""
        gone = self.gone
        return [s for s in self.keys if s not in gone]

    def live_with_groups(self) -> list[tuple[int, int]]:
        """(rank, group id) of the set-aside messages still waiting, in order."""
        gone = self.gone
        return [(k, g) for k, g in zip(self.keys, self.gids) if k not in gone]

    def oldest(self) -> int | None:
        """The oldest set-aside message (ordered queues keep ranks here: a scan)."""
        best = None
        for key in self.live():
            seq = key & SEQ_MASK
            if best is None or seq < best:
                best = seq
            if not self.ordered:
                break
        return best
