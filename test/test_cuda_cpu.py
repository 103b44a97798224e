"""CUDA support as far as a machine without a GPU can check it (CI runs here).

* The NCCL loader: its search order (HORO_NCCL_LIBRARY, then an nvidia-nccl wheel, then the
  system soname) and its errors for a missing file and for a shared library that is not NCCL.
  A stand-in NCCL (test/device_doubles/fake_nccl.c) plays the real library.
* The device field of horo_tensor_t: zero means host memory (Python zero-fills structs), and a
  CUDA tensor is refused with a clear error while CUDA is not enabled.
* A CPU-only install: the capability queries answer without CUDA, and horo_torch runs.

The device executor itself runs against stand-in CUDA and NCCL libraries in
test_device_executor.py; the GPU is exercised by examples/benchmarks/cuda_check.py where one is lent.
"""
import ctypes
import ctypes.util
import os
import subprocess
import sys

import pytest

from horo_core import basics, nccl
from horo_core._binding import lib
from horo_core.errors import HoroInvalidArgument, HoroUnsupportedError
from horo_core.runtime import LoopbackHub, Runtime, TensorSpec

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def fake_nccl(tmp_path_factory):
    """A shared library exporting NCCL's entry points, reporting version 2.29.7."""
    out = tmp_path_factory.mktemp("fake_nccl") / "libnccl.so.2"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), os.path.join(HERE, "device_doubles", "fake_nccl.c"),
                    "-lpthread"], check=True)
    return str(out)


@pytest.fixture
def clean_search(monkeypatch):
    """No NCCL setting in the environment and a fresh cache of the search."""
    for var in ("HORO_NCCL_LIBRARY", "HOROVOD_NCCL_LIBRARY"):
        monkeypatch.delenv(var, raising=False)
    nccl._found.cache_clear()
    yield monkeypatch
    nccl._found.cache_clear()


def _a_shared_library_that_is_not_nccl():
    name = ctypes.util.find_library("m")  # "libm.so.6": the dynamic linker resolves the bare name
    assert name, "libm must exist"
    return name


def test_loader_reads_the_version_of_an_nccl_library(fake_nccl):
    assert nccl.library_version(fake_nccl) == 22907


def test_loader_names_a_missing_file():
    with pytest.raises(HoroUnsupportedError, match=r"cannot load NCCL from /nonexistent/libnccl\.so\.2: .*No such file"):
        nccl.library_version("/nonexistent/libnccl.so.2")


def test_loader_refuses_a_library_that_is_not_nccl():
    name = _a_shared_library_that_is_not_nccl()
    with pytest.raises(HoroUnsupportedError, match=rf"{name} is not an NCCL library: symbol ncclGetVersion is missing"):
        nccl.library_version(name)


def test_search_order_explicit_setting_wins_and_is_exclusive(clean_search, fake_nccl):
    clean_search.setenv("HORO_NCCL_LIBRARY", fake_nccl)
    assert nccl.candidates() == ([fake_nccl], True)
    assert nccl.find()[:2] == (fake_nccl, 22907)
    clean_search.setenv("HOROVOD_NCCL_LIBRARY", "/elsewhere/libnccl.so.2")  # HORO_ is read first
    assert nccl.candidates() == ([fake_nccl], True)


