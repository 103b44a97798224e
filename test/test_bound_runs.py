"""Bound runs (``Runtime.bind_run``): a synchronous host operation called through one C-level
callable that holds the runtime's handle, horo_torch's per-step path for ``allreduce_`` and
``allreduce``. The handle outlives the runtime (``horo_runtime_close`` frees everything else), so a
run bound before a shutdown, or one in progress on another thread while the runtime is destroyed,
is refused with HORO_ERR_SHUT_DOWN instead of reaching freed memory."""
import os
import subprocess
import sys

import numpy as np
import pytest

from horo_core import dtypes
from horo_core._binding import last_error, lib
from horo_core.errors import HoroShutdownError
from horo_core.runtime import LoopbackHub, Runtime, bound_run_failed, prepare_run
from loopback_world import World

TEST_DIR = os.path.dirname(os.path.abspath(__file__))


def _bound_sum(rt, name, count):
    prepared = prepare_run(lib.HORO_ALLREDUCE, name, dtypes.FLOAT32, (count,), 0, lib.HORO_OP_SUM)
    return rt.bind_run(prepared)


def test_bound_runs_give_the_exact_sum_on_every_rank():
    with World(3) as world:
        def body(rt):
            run = _bound_sum(rt, "bound.sum", 5)
            x = np.full(5, rt.rank + 1.0, np.float32)
            out = np.empty_like(x)
            statuses = [run(x.ctypes.data, out.ctypes.data) for _ in range(20)]  # cached after the first
            in_place = np.arange(5, dtype=np.float32) * (rt.rank + 1)
            status = run(in_place.ctypes.data, in_place.ctypes.data)
            return statuses + [status], out.tolist(), in_place.tolist()
        for statuses, out, in_place in world.run(body):
            assert statuses == [lib.HORO_OK] * 21
            assert out == [6.0] * 5  # 1 + 2 + 3
            assert in_place == [6.0 * i for i in range(5)]


def test_a_bound_run_is_refused_after_shutdown_and_after_destroy():
    hub = LoopbackHub(1)
    rt = Runtime(0, 1, loopback=hub)
    rt.connect()
    run = _bound_sum(rt, "bound.late", 2)
    x = np.ones(2, np.float32)
    assert run(x.ctypes.data, x.ctypes.data) == lib.HORO_OK
    rt.shutdown()
    # Shut down but not destroyed: the runtime is still this process's, so its error is raised.
    status = run(x.ctypes.data, x.ctypes.data)
    assert status == lib.HORO_ERR_SHUT_DOWN
    with pytest.raises(HoroShutdownError, match="shut down"):
        bound_run_failed(run, status)
    rt.destroy()
    hub.close()
    # Destroyed: the handle the run holds is closed, not freed; the caller takes its general path.
    status = run(x.ctypes.data, x.ctypes.data)
    assert status == lib.HORO_ERR_SHUT_DOWN
    assert "the runtime is closed" in last_error()
    assert bound_run_failed(run, status) is None
    with pytest.raises(HoroShutdownError, match="shut down"):
        rt.bind_run(run.prepared)


def test_the_core_reads_torch_tensors_as_torch_describes_them():
    torch = pytest.importorskip("torch")
    from horo_core._binding import ffi
    from horo_torch import _calls, _reading
    opened = _reading.reader()
    assert opened is not None  # this torch exports the shim and its handles point at _cdata
    for dtype in _calls._TORCH_DTYPES:
        t = torch.zeros((3, 1, 4), dtype=dtype)[1:]
        facts = _reading.facts_of(t)
        assert (facts.ndim, list(facts.shape[0:3]), facts.data, facts.contiguous) == (3, [2, 1, 4], t.data_ptr(), 1)
        assert facts.dtype == _reading._state["dtypes"][dtype] and facts.device_type == _reading._state["cpu"]
    # What a run cannot be bound to: not contiguous, no strides (sparse), more dimensions than the
    # core describes, a subclass that may answer reads itself, not a tensor.
    class Sub(torch.Tensor):
        pass
    for refused in (torch.zeros(4, 2).t(), torch.zeros(2).to_sparse(), torch.zeros([1] * 17),
                    torch.zeros(2).as_subclass(Sub), np.zeros(2)):
        assert _reading.facts_of(refused) is None
    out = ffi.new("horo_tensor_facts_t*")
    assert lib.horo_tensor_reader_read(opened, torch.zeros([1] * 17)._cdata, out) == lib.HORO_ERR_UNSUPPORTED
    assert "more than 16 dimensions" in last_error()
    assert lib.horo_tensor_reader_open(b"/nonexistent/libtorch_cpu.so", ffi.new("horo_tensor_reader_t**")) \
        == lib.HORO_ERR_UNSUPPORTED
    assert "/nonexistent/libtorch_cpu.so" in last_error()


def test_a_run_bound_to_a_reading_refuses_a_changed_tensor_and_starts_nothing():
    torch = pytest.importorskip("torch")
    from horo_torch import _reading
    with World(2) as world:
        def body(rt):
            prepared = prepare_run(lib.HORO_ALLREDUCE, "read.sum", dtypes.FLOAT32, (2, 3), 0, lib.HORO_OP_SUM)
            x = torch.full((2, 3), rt.rank + 1.0)
            run = rt.bind_run(prepared, _reading.reader(), _reading.facts_of(x))
            y = torch.full((2, 3), 10.0 * (rt.rank + 1))
            out = torch.empty(2, 3)
            statuses = [run(x._cdata, x._cdata), run(y._cdata, out._cdata)]
            # Each differs from the reading in one way; none may start the collective, so the
            # ranks stay in step and the last call still runs.
            changed = [torch.zeros(3, 2), torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3, 2).t(),
                       torch.zeros(2, 3, 1), torch.zeros(6)]
            refusals = [run(c._cdata, c._cdata) for c in changed] + [run(x._cdata, changed[0]._cdata)]
            refused_ok = all(bound_run_failed(run, status) is None for status in refusals)
            statuses.append(run(x._cdata, x._cdata))
            return statuses, refusals, refused_ok, x.tolist(), out.tolist()
        for statuses, refusals, refused_ok, x, out in world.run(body):
            assert statuses == [lib.HORO_OK] * 3
            assert refusals == [lib.HORO_ERR_TENSOR_CHANGED] * 6 and refused_ok
            assert out == [[30.0] * 3] * 2
            assert x == [[6.0] * 3] * 2  # 1 + 2 on each rank, then 3 + 3


