"""The pure layers of `zq top`: model from two snapshots, view recorded as text."""

from pathlib import Path

from rich.console import Console

from zq.top import model as M
from zq.top.view import render, sparkline

from .fixtures import CURR, PREV

GOLDEN = Path(__file__).with_name("golden_frame.txt")


def frame_text(m: M.TopModel) -> str:
    console = Console(width=110, record=True, file=open("/dev/null", "w"), color_system=None)
    console.print(render(m))
    return console.export_text()


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
