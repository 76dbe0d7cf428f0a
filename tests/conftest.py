import pytest


def pytest_addoption(parser):
    parser.addoption("--zq-seed", type=int, default=None, help="run the simulation for this one seed")
    parser.addoption("--zq-seeds", type=int, default=32, help="how many simulation seeds to run")
    parser.addoption("--zq-steps", type=int, default=2000, help="fault-phase steps per simulation seed")


def pytest_generate_tests(metafunc):
    if "sim_seed" in metafunc.fixturenames:
        one = metafunc.config.getoption("--zq-seed")
        seeds = [one] if one is not None else list(range(1, metafunc.config.getoption("--zq-seeds") + 1))
        metafunc.parametrize("sim_seed", seeds, ids=[f"seed={s}" for s in seeds])


@pytest.fixture
def sim_steps(request):
    return request.config.getoption("--zq-steps")


# --- Tests that replace methods of the engine's classes (planted bugs, a reference
# path): compiled classes do not allow it. With the compiled core they run once, all
# together, in a child pytest on the interpreted core (ZQ_PURE=1); each reports that
# child's verdict, so the suite is one command on either build.

_interpreted_verdicts: dict[str, str] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "interpreted_core: replaces engine methods; runs on the interpreted core")


def _run_on_interpreted_core(items) -> dict[str, str]:  # type: ignore[no-untyped-def]
    import os
    import re
    import subprocess
    import sys

    ids = [item.nodeid for item in items if item.get_closest_marker("interpreted_core")]
    env = {**os.environ, "ZQ_PURE": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *ids],
                          cwd=str(items[0].config.rootpath), env=env, capture_output=True, text=True, timeout=900)
    verdicts = {}
    for line in done.stdout.splitlines():
        m = re.match(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+)", line)
        if m:
            verdicts[m.group(2)] = m.group(1)
    verdicts["__output__"] = done.stdout[-6000:] + done.stderr[-2000:]
    return verdicts


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if pyfuncitem.get_closest_marker("interpreted_core") is None:
        return None
    from zq import build

    if build.BUILD != "compiled":
        return None  # interpreted here: run as usual
    if not _interpreted_verdicts:
        _interpreted_verdicts.update(_run_on_interpreted_core(pyfuncitem.session.items))
    verdict = _interpreted_verdicts.get(pyfuncitem.nodeid)
    if verdict != "PASSED":
        pytest.fail(f"on the interpreted core (ZQ_PURE=1) this test gave {verdict}:\n"
                    f"{_interpreted_verdicts['__output__']}", pytrace=False)
    return True
