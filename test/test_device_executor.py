"""The core's CUDA path (horo_core/src/device) without a GPU: stand-ins for libcuda.so.1 and NCCL,
compiled here from test/device_doubles, take the place of the real libraries, and
device_world_checks.py drives two loopback ranks through every decision the device executor makes.
It runs in a subprocess because the dynamic linker reads LD_LIBRARY_PATH (where the stand-in
libcuda.so.1 lies) only at process start."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_device_executor_against_stand_in_libraries(tmp_path):
    doubles = os.path.join(HERE, "device_doubles")
    cuda = tmp_path / "libcuda.so.1"
    nccl = tmp_path / "libnccl.so.2"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(cuda), os.path.join(doubles, "fake_cuda.c")],
                   check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(nccl), os.path.join(doubles, "fake_nccl.c"),
                    "-lpthread"], check=True)
    env = dict(os.environ, LD_LIBRARY_PATH=f"{tmp_path}:{os.environ.get('LD_LIBRARY_PATH', '')}",
               PYTHONPATH=f"{HERE}:{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "device_world_checks.py"), str(nccl)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert "device world checks passed: " in proc.stdout
    assert int(proc.stdout.rsplit(":", 1)[1]) >= 60
