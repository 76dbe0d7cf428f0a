"""A tiny driver for engine unit tests: one clock, commit-free, deliveries by sub."""

from zq.core import Engine, QueueSettings
from zq.core import records as R


class Harness:
    """Drives one engine; ``journaled`` stands in for the journal's content port."""

    def __init__(self, *queues: QueueSettings, auto_queues: bool = True) -> None:
        self.journaled: dict[int, R.Message] = {}
        self.engine = Engine(queues, auto_queues=auto_queues, content=self.journaled.get, scan=self.scan)
        self.now = 0
        self.records: list = []
        self.revokes: list = []  # the last drain's (reclaiming)

    def scan(self, from_seq: int, limit: int) -> list[R.Message]:
        return [self.journaled[s] for s in sorted(self.journaled) if s >= from_seq][:limit]

    def pub(self, topic: str, n: int = 1, group: str | None = None, payload: bytes = b"m", **headers: str) -> list[int]:
        if group is not None:
            headers["group"] = group
        return [self.engine.publish(topic, payload, dict(headers), self.now) for _ in range(n)]

    def sub(self, sub_id: str, queue: str, backlog: int = 1, consumer: str | None = None, filter: str | None = None) -> int:
        return self.engine.subscribe(sub_id, queue, consumer or sub_id, backlog, self.now, filter=filter)

    def drain(self) -> dict[str, list[int]]:
        out = self.engine.drain(self.now)
        for r in out.records:
            if type(r) is R.Message:
                if r.copy_of is not None:
                    original = self.journaled[r.copy_of]
                    r = R.Message(r.seq, r.ts_ms, r.topic, {**original.headers, **r.headers}, original.payload)
                self.journaled[r.seq] = r
        self.records.extend(out.records)
        self.revokes = list(out.revokes)
        got: dict[str, list[int]] = {}
        for d in out.deliveries:
            got.setdefault(d.sub_id, []).extend(d.seqs)
        return got

    def commit_to(self, journal) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
        """Drain, append this step's records to ``journal`` and commit them."""
        got = self.drain()
        journal.append(self.records)
        self.records = []
        journal.commit(self.now)
        return got

    def advance(self, ms: int) -> None:
        self.now += ms
        self.engine.advance(self.now)

    def events(self, kind: str) -> list:
        return [r for r in self.records if getattr(r, "kind", None) == kind]
