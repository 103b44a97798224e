"""Builds and runs the C++ unit tests in test/cpp.

Each test/cpp/test_*.cc names the core sources it needs on a line
``// sources: <globs relative to horo_core/src>``; it is compiled with those sources and run. The
program prints its checks and exits non-zero on the first failure. Ranks are threads over the
loopback transport, or processes over TCP on 127.0.0.1, as each program chooses.
"""
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "horo_core", "src")
INCLUDE = os.path.join(ROOT, "horo_core", "include")
TESTS = sorted(glob.glob(os.path.join(ROOT, "test", "cpp", "test_*.cc")))


def _sources_of(test_path):
    with open(test_path) as f:
        for line in f:
            if line.startswith("// sources:"):
                globs = line.split(":", 1)[1].split()
                files = []
                for pattern in globs:
                    matched = sorted(glob.glob(os.path.join(SRC, pattern)))
                    assert matched, f"{test_path}: source pattern {pattern!r} matches nothing"
                    files.extend(matched)
                return files
    raise AssertionError(f"{test_path} has no '// sources:' line")


@pytest.mark.parametrize("test_path", TESTS, ids=[os.path.basename(t)[:-3] for t in TESTS])
def test_cpp_unit(test_path, tmp_path):
    exe = str(tmp_path / "unit")
    cmd = ["g++", "-std=c++17", "-O2", "-g", "-pthread", "-I", SRC, "-I", INCLUDE, test_path,
           *_sources_of(test_path), "-o", exe]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, f"compile failed:\n{build.stderr[-6000:]}"
    run = subprocess.run([exe], capture_output=True, text=True, timeout=600)
    sys.stdout.write(run.stdout[-4000:])
    assert run.returncode == 0, f"{os.path.basename(test_path)} failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
