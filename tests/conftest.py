import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption("--zq-seed", type=int, default=None, help="run the simulation for this one seed")
    parser.addoption("--zq-seeds", type=int, default=32, help="how many simulation seeds to run")
    parser.addoption("--zq-steps", type=int, default=2000, help="fault-phase steps per simulation seed")
    parser.addoption("--zq-list-slow", type=float, default=None, metavar="SECONDS",
                     help="after the run, list the tests not marked slow that took over SECONDS (setup, call "
                          "and teardown together) and the single tests listed in tests/slow_tests.txt that "
                          "took less: how that list is refreshed")


def pytest_generate_tests(metafunc):
    if "sim_seed" in metafunc.fixturenames:
        one = metafunc.config.getoption("--zq-seed")
        seeds = [one] if one is not None else list(range(1, metafunc.config.getoption("--zq-seeds") + 1))
        metafunc.parametrize("sim_seed", seeds, ids=[f"seed={s}" for s in seeds])


@pytest.fixture(autouse=True)
def _no_server_outlives_its_test():
    """SIGKILL every `zq serve` (tests/adapters/support.ServerProcess) this test started
    and left running: a test that fails before its own stop must not leave a dispatcher
    holding a core for the rest of the run. Those a module's fixture started stay."""
    from tests.adapters.support import ServerProcess

    before = len(ServerProcess.started)
    yield
    for server in ServerProcess.started[before:]:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
    del ServerProcess.started[before:]


@pytest.fixture
def sim_steps(request):
    return request.config.getoption("--zq-steps")


# --- Tiers. `python -m pytest -m "not slow"` is the quick tier for the edit-test loop
# (under 2 minutes on a 2-core machine, and every room still in it: the engine, the
# journal, the wire, a real-socket round trip per client kind, config, CLI parsing,
# the layout); plain `python -m pytest` runs everything, as CI does. Tests are marked
# slow here rather than in their files: tests/slow_tests.txt lists the rooms, modules
# and single tests that are slow (how it was measured and how to refresh it is at its
# top).

SLOW_LIST = Path(__file__).with_name("slow_tests.txt")
_slow_key = pytest.StashKey[set]()
_durations: dict[str, float] = {}


def _slow_entries() -> list[str]:
    lines = (line.split(" #")[0].strip() for line in SLOW_LIST.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _listed(nodeid: str, entry: str) -> bool:
    """Does this entry of slow_tests.txt (a directory ending in /, a module, a test,
    a class) cover this test? A test entry covers each of its parameters."""
    if entry.endswith("/"):
        return nodeid.startswith(entry)
    return nodeid == entry or nodeid.startswith((entry + "::", entry + "["))


def pytest_collection_modifyitems(config, items):
    entries = _slow_entries()
    slow = set()
    for item in items:
        if any(_listed(item.nodeid, e) for e in entries):
            item.add_marker(pytest.mark.slow)
            slow.add(item.nodeid)
    config.stash[_slow_key] = slow


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if _child_reports is not None:
        _child_reports.append(report)


def pytest_terminal_summary(terminalreporter, config):
    limit = config.getoption("--zq-list-slow")
    if limit is None:
        return
    slow = config.stash.get(_slow_key, set())
    singles = [e for e in _slow_entries() if "::" in e]
    add = sorted((t, n) for n, t in _durations.items() if n not in slow and t > limit)
    drop, stale = [], []
    for e in singles:
        ran = [t for n, t in _durations.items() if _listed(n, e)]
        if not ran:
            stale.append(e)
        elif max(ran) <= limit:
            drop.append((max(ran), e))
    terminalreporter.section(f"slow_tests.txt against {limit:g} s")
    terminalreporter.write_line(f"not marked slow, over {limit:g} s (add to tests/slow_tests.txt):")
    for t, n in reversed(add):
        terminalreporter.write_line(f"{n}  # {t:.2f} s")
    terminalreporter.write_line(f"listed one by one, every run under {limit:g} s (candidates to drop):")
    for t, e in sorted(drop):
        terminalreporter.write_line(f"{e}  # {t:.2f} s")
    terminalreporter.write_line("listed one by one, not run this time (renamed or gone, if the whole suite ran):")
    for e in stale:
        terminalreporter.write_line(e)


# --- Tests that replace methods of the engine's classes (planted bugs, a reference
# path): compiled classes do not allow it. With the compiled core they run in one child
# pytest on the interpreted core (ZQ_PURE=1), started at the first such test and then
# driven test by test: each test here asks the child to run its twin, waits for it, and
# reports the child's verdict. So each test's time is its twin's own (the first one also
# bears the child's start-up), and the suite is one command on either build.

_CHILD = "ZQ_INTERPRETED_CHILD"  # set for the child: "ASK_FD,ANSWER_FD", the two pipes to the parent
_child_key = pytest.StashKey[tuple]()
_child_reports: list | None = None  # in the child: the reports of the test it is running
_interpreted: dict[str, "_InterpretedCore"] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "interpreted_core: replaces engine methods; runs on the interpreted core")
    spec = os.environ.pop(_CHILD, None)  # (not passed on to what the child's tests start)
    if spec:
        config.stash[_child_key] = tuple(int(fd) for fd in spec.split(","))


