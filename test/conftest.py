"""Fixtures shared by the hororun tests (test_hororun*.py): the launcher package (top-level
runner/) made importable as horo_runner, and a child environment without HORO_ settings; the order
in which the files run, and the tests that run while no other test does."""
import fcntl
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def runner_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("hrpath")
    os.symlink(os.path.join(ROOT, "runner"), path / "horo_runner")
    sys.path.insert(0, str(path))
    yield str(path)
    sys.path.remove(str(path))


@pytest.fixture(scope="session")
def child_env(runner_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (runner_path, ROOT, env.get("PYTHONPATH")) if p)
    for name in [n for n in env if n.startswith(("HORO_", "HOROVOD_"))]:
        del env[name]
    return env


# The files that take longest, longest first (seconds of one file run alone on CI's 2 cores, from
# --durations): the README's command runs two files at a time (pytest-xdist, --dist loadfile), and
# the suite ends soonest when the long ones start first. By default xdist starts the files with the
# most tests first, which left the TensorFlow files (two or three long tests each) running together
# at the end. A file not listed runs after these, in the usual order.
LONGEST_FIRST = ["test_torch_errors.py",   # 178
                 "test_examples.py",       # 159, before --help shared a process per framework
                 "test_cpp_units.py",      # 134
                 "test_tf_ops.py",         # 120
                 "test_bootstrap.py",      # 105
                 "test_tf_keras.py",       # 97
                 "test_hororun.py",        # 67
                 "test_tf_examples.py",    # 59
                 "test_torch_ops.py",      # 53
                 "test_torch_optimizer.py",  # 46
                 "test_torch_ddp.py"]      # 45


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: a test whose measurement another test's load spoils (rounds or "
                                       "background passes per call); it runs while no other test does")
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # xdist follows the collection order below


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.path)), len(rank)))  # stable


@pytest.fixture(autouse=True)
def _alone_or_beside_others(request, tmp_path_factory):
    """Under xdist, every test holds a shared lock on a file that all workers see, and a test marked
    alone an exclusive one: it waits for the other worker's test to end, and that worker's next test
    waits for it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    exclusive = request.node.get_closest_marker("alone") is not None
    # Each worker's base folder is <the run's base>/popen-gw<N>: the parent is common to all.
    with open(tmp_path_factory.getbasetemp().parent / "alone.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield  # closing the file releases the lock
