"""Topic routing: which queues a topic reaches, and the queues made on the way.

A topic reaches every queue whose ``topics`` cover it; the answer is cached per topic
until a queue is added, altered or deleted. A topic no queue covers gets a queue of
its own name (``auto_queues``), with every queue's defaults. A subscription to a name
no queue has makes a *provisional* queue: not journaled until a message enters it, and
forgotten when its last subscription ends with nothing in it, so that a typo (`zq
consume jbos`) leaves nothing behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from zq.core import records as R
from zq.core.errors import ConfigError, ReservedNameError
from zq.core.settings import QueueSettings, auto_queue, covers_topic

ROUTE_CACHE_MAX = 65_536  # topics whose queues are remembered (then forgotten all at once, and found again)

if TYPE_CHECKING:
    from zq.core.host import Host
    from zq.core.queue import Queue


class Routes:
    """The topic -> queues map of an engine, and its auto-created and provisional queues."""

    def __init__(self, host: Host, auto_queues: bool) -> None:
        self.host = host
        self.auto_queues = auto_queues
        self.cache: dict[str, list[Queue]] = {}
        self.provisional: set[str] = set()  # queues a subscription created (see the module docstring)

    def route(self, topic: str) -> list[Queue]:
        qs = self.cache.get(topic)
        if qs is None:
            qs = [q for q in self.host.queues.values() if q.covers(topic)]
            if len(self.cache) >= ROUTE_CACHE_MAX:
                self.cache.clear()  # (topics named and never published to must not grow it for good)
            self.cache[topic] = qs
        return qs

    def covered(self, topic: str) -> bool:
        """Does any queue take ``topic``? (Not cached when none does: a question about a
        topic nobody publishes to leaves nothing behind.)"""
        qs = self.cache.get(topic)
        if qs is not None:
            return bool(qs)
        return any(q.covers(topic) for q in self.host.queues.values())

    def route_or_create(self, topic: str, *, dead_letter: bool = True, strict: bool = True) -> list[Queue]:
        """The queues covering ``topic``; with none, an auto-created queue of that name.

        A queue's name is reserved: when no queue covers ``topic`` but a queue is named
        so (its ``topics`` take other names), a message there would reach no queue, or
        an auto-created queue would take the name. ``strict`` (a publish, a move) refuses
        it before anything is journaled; a copy that must go somewhere (a dead letter, a
        redrive) is journaled on its topic in no queue, and a notice says so.
        """
        queues = self.route(topic)
        if self.provisional:
            for q in queues:
                if q.name in self.provisional:
                    self.keep_provisional(q)
        if not queues:
            host = self.host
            named = host.queues.get(topic)
            if named is not None:
                text = (f"{topic!r} is the name of queue {topic!r}, which takes the topics matching "
                        f"{named.settings.topics!r}, not {topic!r}")
                if strict:
                    raise ReservedNameError(f"{text}: publish to one of its topics (or give the queue publish_to)")
                host.notices.append(f"a copy published to {text}: it is in the journal, in no queue")
            elif self.auto_queues:
                queues = [host.add_queue(self.auto_settings(topic, dead_letter))]
                self.cache.pop(topic, None)
        return queues

    def auto_settings(self, name: str, dead_letter: bool = True) -> QueueSettings:
        """An auto-created queue's settings: the defaults of every queue, except a dead
        letter that would reach no queue (``<name>.dead`` is the name of a queue whose
        topics do not take it): then none, said in the log."""
        s = auto_queue(name, self.host.next_seq, dead_letter=dead_letter)
        target = s.dead_letter
        if target is not None and target in self.host.queues and not self.route(target):
            self.host.notices.append(f"queue {name[:80]!r} created without a dead letter: {target[:80]!r} is the name "
                                     "of a queue whose topics do not take it, so its dead letters would reach no queue")
            s = msgspec.structs.replace(s, dead_letter=None)
        return s

    def keep_provisional(self, q: Queue) -> None:
        """A queue a subscription created gets its first message (or a declare, an alter):
        journaled from now on, as if declared (its start stays where it began)."""
        host = self.host
        self.provisional.discard(q.name)
        host.records.append(R.QueueDeclared(msgspec.json.encode(q.settings), host.now_ms))
        host.tables_changes += 1

    def forget_provisional(self, q: Queue) -> None:
        """A queue a subscription created, never given a message, loses its last subscriber."""
        if q.name in self.provisional and not q.subs and q.depth == 0 and not q.lease_of and not q.meta:
            self.provisional.discard(q.name)
            del self.host.queues[q.name]
            self.cache.clear()

    def check_dead_letter(self, target: str, source: str, new: QueueSettings | None = None) -> None:
        """Refuse a dead-letter target that names a queue not taking it as a topic: its
        dead letters would reach no queue. ``new``: a queue about to be declared."""
        named = new if new is not None and new.name == target else (q.settings if (q := self.host.queues.get(target))
                                                                     else None)
        if named is None or self.route(target) or new is not None and covers_topic(new, target):
            return
        raise ConfigError(f"queue {source!r}: dead_letter {target!r} is the name of queue {target!r}, whose topics "
                          f"({named.topics!r}) do not include {target!r}: its dead letters would reach no queue")

    def resolve_topic(self, topic: str) -> str:
        """A publish to a queue's name goes to its ``publish_to`` topic, when it has one."""
        q = self.host.queues.get(topic)
        if q is not None and q.settings.publish_to:
            return q.settings.publish_to
        return topic
