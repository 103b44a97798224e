"""Fixtures shared by the hororun tests (test_hororun*.py): the launcher package (top-level
runner/) made importable as horo_runner, and a child environment without HORO_ settings; and the
order in which the files run."""
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
                 "test_examples.py",       # 159 (before --help shared a process per framework: 44 s less)
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
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # xdist follows the collection order below


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.path)), len(rank)))  # stable
