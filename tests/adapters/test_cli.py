"""Every CLI command, run as a user runs it: a real `zq` process against a real server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zq.client import Client

from .support import ROOT, ServerProcess, env, wait_until


def zq(*args: str, input: str | None = None, timeout: float = 60, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zq.cli", *args], input=input, capture_output=True, text=True,
        timeout=timeout, env={**env(), **extra_env}, cwd=ROOT,
    )


@pytest.fixture
def server(tmp_path):
    s = ServerProcess(tmp_path).start()
    yield s
    s.terminate()


def test_help_explains_every_command():
    out = zq("--help").stdout
    for cmd in ("serve", "publish", "consume", "stats", "peek", "demo"):
        assert cmd in out
    assert "--exec" in zq("consume", "--help").stdout


def test_publish_then_consume_delivers_it_as_a_json_line(server):
    pub = zq("publish", "jobs", "hello", "--endpoint", server.endpoint, "--group", "g1", "--header", "k=v")
    assert pub.returncode == 0, pub.stderr
    bookmark = int(pub.stdout)
    out = zq("consume", "jobs", "--count", "1", ZQ_ENDPOINT=server.endpoint)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc == {"bookmark": bookmark, "topic": "jobs", "headers": {"k": "v", "group": "g1"}, "group": "g1",
                   "deliveries": 1, "data": "hello"}


def test_publish_reads_stdin_lines_and_consume_stops_when_idle(server):
    pub = zq("publish", "lines", "--endpoint", server.endpoint, input="a\nb\nc\n")
    assert [int(x) for x in pub.stdout.split()] == sorted(int(x) for x in pub.stdout.split())
    assert len(pub.stdout.split()) == 3
    out = zq("consume", "lines", "--endpoint", server.endpoint, "--timeout", "1")
    assert [json.loads(line)["data"] for line in out.stdout.splitlines()] == ["a", "b", "c"]


def test_binary_payloads_come_out_as_base64(server):
    with Client(server.endpoint) as c:
        c.publish("bin", b"\xff\x00\xfe")
    doc = json.loads(zq("consume", "bin", "--endpoint", server.endpoint, "--count", "1").stdout)
    assert (doc["data"], doc["encoding"]) == ("/wD+", "base64")


def test_exec_acks_on_exit_zero_and_cancels_otherwise(server, tmp_path):
    out_file = tmp_path / "out.txt"
    with Client(server.endpoint) as c:
        c.publish_many("work", ["one", "two", "three", "fail"])
    script = f'read -r line; if [ "$line" = fail ] && [ "$ZQ_DELIVERIES" = 1 ]; then exit 3; fi; echo "$line $ZQ_DELIVERIES" >> {out_file}'
    run = zq("consume", "work", "--endpoint", server.endpoint, "--exec", script, "--concurrency", "2", "--count", "5")
    assert run.returncode == 0, run.stderr
    lines = sorted(out_file.read_text().split("\n")[:-1])
    assert lines == ["fail 2", "one 1", "three 1", "two 1"]
    with Client(server.endpoint) as c:
        st = c.stats()["queues"]["work"]
    assert (st["acked"], st["cancelled"], st["depth"]) == (4, 1, 0)


def test_exec_says_when_a_command_outlived_its_lease(server, tmp_path):
    """The command's work succeeded, but the lease had ended and the message went out
    again: the ack is fenced off (not applied to the new delivery) and the operator is
    told the work runs again."""
    ep = ("--endpoint", server.endpoint)
    assert zq("queue", "create", "slow", "--lease", "2s", *ep).returncode == 0
    assert zq("publish", "slow", "job", *ep).returncode == 0
    script = 'if [ "$ZQ_DELIVERIES" = 1 ]; then sleep 2.5; fi; cat > /dev/null'  # the first try outlives its lease
    run = zq("consume", "slow", *ep, "--exec", script, "--count", "2")
    assert run.returncode == 0, run.stderr
    assert "after its lease had ended" in run.stderr and "delivery 1" in run.stderr, run.stderr
    with Client(server.endpoint) as c:
        st = c.stats()["queues"]["slow"]
    assert (st["acked"], st["lost"], st["depth"], st["leased"]) == (1, 1, 0, 0)


def test_stats_and_peek_show_the_queue(server):
    with Client(server.endpoint) as c:
        c.publish_many("shown", ["x", "y"])
    st = json.loads(zq("stats", "--json", "--endpoint", server.endpoint).stdout)
    assert st["queues"]["shown"]["depth"] == 2
    table = zq("stats", "--endpoint", server.endpoint).stdout
    assert "shown" in table and "depth" in table
    peeked = [json.loads(line) for line in zq("peek", "shown", "--endpoint", server.endpoint).stdout.splitlines()]
    assert [p["data"] for p in peeked] == ["x", "y"]
    assert json.loads(zq("stats", "--json", "--endpoint", server.endpoint).stdout)["queues"]["shown"]["depth"] == 2


def test_client_commands_without_a_server_fail_clearly(tmp_path):
    run = zq("stats", "--endpoint", f"ipc://{tmp_path}/nobody.sock", timeout=30)
    assert run.returncode == 3 and "zq serve" in run.stderr


def test_filters_queries_claims_and_replay_from_the_command_line(server):
    ep = ("--endpoint", server.endpoint)
    orders = "\n".join(json.dumps({"region": r, "qty": q}) for r, q in [("eu", 5), ("us", 1), ("eu", 20)])
    assert zq("publish", "orders", *ep, input=orders + "\n").returncode == 0
    run = zq("query", "orders", *ep, "--group-by", "/region", "--agg", "count", "--agg", "sum(/qty)", "--json")
    assert [json.loads(x) for x in run.stdout.splitlines()] == [
        {"/region": "eu", "count": 2, "sum(/qty)": 25}, {"/region": "us", "count": 1, "sum(/qty)": 1}]
    run = zq("query", "orders", *ep, "--group-by", "/region", "--agg", "count", "--agg", "sum(/qty)")
    assert [line.split() for line in run.stdout.splitlines()] == [  # a pipe: plain aligned text
        ["/region", "count", "sum(/qty)"], ["eu", "2", "25"], ["us", "1", "1"]]
    run = zq("consume", "orders", *ep, "--filter", "/qty > 1", "--count", "2", "--timeout", "5")
    assert [json.loads(json.loads(x)["data"])["qty"] for x in run.stdout.splitlines()] == [5, 20]
    run = zq("consume", "orders", *ep, "--filter", "/qty >", "--count", "1")
    assert run.returncode == 2 and "position" in run.stderr
    run = zq("claim", "orders", *ep, "--limit", "5")
    assert run.returncode == 0 and [json.loads(json.loads(x)["data"])["qty"] for x in run.stdout.splitlines()] == [1]
    assert zq("claim", "orders", *ep, "--wait", "0.2").returncode == 1  # nothing left
    for bad, words in (("--wait", "61"), "claim wait must be at most 60 s"), (("--lease", "0"), "claim lease"):
        run = zq("claim", "orders", *ep, *bad)
        assert run.returncode == 2 and words in run.stderr and "Traceback" not in run.stderr, run.stderr
    run = zq("replay", "orders", *ep, "--from", "0")
    assert len(run.stdout.splitlines()) == 3  # the journal still has all three
    first = json.loads(run.stdout.splitlines()[0])["bookmark"]
    run = zq("replay", "orders", *ep, "--from", str(first + 1), "--filter", "/region = 'eu'")
    assert [json.loads(json.loads(x)["data"])["qty"] for x in run.stdout.splitlines()] == [20]
    assert len(zq("replay", "orders", *ep, "--from", "1h").stdout.splitlines()) == 3


def test_serve_with_a_bad_config_names_the_key_and_exits(tmp_path):
    bad = tmp_path / "zq.toml"
    bad.write_text('[[queue]]\nname = "jobs"\nlease = "soon"\n')
    run = zq("serve", "--config", str(bad), "--data", str(tmp_path / "d"), timeout=30)
    assert run.returncode == 2 and "queue[0].lease" in run.stderr
    bad.write_text('[server]\ndurabilty = "fsync"\n')
    run = zq("serve", "--config", str(bad), "--data", str(tmp_path / "d"), timeout=30)
    assert run.returncode == 2 and "durabilty" in run.stderr


def test_serve_uses_a_config_with_groups_and_dead_letters(tmp_path):
    cfg = tmp_path / "zq.toml"
    cfg.write_text(
        '[[queue]]\nname = "orders"\nmax_cancels = 1\ndead_letter = "orders.failed"\ngroup_header = "customer"\n'
    )
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with Client(server.endpoint) as c:
            c.publish("orders", "o1", headers={"customer": "c1"})
            with c.subscribe("orders") as sub:
                sub.get(5).cancel()
            wait_until(lambda: c.stats()["queues"].get("orders.failed", {}).get("depth") == 1, what="dead letter")
            dead = c.peek("orders.failed")[0]
        assert dead["headers"]["zq.reason"] == "max-cancels" and dead["data"] == b"o1"
    finally:
        err = server.terminate()
    assert "security off (plaintext" in err, err[-2000:]  # said at start, on the serving line


def test_demo_runs_a_small_fleet_and_prints_a_summary():
    run = zq("demo", "--messages", "600", "--workers", "2", timeout=120)
    assert run.returncode == 0, run.stderr
    assert "summary" in run.stdout and "acked 600" in run.stdout and "worker-2" in run.stdout
    assert "on purpose" in run.stdout  # redeliveries are explained, not a surprise


def test_management_and_journal_tools_from_the_command_line(server, tmp_path):
    ep = ("--endpoint", server.endpoint)
    run = zq("queue", "create", "work", "--lease", "5s", "--group-header", "customer", "--json", *ep)
    assert run.returncode == 0 and json.loads(run.stdout)["lease_ms"] == 5000, run.stderr
    lines = "\n".join(json.dumps({"n": i}) for i in range(4))
    assert zq("publish", "work", *ep, "--header", "customer=c1", input=lines + "\n").returncode == 0
    run = zq("groups", "work", *ep, "--json")
    assert json.loads(run.stdout) == {"group": "c1", "pending": 4, "in_flight": 0, "owner": None, "holder": None}
    run = zq("purge", "work", *ep, "--filter", "/n = 0")
    assert run.returncode == 2 and "--yes" in run.stderr  # no terminal: destructive needs --yes
    assert zq("purge", "work", *ep, "--filter", "/n = 0", "--yes").stdout.strip() == "purged 1"
    assert zq("ack", "work", *ep, "--filter", "/n = 1", "--yes").stdout.strip() == "acknowledged 1"
    assert zq("move", "work", "elsewhere", *ep, "--filter", "/n = 2", "--yes").stdout.strip() == "moved 1"
    assert zq("redrive", "work", *ep, "--yes").stdout.strip() == "redriven 0"  # not dead letters: no zq.topic
    assert zq("queue", "delete", "work", *ep, "--yes").stdout.strip() == "deleted work (1 messages)"
    data = str(tmp_path / "journal")
    info = json.loads(zq("journal", "info", "--data", data).stdout)  # beside the running server
    assert info["messages"] == 5 and info["format"] == 2 and info["newest_message"] >= info["oldest_message"]
    run = zq("journal", "verify", "--data", data)
    assert run.returncode == 0 and json.loads(run.stdout)["ok"] is True
    out = tmp_path / "export"
    assert json.loads(zq("journal", "export", str(out), "--data", data).stdout)["messages"] == 5
    rows = [json.loads(x) for x in (out / "messages.jsonl").read_text().splitlines()]
    assert [r["topic"] for r in rows] == ["work"] * 4 + ["elsewhere"]
    assert any(json.loads(x)["reason"] == "purged" for x in (out / "events.jsonl").read_text().splitlines())
    # --from as replay takes it: "now" exports nothing, a duration ago everything recent
    assert json.loads(zq("journal", "export", str(tmp_path / "e2"), "-d", data, "--from", "now").stdout)["messages"] == 0
    assert json.loads(zq("journal", "export", str(tmp_path / "e3"), "-d", data, "--from", "1h").stdout)["messages"] == 5
    assert zq("journal", "info", "--data", str(tmp_path / "nothing")).returncode == 2


def test_queue_kinds_from_the_command_line(server):
    ep = ("--endpoint", server.endpoint)
    created = json.loads(zq("queue", "create", "urgent", "--priority", "/sev", "--json", *ep).stdout)
    assert created["priority"] == "/sev"
    assert zq("publish", "urgent", *ep, input='{"sev": 1}\n{"sev": 9}\n{"sev": 5}\n').returncode == 0
    run = zq("peek", "urgent", *ep)
    assert [json.loads(line)["data"] for line in run.stdout.splitlines()] == ['{"sev": 9}', '{"sev": 5}', '{"sev": 1}']
    assert json.loads(zq("queue", "create", "deep", "--target-queue-depth", "2", "--json", *ep).stdout)["target_queue_depth"] == 2
    assert zq("publish", "deep", *ep, input="a\nb\nc\n").returncode == 0
    table = zq("stats", *ep).stdout
    assert "(tqd=2)" in table and "2+1" in table, table  # depth 2, one more in the journal only
    run = zq("queue", "create", "bad", "--priority", "p", "--sort-key", "k", *ep)
    assert run.returncode != 0 and "not both" in run.stderr


def test_version_and_short_help():
    from importlib.metadata import version

    for flag in ("--version", "-V"):
        run = zq(flag)
        assert run.returncode == 0 and run.stdout.startswith(f"zq {version('zq')} (core "), run
    for args in (("-h",), ("publish", "-h"), ("journal", "-h")):
        run = zq(*args)
        assert run.returncode == 0 and "Usage:" in run.stdout, (args, run.stderr)


def test_consume_says_what_a_failed_command_means_and_when_it_made_a_queue(server, tmp_path):
    assert zq("publish", "work", "one", ZQ_ENDPOINT=server.endpoint).returncode == 0
    run = zq("consume", "work", "-n", "1", "-x", "exit 3", ZQ_ENDPOINT=server.endpoint)
    assert run.returncode == 0, run.stderr
    assert ("the command exited 3 for bookmark 1 (delivery 1): cancelled; it will be delivered again after the "
            "queue's backoff (1s, 5s, 30s, 60s, ...), up to 20 deliveries, then dead-lettered to 'work.dead'") in run.stderr
    run = zq("consume", "wrok", "-t", "0.5", ZQ_ENDPOINT=server.endpoint)
    assert run.returncode == 0 and "no queue 'wrok' yet: waiting for messages" in run.stderr
    assert 'wrok' not in zq("queue", "list", ZQ_ENDPOINT=server.endpoint).stdout  # the typo left nothing behind
    run = zq("consume", "work", "-n", "1", ZQ_ENDPOINT=server.endpoint)  # it is delivered again
    assert run.returncode == 0 and "no queue" not in run.stderr
    again = json.loads(run.stdout)
    assert again["bookmark"] == 1 and again["deliveries"] >= 2


def test_a_command_with_no_dispatcher_there_says_so_in_one_line(tmp_path):
    run = zq("stats", "-e", f"ipc://{tmp_path}/nobody.sock", timeout=60)
    assert run.returncode == 3
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "is `zq serve` running?" in lines[0], run.stderr  # no "reconnecting" first


def test_every_short_flag_means_one_thing_in_every_command():
    """`-n` is --limit wherever it appears, `-g` --group, `-w` --wait, `-d` --data...:
    a short flag learnt on one command means the same on every other."""
    import typer

    from zq.cli import app

    meaning: dict[str, dict[str, list[str]]] = {}

    def walk(command, path):  # type: ignore[no-untyped-def]
        for p in command.params:
            opts = [*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())]
            longs = [o for o in opts if o.startswith("--")]
            for short in (o for o in opts if o.startswith("-") and not o.startswith("--")):
                meaning.setdefault(short, {}).setdefault(longs[0] if longs else short, []).append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "zq")
    assert len(meaning) > 10
    clashes = {s: m for s, m in meaning.items() if len(m) > 1}
    assert not clashes, clashes
    assert set(meaning["-n"]) == {"--limit"} and set(meaning["-d"]) == {"--data"} and len(meaning["-d"]["--data"]) >= 4


def test_help_names_what_each_option_takes_in_words_and_every_option_says_what_it_does():
    """`--lease DURATION`, `zq purge QUEUE`: no `<str>`, `<bool>` or `{queue}` anywhere."""
    from zq.cli.app import command

    missing, labels = [], {}

    def walk(cmd, path):  # type: ignore[no-untyped-def]
        for p in cmd.params:
            labels[f"{path} {p.name}"] = p.metavar
            if not p.help:
                missing.append(f"{path} {p.name}")
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(command(), "zq")
    assert not missing, missing
    assert labels["zq queue create lease"] == "DURATION" and labels["zq purge queue"] == "QUEUE"
    assert labels["zq consume timeout"] == "SECONDS" and labels["zq purge yes"] == ""
    for args in (("purge", "-h"), ("move", "-h"), ("ack", "-h"), ("queue", "create", "-h"), ("publish", "-h"),
                 ("journal", "export", "-h"), ("-h",)):
        out = zq(*args).stdout
        assert "Usage: zq" in out and not any(t in out for t in ("<str>", "<int>", "<bool>", "<float>", "list[", "{")), out
    out = zq("purge", "-h").stdout
    assert "Usage: zq purge [OPTIONS] QUEUE" in out and "--filter EXPR" in out and "--yes " in out
    assert "(env ZQ_ENDPOINT" in out  # bracketed words are text, not markup that vanishes


def test_queue_list_create_with_a_short_confirmation_and_the_barrier_and_browse_kinds(server):
    ep = ("--endpoint", server.endpoint)
    run = zq("queue", "create", "eod", "--barrier", "kind = 'close'", "--lease", "5s", *ep)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("created queue 'eod': topics eod, at-least-once") and "lease 5s" in run.stdout
    assert "barrier kind = 'close'" in run.stdout and "{" not in run.stdout
    assert "browse-only" in zq("queue", "create", "feed", "--browse-only", *ep).stdout
    settings = {q["name"]: q for q in json.loads(zq("queue", "list", "--json", *ep).stdout)}
    assert settings["eod"]["barrier"] == "kind = 'close'" and settings["feed"]["browse_only"] is True
    assert zq("publish", "feed", "x", *ep).returncode == 0
    lines = zq("queue", "list", *ep).stdout.splitlines()
    assert lines[0].split() == ["queue", "kind", "topics", "semantics", "depth", "consumers"]
    assert lines[1].split() == ["eod", "barrier", "eod", "at-least-once", "0", "0"]
    assert lines[2].split() == ["feed", "browse", "feed", "at-least-once", "1", "0"]


def test_stats_never_cuts_a_name_or_a_number_and_is_plain_text_in_a_pipe(server):
    from rich.console import Console

    from zq.cli.views import fitted_width, grid, stats_rows

    long_name = "settlement-instructions-for-the-eu-desk." + "x" * 40
    with Client(server.endpoint) as c:
        c.publish_many(long_name, ["m"] * 3)
        st = c.stats()
    out = zq("stats", "--endpoint", server.endpoint).stdout  # a pipe: aligned text, no box characters
    row = next(line for line in out.splitlines() if line.startswith(long_name))
    assert row.split()[:5] == [long_name, "3", "0", "0", "3"] and not any(ch in out for ch in "─│━")  # depth delay leased pub
    assert "cons: consumers" in out
    st["queues"][long_name]["published"] = 12_345_678_901  # a terminal of 60 columns: numbers stay whole
    table = stats_rows(st)
    console = Console(width=fitted_width(table[1], table[2], 60), record=True, file=open("/dev/null", "w"),
                      color_system=None)
    console.print(grid(*table))
    text = console.export_text()
    assert "12345678901" in text and "".join(text.split()).count(long_name) == 1


def test_publishing_to_a_name_no_queue_covers_says_it_made_the_queue(server):
    ep = ("--endpoint", server.endpoint)
    run = zq("publish", "jbos", "typo", *ep)
    assert run.returncode == 0 and "no queue covered 'jbos': created queue 'jbos'" in run.stderr
    run = zq("publish", "jbos", "again", *ep)
    assert run.returncode == 0 and run.stderr == ""
