"""Helpers of the hororun tests (test_hororun*.py); their fixtures are in conftest.py."""
import subprocess
import sys
import textwrap


def hororun_cmd(*args):
    return [sys.executable, "-m", "horo_runner.launch", *args]


def worker(code):
    return [sys.executable, "-c", textwrap.dedent(code)]


def hororun(child_env, *args, timeout=60):
    return subprocess.run(hororun_cmd(*args), env=child_env, capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
