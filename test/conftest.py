"""Fixtures shared by the hororun tests (test_hororun*.py): the launcher package (top-level
runner/) made importable as horo_runner, and a child environment without HORO_ settings."""
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