# Both scripts below: start the calling threads, wait until they are busy, stop the runtime from
# the main thread, and count the threads still alive 30 s later.
STOP_UNDER_THREADS = """
def stop_under(threads, busy, stop):
    for th in threads:
        th.start()
    busy()
    stop()
    for th in threads:
        th.join(30)
    return sum(th.is_alive() for th in threads)
"""

CALLS_DURING_DESTROY = STOP_UNDER_THREADS + """
import sys, threading
sys.path.insert(0, {test_dir!r})
import numpy as np
from horo_core import dtypes
from horo_core._binding import lib
from horo_core.runtime import LoopbackHub, Runtime, prepare_run

hub = LoopbackHub(1)
rt = Runtime(0, 1, loopback=hub)
rt.connect()
# One name per thread: two calls of one name at once are refused as a duplicate.
runs = [rt.bind_run(prepare_run(lib.HORO_ALLREDUCE, f"bound.race.{{i}}", dtypes.FLOAT32, (4,), 0, lib.HORO_OP_SUM))
        for i in range(4)]
busy = [threading.Event() for _ in runs]  # set once a thread has made 50 calls
statuses = [set() for _ in runs]

def hammer(i):
    x = np.ones(4, np.float32)
    calls = 0
    while True:
        status = runs[i](x.ctypes.data, x.ctypes.data)
        statuses[i].add(status)
        calls += 1
        if calls == 50:
            busy[i].set()
        if status != lib.HORO_OK:
            busy[i].set()
            return

threads = [threading.Thread(target=hammer, args=(i,)) for i in range(len(runs))]
alive = stop_under(threads, lambda: [b.wait() for b in busy], lambda: (rt.shutdown(), rt.destroy()))
print("statuses", sorted(set().union(*statuses)), "alive", alive)
"""


def test_runs_in_progress_on_other_threads_while_the_runtime_is_destroyed():
    """Four threads call bound runs in a loop while the main thread destroys the runtime: each call
    either completes or is refused (the runtime is shut down, or closed), and none reaches freed
    memory. In a subprocess, so that a crash or a hang fails the test instead of the suite."""
    script = CALLS_DURING_DESTROY.format(test_dir=TEST_DIR)
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError("destroying the runtime under bound runs did not return within 120 s") from None
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"statuses [{lib.HORO_OK}, {lib.HORO_ERR_SHUT_DOWN}] alive 0" in out.stdout, out.stdout + out.stderr[-3000:]


TORCH_SHUTDOWN_UNDER_CALLS = STOP_UNDER_THREADS + """
import threading
import torch
import horo_torch as hvd

hvd.init()
t = torch.ones(3)
for _ in range(3):  # the description, and the run bound to this runtime, are remembered
    hvd.allreduce_(t, op=hvd.Max, name="metric")
    hvd.allreduce(t, op=hvd.Max, name="metric.copy")
errors = []
started = threading.Event()

def loop(call):
    started.set()
    try:
        while True:
            call()
    except (hvd.HoroShutdownError, hvd.HoroNotInitializedError) as e:
        errors.append(type(e).__name__)

calls = (lambda: hvd.allreduce_(t, op=hvd.Max, name="metric"),
         lambda: hvd.allreduce(t, op=hvd.Max, name="metric.copy"))
alive = stop_under([threading.Thread(target=loop, args=(c,)) for c in calls], started.wait, hvd.shutdown)
# After shutdown: the remembered runs are refused, and the calls say that Horo is not initialized.
late = []
for call in calls:
    try:
        call()
        late.append("returned")
    except hvd.HoroNotInitializedError:
        late.append("not initialized")
# init() again: the runs bound to the old runtime give way to the new one's.
hvd.init()
again = [hvd.allreduce_(torch.full((3,), 2.0), op=hvd.Sum, name="metric").tolist(),
         hvd.allreduce(torch.full((3,), 5.0), op=hvd.Max, name="metric.copy").tolist()]
hvd.shutdown()
print("errors", len(errors), "alive", alive, "late", late, "again", again)
"""


def test_torch_calls_through_bound_runs_across_shutdown_and_init():
    """horo_torch's allreduce_ and allreduce call the core through runs bound to the runtime. Two
    threads calling them in a loop while the main thread shuts down stop with Horo's shutdown or
    not-initialized error; later calls say Horo is not initialized; after init() again they run on
    the new runtime."""
    try:
        out = subprocess.run([sys.executable, "-c", TORCH_SHUTDOWN_UNDER_CALLS], capture_output=True, text=True,
                             timeout=180)
    except subprocess.TimeoutExpired:
        raise AssertionError("the torch shutdown under calls did not return within 180 s") from None
    assert out.returncode == 0, out.stderr[-3000:]
    expected = ("errors 2 alive 0 late ['not initialized', 'not initialized'] "
                "again [[2.0, 2.0, 2.0], [5.0, 5.0, 5.0]]")
    assert expected in out.stdout, out.stdout + out.stderr[-3000:]
