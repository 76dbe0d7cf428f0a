"""The engine as its parts see it: the state of the step they all add to.

``Engine`` is a coordinator of parts (``routing``, ``admission``, ``subscriptions``,
``timeindex``, ``outputs``, ``recovery``, ``views``), each owning one idea and its own
state. What they share is the step being built (its records, its time, the next
bookmark, the operator notices), the queues, and the few engine operations every part
needs: mark a queue for this step's visit, take a bookmark, read a message. A part
holds the engine as a ``Host`` rather than as an ``Engine`` so that the parts sit
below the engine (no module imports another in a circle) while mypyc still reaches
the shared state natively (a trait, like the engine's mixins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mypy_extensions import trait

if TYPE_CHECKING:
    from collections.abc import Callable

    from zq.core import expr
    from zq.core import records as R
    from zq.core.queue import Queue
    from zq.core.settings import QueueSettings


@trait  # mypyc: a compiled class may mix in traits only; Engine is the one implementation
class Host:
    """The shared state and operations of the engine (see the module docstring)."""

    queues: dict[str, Queue]
    records: list[Any]  # this step's journal records, in order
    notices: list[str]  # operator-worthy changes; the adapter logs them
    now_ms: int
    next_seq: int
    tables_changes: int
    queues_made: int
    consumer_names: dict[str, str]
    names_to_forget: list[str]
    content: Callable[[int], R.Message | None] | None
    expr_limits: expr.ExprLimits

    def set_time(self, now_ms: int) -> None:
        raise NotImplementedError

    def touch(self, q: Queue) -> None:
        raise NotImplementedError

    def take_seq(self) -> int:
        raise NotImplementedError

    def message(self, seq: int) -> R.Message | None:
        raise NotImplementedError

    def queue(self, name: str) -> Queue:
        raise NotImplementedError

    def add_queue(self, settings: QueueSettings, *, declare: bool = True) -> Queue:
        raise NotImplementedError

    def matcher(self, compiled: expr.Compiled) -> Callable[[int], bool]:
        raise NotImplementedError