def test_search_order_bad_explicit_setting_is_an_error_not_a_fallback(clean_search):
    clean_search.setenv("HOROVOD_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
    with pytest.raises(nccl.NcclNotFound, match=r"HORO_NCCL_LIBRARY=/nonexistent/libnccl\.so\.2: cannot load NCCL"):
        nccl.find()
    assert basics.nccl_built() == 0  # the capability query answers; the first CUDA collective raises


def test_search_order_wheel_before_system(clean_search, fake_nccl, tmp_path):
    # An nvidia-nccl-cu13 wheel installs site-packages/nvidia/nccl/lib/libnccl.so.2.
    lib_dir = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    lib_dir.mkdir(parents=True)
    os.symlink(fake_nccl, lib_dir / "libnccl.so.2")
    clean_search.syspath_prepend(str(tmp_path / "site"))
    for mod in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        clean_search.delitem(sys.modules, mod)
    wheel_lib = str(lib_dir / "libnccl.so.2")
    paths, explicit = nccl.candidates()
    assert not explicit
    assert paths[0] == wheel_lib and paths[-1] == "libnccl.so.2"
    assert nccl.find()[:2] == (wheel_lib, 22907)
    assert basics.nccl_built() == 22907


def test_search_without_any_nccl_reports_every_reason(clean_search):
    clean_search.setattr(nccl, "wheel_library_paths", lambda: ["/nonexistent/wheel/libnccl.so.2"])
    clean_search.setattr(nccl, "SONAME", "libnccl-that-does-not-exist.so.2")
    path, version, reasons = nccl.find()
    assert (path, version) == (None, 0)
    assert len(reasons) == 2 and "/nonexistent/wheel/libnccl.so.2" in reasons[0]
    assert "libnccl-that-does-not-exist.so.2" in reasons[1]


def test_check_build_lists_the_nccl_that_would_load(fake_nccl):
    """hororun --check-build printed "[ ] NCCL" whatever was installed; NCCL is found at run time,
    so it now says which library CUDA collectives would load (and python -m horo_core info too)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}

    def report(**settings):
        proc = subprocess.run([sys.executable, "-m", "horo_runner.launch", "--check-build"], capture_output=True,
                              text=True, timeout=180, env={**env, **settings})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert f"    [X] NCCL 2.29.7 ({fake_nccl}) (CUDA tensors)" in report(HORO_NCCL_LIBRARY=fake_nccl).splitlines()
    if not nccl.wheel_library_paths() and ctypes.util.find_library("nccl") is None:
        assert "    [ ] NCCL (no libnccl found)" in report().splitlines()


# The device field ----------------------------------------------------------------------------------

@pytest.fixture
def one_rank():
    hub = LoopbackHub(1)
    rt = Runtime(0, 1, loopback=hub)
    rt.connect()
    yield rt
    rt.destroy()
    hub.close()


def _spec(name, device, buf):
    return TensorSpec(name, ctypes.addressof(buf), ctypes.addressof(buf), lib.HORO_FLOAT32, (4,), device)


def test_device_field_zero_is_host_memory(one_rank):
    buf = (ctypes.c_float * 4)(1, 2, 3, 4)
    (h,) = one_rank.enqueue(lib.HORO_ALLREDUCE, [_spec("host", lib.HORO_DEVICE_HOST, buf)])
    one_rank.wait(h)
    one_rank.release(h)
    assert list(buf) == [1, 2, 3, 4]
    assert lib.HORO_DEVICE_HOST == 0


def test_cuda_tensor_is_refused_until_cuda_is_enabled(one_rank):
    buf = (ctypes.c_float * 4)()
    with pytest.raises(HoroUnsupportedError, match=r"allreduce tensor 'cuda\.x': tensor is in CUDA device 0 memory but CUDA is not "
                                                   r"enabled on rank 0"):
        one_rank.enqueue(lib.HORO_ALLREDUCE, [_spec("cuda.x", lib.HORO_DEVICE_CUDA_BASE, buf)])
    with pytest.raises(HoroInvalidArgument, match=r"device must be HORO_DEVICE_HOST \(0\) or .* got -2"):
        one_rank.enqueue(lib.HORO_ALLREDUCE, [_spec("cuda.y", -2, buf)])


def test_enabling_cuda_names_the_driver_when_it_is_absent(one_rank):
    if basics.cuda_built():  # a GPU machine: enabling works and reports the NCCL it loaded
        assert one_rank.enable_cuda(None) == 0
        return
    with pytest.raises(HoroUnsupportedError, match=r"cannot load the CUDA driver library libcuda\.so\.1"):
        one_rank.enable_cuda(None)


# A CPU-only install ---------------------------------------------------------------------------------

def test_cpu_only_capabilities_and_torch_ops():
    import torch

    import horo_torch as hvd
    assert isinstance(hvd.nccl_built(), int)
    assert hvd.cuda_built() == basics.cuda_built()
    hvd.init()
    try:
        t = torch.arange(6, dtype=torch.float32).reshape(2, 3)[:, ::2]  # not contiguous: staged on the host
        assert torch.equal(hvd.allreduce(t, op=hvd.Sum), t)
        assert torch.equal(hvd.allgather(t), t.contiguous())
        assert torch.equal(hvd.broadcast_(t.clone(), 0), t)
    finally:
        hvd.shutdown()


@pytest.mark.parametrize("script", ["cuda_check.py", "cuda_allreduce_bench.py"])
def test_the_cuda_scripts_refuse_a_host_without_a_gpu(script):
    # They started their ranks, and each failed on a modulo by zero GPUs.
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the script runs for real there")
    path = os.path.join(os.path.dirname(HERE), "examples", "benchmarks", script)
    out = subprocess.run([sys.executable, path, "--np", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith("no CUDA GPU is visible (torch.cuda.is_available() is False)")
    assert "ZeroDivisionError" not in out.stderr
