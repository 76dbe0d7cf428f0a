"""Two-level fairness: a weighted fair share between tenants, and priority that ages.

A queue with ``tenant_header`` (or ``priority_aging``) is an *ordered* queue (see
zq.core.ordering) whose rank is given here, once, when a message enters. The rank is a
start tag of start-time fair queuing (Goyal, Vin and Cheng, SIGCOMM '96):

* the queue keeps a virtual ``clock``: the start tag of the latest message dispatched;
* tenant ``t`` (weight ``w``) keeps ``finish[t]``, where its previous message's share
  ends: a message of ``t`` starts at ``max(clock, finish[t])`` and moves ``finish[t]`` on
  by ``UNIT // w``. (With strict priority, each priority level of a tenant keeps its own.)

Dispatching by smallest start tag serves backlogged tenants in proportion to their
weights, whatever order they published in, and a tenant that was idle starts at the
clock: it gets its share from now on, not credit for the time it sent nothing, and
never a burst that starves the others. Between two messages of a backlogged tenant ``t``
each other backlogged tenant ``u`` gets at most ``ceil(w_u / w_t) + 1`` (the simulator
checks this bound).

Inside a tenant the queue's own order holds: publish order, or ``priority``. Strict
priority goes first across tenants too (a high-priority message is never kept behind a
lower one); with ``priority_aging = N`` each priority level is worth only ``N`` messages'
worth of the virtual clock, so a steady stream of high priority from one tenant delays a
lower-priority message by a bounded amount and never starves it.

The level packs what orders a message with its start tag, so that the tag (and, with
strict priority, the level's lane) can be read back when the message is dispatched (it
moves the clock) without a per-message map. Without priority, ``start - SPAN``; with
strict priority ``p``, ``(-p << START_BITS) + start - SPAN`` (the same when ``p`` is 0);
with aging, ``((start - p * aging) << START_BITS | start) - BASE``, the one wide form.
Every level is negative and far above ``Queue.key_floor``, as zq.core.ordering
requires; the narrow forms keep a queued message's rank a small int (bench ``kinds``).

Everything here is integer arithmetic on what the message carries and what the queue
dispatched, so the engine stays deterministic. After a restart the clock and the tags
start again from zero for the messages still in the queue (in publish order), which
shares the remaining backlog out fairly from then on.
"""

from __future__ import annotations

import heapq

from zq.core import limits
from zq.core.ordering import priority_of

UNIT = 1 << 30  # the virtual time one message of weight 1 takes
START_BITS = 130  # a start tag stays below 2**130 (2**100 messages of weight 1)
START_MASK = (1 << START_BITS) - 1
SPAN = 1 << START_BITS  # narrow forms: start - SPAN < 0
BASE = 1 << 330  # the aging form: |effective| << START_BITS < 2**256 (p < 2**64, aging steps < 2**60)


class FairShare:
    """The virtual clock and per-tenant tags of one fair queue, and what each tenant holds."""

    def __init__(self, header: str | None, weights: dict[str, int], default_weight: int, aging: int) -> None:
        self.header = header
        self.weights = dict(weights)
        self.default_weight = default_weight
        self.aging_step = aging * UNIT  # one priority level's worth of virtual time (0: strict)
        # The virtual clock, per priority level with strict priority (each level shares
        # out on its own) and one (level 0) otherwise; ``floor``: where every level's clock
        # stands after the queue last ran empty (past every tag handed out until then).
        self.clocks: dict[int, int] = {}
        self.floor = 0
        self.last_finish = 0  # the latest tag handed out
        self.finish: dict[tuple[str, int], int] = {}  # (tenant, priority level or 0) -> tag
        self.forget_at = limits.TENANTS_TRACKED_SOFT  # tenants in ``finish`` that trigger a sweep
        # What each tenant holds (waiting or leased), for stats and explain: only with a header.
        self.tenant_of: dict[int, str] = {}
        self.held: dict[str, int] = {}

    def tenant(self, headers: dict[str, str]) -> str:
        header = self.header
        if header is None:
            return ""
        name = headers.get(header)
        return name if name is not None else ""

    def weight(self, tenant: str) -> int:
        return self.weights.get(tenant, self.default_weight)

    def level(self, seq: int, headers: dict[str, str], priority: object) -> int:
        """The level of a message entering the queue (``priority``: the priority
        expression's value, None without one). Moves its tenant's tag on."""
        tenant = self.tenant(headers)
        p = priority_of(priority) if priority is not None else 0
        # Strict priority: each level shares out on its own (what a tenant queued lower
        # down does not delay its turn up here). Aging: one share per tenant across the
        # levels, or spreading messages over levels would multiply a tenant's share.
        lane = 0 if self.aging_step else p
        share = (tenant, lane)
        start = self.floor
        clock = self.clocks.get(lane, 0)
        if clock > start:
            start = clock
        finish = self.finish.get(share, 0)
        if finish > start:
            start = finish
        elif len(self.finish) >= self.forget_at:
            self.forget_idle()
        finish = start + UNIT // self.weight(tenant)
        self.finish[share] = finish
        if finish > self.last_finish:
            self.last_finish = finish
        if self.header is not None:
            self.held[tenant] = self.held.get(tenant, 0) + 1
            self.tenant_of[seq] = tenant
        if self.aging_step:
            return (((start - p * self.aging_step) << START_BITS) | start) - BASE
        return start - (p << START_BITS) - SPAN

    def forget_idle(self) -> None:
        """A share that ended before its level's clock starts at the clock anyway. (When
        most are still ahead, the next sweep waits until there are twice as many: a
        sweep costs one pass over them, and must not come with every message.)"""
        floor, clocks = self.floor, self.clocks
        self.finish = {sh: f for sh, f in self.finish.items() if f > max(floor, clocks.get(sh[1], 0))}
        lanes = {lane for _, lane in self.finish}
        self.clocks = {lane: c for lane, c in clocks.items() if lane in lanes and c > floor}
        self.forget_at = max(limits.TENANTS_TRACKED_SOFT, 2 * len(self.finish))

    def dispatched(self, rank: int, idle: bool) -> None:
        """A message with this rank was leased: its level's clock moves to its start tag;
        when nothing else waits (the end of a busy period), every level's clock moves past
        every tag handed out, so that the tenants that come next start level."""
        if idle:
            self.floor = self.last_finish
            self.clocks.clear()
            return
        if self.aging_step:
            start, lane = ((rank >> 64) + BASE) & START_MASK, 0
        else:
            tag = (rank >> 64) + SPAN
            start, lane = tag & START_MASK, -(tag >> START_BITS)
        if start > self.clocks.get(lane, 0):
            self.clocks[lane] = start

    def finished(self, seq: int) -> None:
        tenant = self.tenant_of.pop(seq, None)
        if tenant is None:
            return
        left = self.held[tenant] - 1
        if left:
            self.held[tenant] = left
        else:
            del self.held[tenant]

    def summary(self, top: int = 10) -> list[dict[str, object]]:
        """The tenants holding most (waiting or leased), by name on ties."""
        held = self.held
        names = heapq.nsmallest(top, held, key=lambda t: (-held[t], t))
        return [{"tenant": t, "weight": self.weight(t), "held": held[t]} for t in names]
