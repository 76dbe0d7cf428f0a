"""A writer process for the crash test: publishes, leases and acks against a real
LMDB journal, and reports on stdout only what a commit made durable.

Each line after a commit: ``C <seq,...> A <seq,...>`` (confirmed, acked).
"""

import sys

from zq.core import QueueSettings
from zq.journal.base import recover_engine
from zq.journal.lmdb_journal import LmdbJournal

SETTINGS = [QueueSettings(name="jobs", max_per_subscription_backlog=64, group_header="group", lease_ms=10**9)]


def main(path: str) -> None:
    journal = LmdbJournal(path, durability="batch")
    engine = recover_engine(journal, SETTINGS)
    engine.subscribe("s", "jobs", "w", 64, 0)
    now, held = 0, []
    while True:
        now += 1
        confirmed = [engine.publish("jobs", b"p" * 100, {"group": f"g{now % 7}"}, now) for _ in range(20)]
        acked = held[: len(held) // 2]
        held = held[len(held) // 2 :]
        engine.ack("s", acked, now)
        out = engine.drain(now)
        for d in out.deliveries:
            held.extend(d.seqs)
        journal.append(out.records)
        journal.commit(now)
        sys.stdout.write(f"C {','.join(map(str, confirmed))} A {','.join(map(str, acked))}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1])