class _InterpretedCore:
    """The parent's end: a child pytest that collected the interpreted-core tests and
    runs one whenever asked (its node id on one pipe; a JSON verdict back on the other)."""

    def __init__(self, session) -> None:
        ids = [item.nodeid for item in session.items if item.get_closest_marker("interpreted_core")]
        ask_r, self.ask = os.pipe()
        self.answers, answer_w = os.pipe()
        self.log = tempfile.TemporaryFile()
        self.pending = b""
        env = {**os.environ, "ZQ_PURE": "1", _CHILD: f"{ask_r},{answer_w}"}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *ids],
                cwd=str(session.config.rootpath), env=env, pass_fds=(ask_r, answer_w),
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        finally:
            os.close(ask_r)
            os.close(answer_w)
        self.closed = False

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-6000:]

    def exit(self) -> str:
        try:
            return f"exit code {self.proc.wait(30)}"
        except subprocess.TimeoutExpired:
            return "still running"

    def run(self, nodeid: str, timeout: float = 600.0) -> dict:
        if self.closed:
            return {"outcome": "not run", "text": "the child pytest was stopped earlier in this session"}
        try:
            os.write(self.ask, nodeid.encode() + b"\n")
        except BrokenPipeError:
            return {"outcome": "not run", "text": f"the child pytest has ended ({self.exit()}):\n" + self.output()}
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.answers], [], [], left)[0]:
                text = f"no verdict within {timeout:g} s (child killed):\n" + self.output()
                self.close(kill=True)
                return {"outcome": "timed out", "text": text}
            chunk = os.read(self.answers, 65536)
            if not chunk:
                return {"outcome": "not run",
                        "text": f"the child pytest ended without a verdict ({self.exit()}):\n" + self.output()}
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def close(self, kill: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        os.close(self.ask)  # the end of the child's loop
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.answers)
        self.log.close()


def _verdict(reports) -> dict:
    failed = [r for r in reports if r.failed]
    if failed:
        return {"outcome": "failed", "text": "\n".join(f"({r.when}) {r.longreprtext}" for r in failed)}
    skipped = [r for r in reports if r.skipped]
    if skipped:
        longrepr = skipped[0].longrepr
        return {"outcome": "skipped", "text": longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)}
    if not any(r.when == "call" and r.passed for r in reports):
        return {"outcome": "not run", "text": "the child reported no call"}
    return {"outcome": "passed", "text": ""}


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """In the child: run the tests the parent asks for, one at a time, until it closes."""
    global _child_reports
    fds = session.config.stash.get(_child_key, None)
    if fds is None:
        return None
    items = {item.nodeid: item for item in session.items}
    with os.fdopen(fds[0], "rb") as asks, os.fdopen(fds[1], "wb", buffering=0) as answers:
        for line in asks:
            nodeid = line.decode().strip()
            item = items.get(nodeid)
            if item is None:
                verdict = {"outcome": "not run", "text": f"the child pytest did not collect {nodeid}"}
            else:
                _child_reports = []
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=None)
                verdict, _child_reports = _verdict(_child_reports), None
            answers.write(json.dumps(verdict).encode() + b"\n")
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if pyfuncitem.get_closest_marker("interpreted_core") is None:
        return None
    from zq import build

    if build.BUILD != "compiled":
        return None  # interpreted here (or this is the child): run as usual
    if "child" not in _interpreted:
        _interpreted["child"] = _InterpretedCore(pyfuncitem.session)
    verdict = _interpreted["child"].run(pyfuncitem.nodeid)
    if verdict["outcome"] == "passed":
        return True
    if verdict["outcome"] == "skipped":
        pytest.skip(f"on the interpreted core (ZQ_PURE=1): {verdict['text']}")
    pytest.fail(f"on the interpreted core (ZQ_PURE=1): {verdict['outcome']}\n{verdict['text']}", pytrace=False)


def pytest_sessionfinish(session):
    child = _interpreted.pop("child", None)
    if child is not None:
        child.close()
