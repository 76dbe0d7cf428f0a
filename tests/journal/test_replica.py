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
    declared = leader.declared_raw()  # as the wire carries them
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


def test_the_epoch_history_says_where_each_epoch_ends_and_truncation_deletes_past_it(tmp_path):
    """A node that led epoch 2 wrote past where the new leader (epoch 3) took over:
    asked where epoch 2 ends in the new leader's history, it deletes its records from
    there, their message ids with them; its history, position and numbering follow."""
    j = LmdbJournal(str(tmp_path / "j"))
    h = Harness(QueueSettings(name="jobs"))
    assert replica.begin_epoch(j, 1) == j.next_seq() == 1 and replica.last_epoch(j) == 1
    first = [h.engine.publish("jobs", b"a", {}, 0, msg_id=f"a{i}") for i in range(5)]
    h.sub("s", "jobs", 10)
    h.commit_to(j)
    start2 = replica.begin_epoch(j, 2)
    assert start2 == j.next_seq() and replica.epochs(j) == [(1, 1), (2, start2)]
    late = [h.engine.publish("jobs", b"b", {}, 0, msg_id=f"b{i}") for i in range(4)]
    h.engine.ack("s", first[:2], 0)
    h.commit_to(j)
    assert j.find_id("jobs", "b0") is not None
    # The new leader took over as epoch 3 at the second epoch-2 message.
    new_history = [(1, 1), (2, start2), (3, late[1])]
    end = replica.end_of_epoch(new_history, replica.last_epoch(j), 10_000)
    assert end == late[1]
    deleted = replica.truncate_from(j, end)
    assert deleted >= 3  # three messages, and the events written after them
    assert [m.seq for m in j.read_messages(0)] == first + late[:1]
    assert all(e.seq < end for e in j.read_events(0))
    assert j.find_id("jobs", "b1") is None and j.find_id("jobs", "b0") is not None
    assert replica.position(j) == end == j.next_seq()
    assert replica.epochs(j) == [(1, 1), (2, start2)]
    # The new leader's history is then copied with the tables; a node at the end of
    # the new leader's current epoch keeps everything.
    assert replica.end_of_epoch(new_history, 3, 777) == 777
    assert replica.end_of_epoch([], 0, 5) == 5
    assert replica.truncate_from(j, end) == 0
    j.close()
