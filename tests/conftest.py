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
