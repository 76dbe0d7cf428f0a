"""The pure layers of `zq top`: model from two snapshots, view recorded as text."""

import os
import re
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from zq.top import model as M
from zq.top.app import Poller
from zq.top.view import QUEUE_COLUMNS, allocate, num, render, sparkline

from .fixtures import CURR, IDLE, PREV, fleet_snapshot

GOLDEN = Path(__file__).with_name("golden_frame.txt")


def frame_text(m: M.TopModel, width: int = 110, height: int = 60) -> str:
    console = Console(width=width, height=height, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(render(m))
    return console.export_text()


def fleet_model(frames: int = 5) -> M.TopModel:
    """``frames`` one-second frames of the fleet: ``jobs`` busy and deepening, ten idle queues."""
    history, prev, m = M.History(), None, None
    for t in range(1, frames + 1):
        curr = fleet_snapshot(t)
        m = M.build("tcp://127.0.0.1:7780", prev, curr, 1000, history)
        prev = curr
    assert m is not None
    return m


def cells(line: str) -> list[str]:
    """A table line's cells (columns are two or more blanks apart; a header may hold one)."""
    return re.split(r"\s{2,}", line.strip())


def table_at(lines: list[str], first: str) -> tuple[int, list[str]]:
    """The index of a table's header line (its first cell ``first``) and its headers."""
    i = next(i for i, line in enumerate(lines) if cells(line)[0] == first and "─" in lines[i + 1])
    return i, cells(lines[i])


def test_rates_come_from_the_difference_of_two_snapshots():
    m = M.build("tcp://x", PREV, CURR, 1000, M.History())
    jobs = next(q for q in m.queues if q.name == "jobs")
    assert (jobs.in_rate, jobs.out_rate) == (1200.0, 1100.0)


def test_latency_percentiles_use_only_the_last_interval():
    m = M.build("tcp://x", PREV, CURR, 1000, M.History())
    jobs = next(q for q in m.queues if q.name == "jobs")
    # this interval: 100 <=5ms, 500 <=10ms, 400 <=25ms, 180 <=50ms, 20 <=100ms (1200 acks):
    # rank 600 is the last of the <=10ms bucket, rank 1188 lies in the <=100ms one
    assert (jobs.p50_ms, jobs.p99_ms) == (10.0, 100.0)


def test_latency_percentiles_are_measured_values_when_the_dispatcher_sends_them():
    import copy

    prev, curr = copy.deepcopy(PREV), copy.deepcopy(CURR)
    prev["queues"]["jobs"]["ack_latency"]["ms"] = {"3": 100, "7": 400, "17": 300, "41": 100}
    # this interval: 3 ms x 100, 7 ms x 500, 17 ms x 400, 41 ms x 180, 63 ms x 12, 130 ms x 8 (1200 acks)
    curr["queues"]["jobs"]["ack_latency"]["ms"] = {"3": 200, "7": 900, "17": 700, "41": 280, "63": 12, "130": 8}
    jobs = next(q for q in M.build("tcp://x", prev, curr, 1000, M.History()).queues if q.name == "jobs")
    assert (jobs.p50_ms, jobs.p99_ms) == (7.0, 63.0)  # not the bucket edges 10 / 100
    quiet = next(q for q in M.build("tcp://x", curr, curr, 1000, M.History()).queues if q.name == "jobs")
    assert (quiet.p50_ms, quiet.p99_ms) == (None, None)  # nothing acked in the interval


def test_consumers_show_ack_rate_and_mean_processing_time_so_the_slow_one_stands_out():
    m = M.build("tcp://x", PREV, CURR, 1000, M.History())
    fast, slow = m.consumers
    assert (fast.ack_rate, fast.mean_ms) == (600.0, 10.0)
    assert (slow.ack_rate, slow.mean_ms) == (500.0, 100.0)


def test_sort_keys_reorder_the_queues():
    assert [q.name for q in M.build("e", PREV, CURR, 1000, M.History(), "depth").queues] == ["jobs", "orders"]
    assert M.build("e", PREV, CURR, 1000, M.History()).sort == "rate"  # the busy ones first by default
    assert [q.name for q in M.build("e", PREV, CURR, 1000, M.History(), "name").queues] == ["jobs", "orders"]
    assert [q.name for q in M.build("e", PREV, CURR, 1000, M.History(), "latency").queues][0] == "jobs"


def test_the_first_frame_has_no_rates_yet():
    m = M.build("e", None, CURR, 0, M.History())
    assert all(q.in_rate == 0 for q in m.queues)


def test_depth_history_feeds_a_sparkline():
    h = M.History()
    for depth in (0, 50, 100):
        m = M.build("e", PREV, {**CURR, "queues": {"jobs": {**CURR["queues"]["jobs"], "depth": depth}}}, 1000, h)
    assert m.queues[0].depth_history == [0, 50, 100]
    assert sparkline([0, 50, 100]) == " ▄█"


def test_a_depth_that_did_not_move_is_an_empty_sparkline_not_a_full_one():
    assert sparkline([7] * 12) == " " * 12  # an idle queue holding 7: no trend (it drew ████ before)
    assert sparkline([0] * 5) == " " * 5
    assert sparkline([100, 101, 103, 100]) == " ▁▃ "  # from the minute's lowest, a step a message up to 8
    assert sparkline([0, 1000, 4000, 8000]) == " ▁▄█"  # beyond, an eighth of the range
    assert sparkline([]) == ""


def test_the_frame_matches_the_recorded_text():
    text = frame_text(M.build("tcp://127.0.0.1:7780", PREV, CURR, 1000, M.History()))
    if not GOLDEN.exists():  # first run writes it; review it, commit it
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_a_lost_server_shows_disconnected_with_the_last_figures():
    last = M.build("tcp://x", PREV, CURR, 1000, M.History())
    text = frame_text(M.disconnected("tcp://x", last, "ConnectionLost"))
    assert "disconnected, retrying (ConnectionLost)" in text and "jobs" in text


def test_the_oldest_waiting_message_of_the_first_queue_is_explained_below_the_queues():
    m = M.build("tcp://127.0.0.1:7780", PREV, CURR, 1000, M.History())
    target = M.oldest_to_explain(m)
    assert target is not None and target[0] == m.queues[0].name
    m.oldest_why = M.why_line(target[0], {"bookmark": target[1], "why": ["no consumer has credit", "3 ahead"]})
    text = frame_text(m)
    assert f"oldest waiting in {target[0]} (bookmark {target[1]}): no consumer has credit; 3 ahead" in text
    assert text.index("oldest waiting") < text.index("consumers")


def test_the_explained_line_says_how_earlier_deliveries_ended():
    doc = {"bookmark": 9, "why": ["waits for its retry: due in 900 ms"],
           "causes": {"cancelled": 0, "failed": 2, "lease_expired": 1, "consumer_gone": 0, "last_error": "KeyError('sku')",
                      "last_consumer": "w", "first_ms": 1, "last_ms": 2}}
    line = M.why_line("jobs", doc)
    assert line.endswith("earlier deliveries: 2 failed, 1 lease expired, last error \"KeyError('sku')\"")


def test_a_fair_queue_shows_the_tenants_holding_most_with_their_weights():
    import copy

    curr = copy.deepcopy(CURR)
    curr["queues"]["jobs"]["tenants"] = [{"tenant": "acme", "weight": 4, "held": 12000},
                                         {"tenant": "", "weight": 1, "held": 3}]
    m = M.build("tcp://x", PREV, curr, 1000, M.History())
    assert [(t.queue, [x["tenant"] for x in t.tenants]) for t in m.tenants] == [("jobs", ["acme", ""])]
    text = frame_text(m)
    assert "tenants (fair share)" in text
    assert "acme (12,000, w4), (none) (3, w1)" in text
    assert "tenants (fair share)" not in frame_text(M.build("tcp://x", PREV, CURR, 1000, M.History()))


def test_the_header_shows_standbys_and_what_confirmations_wait_for():
    import copy

    curr = copy.deepcopy(CURR)
    curr["server"]["replication"] = {"replicas_ack": 1, "held_confirmations": 0, "standbys": [
        {"name": "zq standby", "position": 990, "lag_records": 10, "heard_ms_ago": 100}]}
    assert "standbys: zq standby lag 10   confirmations wait for 1" in frame_text(M.build("tcp://x", PREV, curr, 1000,
                                                                                        M.History()))
    curr["server"]["replication"]["standbys"] = []
    assert "standbys: none connected   confirmations wait for 1" in frame_text(M.build("tcp://x", PREV, curr, 1000,
                                                                                      M.History()))
    assert "standbys" not in frame_text(M.build("tcp://x", PREV, CURR, 1000, M.History()))


def test_the_header_says_when_the_dispatcher_listed_only_its_busiest_queues():
    import copy

    curr = copy.deepcopy(CURR)
    listed = len(curr["queues"])
    curr["server"]["queues"] = 12_345  # STATS lists at most 1,000 queues: the busiest
    assert f"{listed:,} busiest of 12,345 queues" in frame_text(M.build("tcp://x", PREV, curr, 1000, M.History()))
    curr["server"]["queues"] = listed
    assert "busiest of" not in frame_text(M.build("tcp://x", PREV, curr, 1000, M.History()))


def test_the_header_shows_a_cluster_leaders_role_epoch_and_in_sync_set():
    import copy

    curr = copy.deepcopy(CURR)
    curr["server"]["replication"] = {"replicas_ack": 1, "held_confirmations": 0, "standbys": [
        {"name": "zq standby n2", "node": "n2", "position": 5, "lag_records": 3, "lag_ms": 1500, "in_sync": True,
         "heard_ms_ago": 1},
        {"name": "zq standby n3", "node": "n3", "position": 1, "lag_records": 7, "lag_ms": 9000, "in_sync": False,
         "heard_ms_ago": 1}],
        "cluster": {"role": "leader", "node": "n1", "epoch": 7, "isr": ["n1", "n2"], "serving": True}}
    text = frame_text(M.build("tcp://x", PREV, curr, 1000, M.History()))
    assert "cluster: leader n1  epoch 7   in sync: n1, n2" in text
    assert "n2 lag 3 / 1.5s" in text and "n3 lag 7 / 9.0s (out of sync)" in text
    curr["server"]["replication"]["cluster"]["serving"] = False
    assert "NOT SERVING (fenced)" in frame_text(M.build("tcp://x", PREV, curr, 1000, M.History()))


def test_numbers_are_compact_only_when_asked_and_never_lose_their_magnitude():
    assert [num(n) for n in (0, 999, 12_345, 1_234_567)] == ["0", "999", "12,345", "1,234,567"]
    assert [num(n, True) for n in (9_999, 12_345, 99_960, 456_000, 1_234_567, 7.8e12)] == \
        ["9,999", "12.3k", "100k", "456k", "1.2M", "7.8T"]


@pytest.mark.parametrize("width", [80, 100, 140])
def test_columns_are_chosen_by_width_and_no_header_or_number_is_cut(width):
    m = fleet_model()
    lines = frame_text(m, width, 24).splitlines()
    assert len(lines) <= 24 and all(len(line.rstrip()) <= width for line in lines)
    i, headers = table_at(lines, "queue")
    known = [c.header for c in QUEUE_COLUMNS]
    assert headers == [h for h in known if h in headers], f"unknown or cut headers: {headers}"
    rank = {c.header: c.rank for c in QUEUE_COLUMNS}
    dropped = set(known) - set(headers)
    assert all(rank[d] > rank[h] for d in dropped for h in headers), "the least important columns go first"
    assert {"queue", "depth", "leased", "in/s", "out/s", "1 min"} <= set(headers)
    _, consumer_headers = table_at(lines, "worker")
    assert {"worker", "queue", "acks/s"} <= set(consumer_headers)
    for line in lines:
        if not line.startswith(("+ ", "oldest waiting")):  # lists of names may be cut, nothing else
            assert "…" not in line, line
    jobs = dict(zip(headers, cells(lines[i + 2])))
    assert jobs["queue"] == "jobs", "the busy queue comes first"
    if width == 140:
        assert dropped == set() and (jobs["depth"], jobs["in/s"], jobs["out/s"]) == ("1,241,292", "12,345", "11,000")
    else:
        assert (jobs["depth"], jobs["in/s"], jobs["out/s"]) == ("1.2M", "12.3k", "11.0k")
    if width == 80:
        assert {"p50", "exp", "lost", "delay"} <= dropped


def test_at_80x24_the_busy_queue_leads_the_idle_ones_fold_into_a_line_and_the_consumers_show():
    m = fleet_model()
    m.oldest_why = M.why_line("webhooks", {"bookmark": 1, "why": ["no consumer is subscribed to the queue"]})
    lines = frame_text(m, 80, 24).splitlines()
    assert len(lines) == 24
    i, headers = table_at(lines, "queue")
    rows = []
    for line in lines[i + 2:]:
        if not line.strip() or line.startswith("+ "):
            break
        rows.append(line)
    assert cells(rows[0])[0] == "jobs"
    folded = next(line for line in lines if line.startswith("+ "))
    hidden = re.fullmatch(r"\+ (\d+) idle queues: (.*)", folded.rstrip())
    assert hidden is not None, folded
    assert int(hidden.group(1)) + len(rows) == 1 + len(IDLE)
    spark = lines[i].index("1 min")
    assert rows[0][spark:].strip(), "jobs deepened: its bar shows it"
    for row in rows[1:]:
        assert cells(row)[0] in IDLE and not row[spark:].strip(), f"an idle queue's 1 min bar is empty: {row!r}"
    c, _ = table_at(lines, "worker")
    assert [cells(line)[0] for line in lines[c + 2:c + 4]] == ["vm:4100 test-ack", "vm:4101 test-ack"]


def test_a_tall_terminal_lists_every_queue_with_blank_lines_as_before():
    lines = frame_text(fleet_model(), 140, 50).splitlines()
    assert all(any(cells(line)[0] == name for line in lines) for name in IDLE) and not any("idle" in x for x in lines)
    c = next(i for i, line in enumerate(lines) if line.startswith("consumers"))
    assert lines[c - 1].strip() == "" and lines[c + 1].strip() == ""  # the wide layout keeps its spacing


def test_sections_share_the_height_busy_queues_first_consumers_keep_rows():
    # sections: queues, consumers, groups, tenants; each costs 3 lines + rows + a "+ N more" line if cut
    assert allocate(40, [11, 2, 0, 0], [5, 2, 0, 0]) == [11, 2, None, None]
    assert allocate(18, [11, 2, 0, 0], [5, 2, 0, 0]) == [9, 2, None, None]
    assert allocate(18, [11, 2, 3, 1], [5, 2, 1, 1]) == [9, 2, None, None]  # groups, tenants give way first
    assert allocate(24, [11, 2, 3, 1], [5, 2, 1, 1]) == [6, 2, 1, 1]  # room for a line each: they keep it
    assert allocate(8, [11, 9, 0, 0], [5, 3, 0, 0]) == [0, 0, None, None]


def test_a_request_that_goes_unanswered_is_said_within_half_a_second():
    m = M.build("tcp://x", PREV, CURR, 1000, M.History())
    late = M.late_after(1.0)
    assert late <= 0.5
    fresh = M.current("tcp://x", m, 10.0, 10.9, None, 11.0, 1.0)  # asked 0.1 s ago
    assert fresh.connected
    quiet = M.current("tcp://x", m, 10.0, 11.0, None, 11.0 + late + 0.1, 1.0)
    assert not quiet.connected and f"no answer for {1.0 + late + 0.1:.1f}s" in frame_text(quiet)
    failed = M.current("tcp://x", m, 10.0, 11.0, "SessionLost", 11.2, 1.0)
    assert "disconnected, retrying (SessionLost): no answer for 1.2s" in frame_text(failed)
    assert "disconnected, retrying (connecting)" in frame_text(M.current("tcp://x", None, None, 1.0, None, 1.1, 1.0))


class QuietSource:
    """A Source whose server answers while ``answering`` is set, and goes quiet when not."""

    endpoint = "tcp://x"

    def __init__(self) -> None:
        self.answering = threading.Event()
        self.answering.set()

    def fetch(self, timeout: float) -> dict:
        if not self.answering.wait(timeout):
            raise TimeoutError
        return CURR

    def explain_oldest(self, m: M.TopModel, timeout: float) -> None:
        pass

    def close(self) -> None:
        pass


def poll(predicate, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_screen_does_not_wait_for_a_quiet_server_to_say_it_is_quiet():
    poller = Poller("tcp://x", 0.2)
    poller.src = QuietSource()  # type: ignore[assignment]
    poller.start()
    try:
        poll(lambda: poller.frame(time.monotonic()).connected, 5)
        poller.src.answering.clear()  # type: ignore[attr-defined]
        quiet_since = time.monotonic()
        poll(lambda: not poller.frame(time.monotonic()).connected, 5)
        assert time.monotonic() - quiet_since < 0.2 + M.late_after(0.2) + 0.5
        assert poller.frame(time.monotonic()).silent_s is not None
        poller.src.answering.set()  # type: ignore[attr-defined]
        poll(lambda: poller.frame(time.monotonic()).connected, 5)
        poller.sort = "name"
        assert poller.frame(time.monotonic()).sort == "name"  # a key re-sorts at once
    finally:
        poller.close()


def test_a_long_endpoint_is_cut_in_the_middle_so_the_state_stays_on_the_first_line():
    m = M.build("ipc:///tmp/pytest-of-someone/pytest-1234/test_zq_top_at_80x24_shows_the0/zq.sock", PREV, CURR, 1000,
                M.History())
    first = frame_text(m, 80, 24).splitlines()[1]
    assert "zq top ipc:///tmp/" in first and "/zq.sock" in first and "connected" in first
    quiet = frame_text(M.disconnected(m.endpoint, m, "SessionLost", 2.0), 80, 24).splitlines()
    assert "no answer for 2.0s" in "".join(quiet[1:3])


@pytest.mark.parametrize("width", [80, 100, 140])
def test_the_groups_and_tenants_headers_are_never_cut(width):
    m = M.build("tcp://127.0.0.1:7780", PREV, CURR, 1000, M.History())
    assert m.groups, "the fixture has a queue with groups"
    row = m.groups[0]
    row.busiest = [{"group": f"customer-{i:04d}-with-a-long-name", "pending": 10 + i, "in_flight": 1,
                    "owner": f"worker-{i}", "holder": f"worker-{i}"} for i in range(12)]  # a long list to give way
    text = frame_text(m, width=width, height=30)  # (fitted to the height: one line a row)
    header = next(line for line in text.splitlines() if "busiest (pending, holder)" in line)
    assert "…" not in header and "in flight" in header, header
