"""Builds and runs the C++ unit tests in test/cpp.

Each test/cpp/test_*.cc names the core sources it needs on a line
``// sources: <globs relative to horo_core/src>``; it is compiled with those sources and run. The
program prints its checks and exits non-zero on the first failure. Ranks are threads over the
loopback transport, or processes over TCP on 127.0.0.1, as each program chooses.

Most core sources are needed by several programs, and compiling them was nine tenths of these
tests' time: every source is compiled once per session into an object file (all with the same
flags, so one object serves every program), as many at a time as there are CPUs, and each program
is its own file compiled and linked with the objects it names.
"""
import glob
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "horo_core", "src")
INCLUDE = os.path.join(ROOT, "horo_core", "include")
TESTS = sorted(glob.glob(os.path.join(ROOT, "test", "cpp", "test_*.cc")))
FLAGS = ["-std=c++17", "-O2", "-g1", "-pthread", "-I", SRC, "-I", INCLUDE]


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


class _ObjectCache:
    """Compiles each source at most once; returns (object path, compiler errors or None)."""

    def __init__(self, directory):
        self._directory = directory
        self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
        self._futures = {}
        self._lock = threading.Lock()

    def _compile(self, source):
        relative = os.path.relpath(source, ROOT)
        obj = os.path.join(self._directory, relative.replace(os.sep, "__") + ".o")
        build = subprocess.run(["g++", *FLAGS, "-c", source, "-o", obj], capture_output=True, text=True)
        return obj, (None if build.returncode == 0 else f"{relative}:\n{build.stderr[-6000:]}")

    def submit(self, source):
        with self._lock:
            if source not in self._futures:
                self._futures[source] = self._pool.submit(self._compile, source)
            return self._futures[source]

    def close(self):
        self._pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def objects(request, tmp_path_factory):
    cache = _ObjectCache(str(tmp_path_factory.mktemp("cpp_objects")))
    # The files of every selected program start compiling now, in the order the programs run, so
    # that all CPUs stay busy while the first programs link and run.
    selected = [item.callspec.params["test_path"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_cpp_unit"]
    for test_path in selected:
        for source in _sources_of(test_path) + [test_path]:
            cache.submit(source)
    yield cache
    cache.close()


@pytest.mark.parametrize("test_path", TESTS, ids=[os.path.basename(t)[:-3] for t in TESTS])
def test_cpp_unit(test_path, objects, tmp_path):
    own = objects.submit(test_path)  # compiled into the same folder; a test file is its own source
    compiled = [objects.submit(source).result() for source in _sources_of(test_path)] + [own.result()]
    errors = [error for _, error in compiled if error]
    assert not errors, "compile failed:\n" + "\n".join(errors)
    exe = str(tmp_path / "unit")
    link = subprocess.run(["g++", "-pthread", *[obj for obj, _ in compiled], "-o", exe], capture_output=True, text=True)
    assert link.returncode == 0, f"link failed:\n{link.stderr[-6000:]}"
    run = subprocess.run([exe], capture_output=True, text=True, timeout=600)
    sys.stdout.write(run.stdout[-4000:])
    assert run.returncode == 0, f"{os.path.basename(test_path)} failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
