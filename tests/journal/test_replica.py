"""A standby's copy (zq.journal.replica): the leader's records stored as their own bytes,
the tables mirrored, the leader's trims followed, the position and floor kept."""

from zq.core import QueueSettings
from zq.journal import replica
from zq.journal.lmdb_journal import LmdbJournal
from zq.journal.ranges import select_records

from tests.core.helpers import Harness


def dump(j: LmdbJournal) -> dict:
    with j.env.begin() as txn:
        return {name: list(txn.cursor(db=db)) for name, db in
                (("msgs", j.msgs), ("events", j.events), ("queues", j.queues), ("ids", j.ids))}


def test_a_copy_is_byte_identical_and_follows_the_leaders_trims(tmp_path):
    leader = LmdbJournal(str(tmp_path / "leader"))
    h = Harness(QueueSettings(name="jobs", dead_letter="jobs.dead", max_failures=1))
    h.engine.add_queue(QueueSettings(name="reports"))  # declared at run time: in the queues table
    seqs = [h.engine.publish("jobs", b"x", {}, 0, msg_id=f"id-{i}") for i in range(6)]
    h.sub("s", "jobs", 10)
    h.commit_to(leader)
    h.engine.ack("s", seqs[:3], 0)
    h.engine.cancel("s", [seqs[3]], 0, error="boom")  # a dead letter: stored resolved
    h.commit_to(leader)
    end = leader.next_seq()
    msgs, _, _ = select_records(leader, "messages", 0, end)
    events, _, _ = select_records(leader, "events", 0, end)
    with leader.env.begin(db=leader.queues) as txn:
        declared = [bytes(v) for _, v in txn.cursor()]
    copy = LmdbJournal(str(tmp_path / "copy"))
    replica.apply(copy, msgs, events, end, declared, leader.recovery_points())
    assert dump(copy) == dump(leader)
    assert replica.position(copy) == end == copy.next_seq()
    # The leader's retention deleted the first four bookmarks: the copy follows, ids too.
    replica.apply(copy, [], [], end, leader_first=seqs[3] + 1)
    left = dump(copy)
    assert [int.from_bytes(k, "big") for k, _ in left["msgs"]][0] == seqs[3] + 1
    assert len(left["ids"]) == len(dump(leader)["ids"]) - 4
    assert copy.next_seq() == end  # numbering goes on from the leader's end, whatever was deleted
    copy.close()
    leader.close()
