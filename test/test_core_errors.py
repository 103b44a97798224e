"""Bad input, mismatches between ranks, joins, process sets and stalls, over loopback ranks.

Every check that compares ranks must fail on every rank with a message naming the tensor, the
ranks and both values, and the job must go on with its next collective.
"""
import threading
import time

import numpy as np
import pytest

from horo_core import numpy_ops as ops
from horo_core._binding import lib
from horo_core.errors import (HoroError, HoroInvalidArgument, HoroMismatchError, HoroShutdownError,
                              HoroUnsupportedError)
from horo_core.runtime import LoopbackHub, Runtime
from loopback_world import World


def run_mismatch(world, fn):
    """Runs fn on every rank, expects HoroMismatchError everywhere, then checks a healthy step."""
    _, errors = world.run_collecting(fn)
    for r, e in enumerate(errors):
        assert isinstance(e, HoroMismatchError), f"rank {r}: expected a mismatch error, got {e!r}"
    after = world.run(lambda rt: ops.allreduce(rt, np.ones(3, dtype=np.float32), "after"))
    for out in after:
        assert np.all(out == world.size)
    return [str(e) for e in errors]


@pytest.fixture
def world3():
    with World(3) as w:
        yield w


def test_shape_mismatch_names_tensor_ranks_and_shapes(world3):
    msgs = run_mismatch(world3, lambda rt: ops.allreduce(rt, np.ones(4 + (rt.rank == 2), np.float32), "grad.w"))
    for m in msgs:
        assert "allreduce tensor 'grad.w': ranks 0, 1 have [4], rank 2 has [5]" in m, m


def test_dtype_mismatch(world3):
    msgs = run_mismatch(world3, lambda rt: ops.allreduce(
        rt, np.ones(4, np.float64 if rt.rank == 1 else np.float32), "w"))
    for m in msgs:
        assert "data types" in m and "float32" in m and "rank 1 has float64" in m, m


def test_operation_mismatch(world3):
    def body(rt):
        x = np.ones((2, 2), np.float32)
        return ops.allgather(rt, x, "t") if rt.rank == 0 else ops.allreduce(rt, x, "t")

    for m in run_mismatch(world3, body):
        assert "operations" in m and "allgather" in m and "allreduce" in m, m


def test_reduce_op_mismatch(world3):
    msgs = run_mismatch(world3, lambda rt: ops.allreduce(
        rt, np.ones(4, np.float32), "r", op=lib.HORO_OP_MAX if rt.rank == 0 else lib.HORO_OP_SUM))
    for m in msgs:
        assert "reduction operations" in m and "Max" in m and "Sum" in m, m


def test_scale_factor_mismatch(world3):
    msgs = run_mismatch(world3, lambda rt: ops.allreduce(
        rt, np.ones(4, np.float32), "s", prescale_factor=1.0 + rt.rank))
    for m in msgs:
        assert "scale factors" in m and "prescale 1" in m and "prescale 2" in m, m


def test_scale_factors_that_differ_past_six_digits_are_a_mismatch(world3):
    """The factors were compared as printed, with six significant digits: 1 and 1.000000001 passed
    as equal, and every rank silently scaled by rank 0's."""
    msgs = run_mismatch(world3, lambda rt: ops.allreduce(
        rt, np.ones(4, np.float32), "s6", postscale_factor=0.1 if rt.rank == 0 else 0.1 + 1e-9))
    for m in msgs:
        assert ("Mismatched scale factors for allreduce tensor 's6': rank 0 has prescale 1 / postscale 0.1, "
                "ranks 1, 2 have prescale 1 / postscale 0.100000001") in m, m


def test_root_rank_mismatch(world3):
    msgs = run_mismatch(world3, lambda rt: ops.broadcast(rt, np.ones(4, np.float32), rt.rank % 2, "b"))
    for m in msgs:
        assert "root ranks for broadcast tensor 'b': ranks 0, 2 have 0, rank 1 has 1" in m, m


def test_allgather_trailing_shape_mismatch(world3):
    msgs = run_mismatch(world3, lambda rt: ops.allgather(rt, np.ones((2, 3 + (rt.rank == 1)), np.float32), "g"))
    for m in msgs:
        assert "'g'" in m and "shapes" in m, m


def test_undefined_reductions_fail_on_every_rank(world3):
    """Whether the op is defined for the dtype is the coordinator's check: every rank gets it."""
    for fn, kind, text in [
            (lambda rt: ops.allreduce(rt, np.ones(2, np.bool_), "bad.bool", op=lib.HORO_OP_AVERAGE),
             HoroInvalidArgument, "allreduce tensor 'bad.bool': Average is not defined for bool tensors"),
            (lambda rt: ops.allreduce(rt, np.ones(2, np.bool_), "bad.bool.scale", prescale_factor=2.0),
             HoroInvalidArgument, "scale factors are not defined for bool tensors"),
            (lambda rt: ops.reducescatter(rt, np.ones(3, np.float32), "bad.adasum", op=lib.HORO_OP_ADASUM),
             HoroUnsupportedError, "Adasum applies to allreduce only")]:
        _, errors = world3.run_collecting(fn)
        for r, e in enumerate(errors):
            assert isinstance(e, kind) and text in str(e), f"rank {r}: {e!r}"
    # One rank alone with Adasum of integers: the others (floats) fail with it at once, where they
    # used to wait for a tensor that rank had refused by itself.
    _, errors = world3.run_collecting(lambda rt: ops.allreduce(
        rt, np.ones(2, np.int32 if rt.rank == 1 else np.float32), "bad.mixed", op=lib.HORO_OP_ADASUM))
    for r, e in enumerate(errors):
        assert isinstance(e, HoroMismatchError) and "data types" in str(e), f"rank {r}: {e!r}"
    after = world3.run(lambda rt: ops.allreduce(rt, np.ones(3, dtype=np.float32), "after.undefined"))
    assert all(np.all(o == 3) for o in after)


def test_local_validation_errors(world3):
    rt = world3.runtimes[0]
    with pytest.raises(HoroInvalidArgument, match="process set 9 does not exist"):
        ops.allreduce(rt, np.ones(2, np.float32), "bad.set", process_set_id=9)
    # The runtime is still healthy.
    outs = world3.run(lambda r: ops.allreduce(r, np.ones(2, np.float32), "ok"))
    assert all(np.all(o == 3) for o in outs)


def run_invalid(world, fn):
    """Every rank must get HoroInvalidArgument (a ValueError) from the coordinator's check, and the
    job must go on."""
    _, errors = world.run_collecting(fn)
    for r, e in enumerate(errors):
        assert isinstance(e, HoroInvalidArgument) and isinstance(e, ValueError), f"rank {r}: {e!r}"
    outs = world.run(lambda rt: ops.allreduce(rt, np.ones(2, np.float32), "after.invalid"))
    assert all(np.all(o == world.size) for o in outs)
    return [str(e) for e in errors]


@pytest.mark.parametrize("op", ["allgather", "alltoall", "reducescatter"])
def test_a_scalar_on_one_rank_fails_on_every_rank(world3, op):
    """Rows are what these collectives split or join: a scalar is refused by the coordinator, so
    that the ranks that passed a proper tensor get the error too instead of waiting."""
    def body(rt):
        x = np.ones((), np.float32) if rt.rank == 1 else np.ones(3, np.float32)
        if op == "allgather":
            return ops.allgather(rt, x, "scalar.somewhere")
        if op == "alltoall":
            return ops.alltoall(rt, x, "scalar.somewhere")
        return ops.reducescatter(rt, x, "scalar.somewhere")

    for message in run_invalid(world3, body):
        assert f"{op} tensor 'scalar.somewhere' needs tensors of rank >= 1; rank 1 passed a scalar" in message


def test_scalars_on_two_ranks_are_named_together(world3):
    def body(rt):
        return ops.allgather(rt, np.ones((), np.float32) if rt.rank else np.ones(3, np.float32), "scalars")

    for message in run_invalid(world3, body):
        assert "allgather tensor 'scalars' needs tensors of rank >= 1; ranks 1, 2 passed scalars" in message, message


def test_root_outside_the_set_fails_on_every_rank(world3):
    msgs = run_invalid(world3, lambda rt: ops.broadcast(rt, np.ones(2, np.float32), 7, "bad.root"))
    for m in msgs:
        assert "'bad.root'" in m and "root rank 7" in m and "[0, 1, 2]" in m, m


@pytest.mark.parametrize("splits, expected", [
    ([1, 1, 0], "rank 1 passed splits that sum to 2, expected its first dimension 3"),
    ([1, 2], "rank 1 passed 2 splits, expected one per rank of the process set (3)"),
    ([4, -1, 0], "rank 1 passed a negative split -1"),
    (None, "rank 1 passed no splits, but its first dimension 4 is not divisible by the 3 ranks"),
])
def test_bad_splits_on_one_rank_fail_on_every_rank(world3, splits, expected):
    def body(rt):
        if rt.rank == 1:
            rows = 4 if splits is None else 3
            return ops.alltoall(rt, np.ones((rows, 1), np.float32), "bad.splits", splits=splits)
        return ops.alltoall(rt, np.ones((3, 1), np.float32), "bad.splits", splits=[1, 1, 1])

    for m in run_invalid(world3, body):
        assert "'bad.splits'" in m and expected in m, m


def test_equal_splits_given_or_implied_agree(world3):
    def body(rt):
        out, received = ops.alltoall(rt, np.full((3, 1), rt.rank, np.float32), "implied",
                                     splits=None if rt.rank == 0 else [1, 1, 1])
        return out, received

    for out, received in world3.run(body):
        assert received == [1, 1, 1] and out.ravel().tolist() == [0.0, 1.0, 2.0]


def test_duplicate_name_in_flight(world3):
    from horo_core.runtime import TensorSpec
    from horo_core import dtypes

    # The other ranks submit "dup" only after rank 0's second try, so that the first cannot
    # complete in between (it did once, on a busy machine: the ranks are threads of this process).
    second_try_done = threading.Event()

    def body(rt):
        x = np.ones(4, np.float32)
        out = np.empty_like(x)
        spec = TensorSpec("dup", x.ctypes.data, out.ctypes.data, dtypes.FLOAT32, x.shape)
        error = None
        if rt.rank == 0:
            (h,) = rt.enqueue(lib.HORO_ALLREDUCE, [spec])
            try:
                rt.enqueue(lib.HORO_ALLREDUCE, [spec])
            except HoroInvalidArgument as exc:
                error = str(exc)
            finally:
                second_try_done.set()
        else:
            assert second_try_done.wait(60), "rank 0 did not try the duplicate"
            (h,) = rt.enqueue(lib.HORO_ALLREDUCE, [spec])
        rt.wait(h)
        rt.release(h)
        return error, out

    results = world3.run(body)
    assert "an allreduce of a tensor named 'dup' is already in flight" in results[0][0]
    assert all(np.all(out == 3) for _, out in results)


def test_names_with_nul_and_fractional_splits_are_refused():
    """A NUL would end the name the core sees, so that names differing after it met as one; a
    fractional split was truncated into a different layout."""
    from horo_core import dtypes
    from horo_core.runtime import TensorSpec, prepare_run
    with World(1) as world:
        def body(rt):
            x = np.ones(4, np.float32)
            with pytest.raises(HoroInvalidArgument, match="contains a NUL character"):
                rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec("a\x00b", x.ctypes.data, x.ctypes.data,
                                                           dtypes.FLOAT32, x.shape)])
            with pytest.raises(HoroInvalidArgument, match="contains a NUL character"):
                prepare_run(lib.HORO_ALLREDUCE, "a\x00c", dtypes.FLOAT32, x.shape)
            with pytest.raises(HoroInvalidArgument, match=r"splits must be whole numbers, got \[1.5, 2.5\]"):
                ops.alltoall(rt, x, "fractional", splits=[1.5, 2.5])
        world.run(body)


def test_join_contributes_neutral_values_and_returns_last_rank():
    with World(4) as world:
        def body(rt):
            if rt.rank == 3:
                return None, ops.join(rt)
            sums = [ops.allreduce(rt, np.full(5, rt.rank + 1.0, np.float32), f"j.{k}") for k in range(3)]
            mins = ops.allreduce(rt, np.full(5, rt.rank + 1.0, np.float32), "jmin", op=lib.HORO_OP_MIN)
            maxs = ops.allreduce(rt, np.full(5, -(rt.rank + 1.0), np.float32), "jmax", op=lib.HORO_OP_MAX)
            return (sums, mins, maxs), ops.join(rt)

        results = world.run(body)
        lasts = {last for _, last in results}
        # Rank 3's join completes the first allreduce, so the last to join is one of the others.
        assert len(lasts) == 1 and lasts.pop() in (0, 1, 2)
        for values, _ in results:
            if values is not None:
                sums, mins, maxs = values
                assert all(np.all(s == 6) for s in sums)  # 1 + 2 + 3, rank 3 contributes zeros
                assert np.all(mins == 1) and np.all(maxs == -1)


def test_join_rejects_broadcast_while_joined(world3):
    def body(rt):
        if rt.rank == 2:
            return ops.join(rt)
        try:
            ops.broadcast(rt, np.ones(2, np.float32), 0, "bj")
        except HoroMismatchError as exc:
            message = str(exc)
        return message, ops.join(rt)

    results = world3.run(body)
    for message, _ in results[:2]:
        assert "not supported while ranks have joined" in message and "rank 2" in message


def test_process_sets_add_use_remove():
    with World(4) as world:
        def body(rt):
            even = rt.add_process_set([0, 2])
            odd = rt.add_process_set([3, 1])
            mine = even if rt.rank % 2 == 0 else odd
            out = ops.allreduce(rt, np.full(3, rt.rank + 1.0), "ps", process_set_id=mine)
            ranks = rt.process_set_ranks(mine)
            b = ops.broadcast(rt, np.full(2, float(rt.rank)), ranks[-1], "psb", process_set_id=mine)
            full = ops.allreduce(rt, np.ones(2), "global")
            with pytest.raises(HoroInvalidArgument, match="not a member"):
                ops.allreduce(rt, np.ones(2), "other", process_set_id=odd if mine == even else even)
            rt.remove_process_set(even)
            rt.remove_process_set(odd)
            with pytest.raises(HoroInvalidArgument, match="does not exist"):
                ops.allreduce(rt, np.ones(2), "gone", process_set_id=mine)
            return even, odd, out, ranks, b, full

        for r, (even, odd, out, ranks, b, full) in enumerate(world.run(body)):
            assert (even, odd) == (1, 2)
            assert ranks == ([0, 2] if r % 2 == 0 else [1, 3])
            assert np.all(out == (4 if r % 2 == 0 else 6))
            assert np.all(b == ranks[-1]) and np.all(full == 4)


def test_duplicate_process_set_is_rejected_everywhere():
    with World(2) as world:
        world.run(lambda rt: rt.add_process_set([1]))
        _, errors = world.run_collecting(lambda rt: rt.add_process_set([1]))
        for e in errors:
            assert isinstance(e, HoroInvalidArgument) and "already exists" in str(e)
        for ranks, message in (([1, 7], "process set ranks must be between 0 and 1, got 7"),
                               ([-2, 1], "process set ranks must be between 0 and 1, got -2"),
                               ([0, 1, 0], "process set ranks contain rank 0 twice")):
            _, errors = world.run_collecting(lambda rt: rt.add_process_set(ranks))
            assert [(type(e), str(e)) for e in errors] == [(HoroInvalidArgument, message)] * 2, ranks


def test_stall_warning_names_missing_ranks_then_completes(monkeypatch, capfd):
    monkeypatch.setenv("HORO_STALL_CHECK_TIME_SECONDS", "0.3")
    with World(3) as world:
        import threading
        released = threading.Event()

        def body(rt):
            if rt.rank == 2:
                released.wait(10)
            return ops.allreduce(rt, np.ones(2, np.float32), "slow.tensor")

        def watcher():
            import time
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if "Missing ranks" in capfd.readouterr().err:
                    break
                time.sleep(0.05)
            released.set()

        t = threading.Thread(target=watcher)
        t.start()
        outs = world.run(body)
        t.join()
    assert all(np.all(o == 3) for o in outs)


def test_stall_shutdown_fails_every_rank(monkeypatch):
    monkeypatch.setenv("HORO_STALL_CHECK_TIME_SECONDS", "0.2")
    monkeypatch.setenv("HORO_STALL_SHUTDOWN_TIME_SECONDS", "0.5")
    with World(3) as world:
        def body(rt):
            if rt.rank == 2:
                return ops.allreduce(rt, np.ones(2, np.float32), "other.name")
            return ops.allreduce(rt, np.ones(2, np.float32), "stuck")

        _, errors = world.run_collecting(body)
        for e in errors:
            assert isinstance(e, HoroShutdownError), repr(e)
            assert "rank 2: [stuck]" in str(e)


@pytest.mark.parametrize("sender,payload,cause", [
    # A response list whose first byte (the parameter flag) is neither 0 nor 1.
    (0, b"\x07", "malformed response list from the coordinator"),
    # A round message (tag 'R') cut short.
    (2, b"R", "malformed round message from rank 2"),
])
def test_a_workers_own_failure_reaches_every_rank(sender, payload, cause):
    """A worker that fails on its own (a malformed control message here, which no real peer sends)
    tells rank 0 why before it closes: every rank reports that cause and names the rank, instead of
    rank 0 announcing that rank 1 exited or lost its connection."""
    with World(3) as world:
        world.hub.deliver_control(sender, 1, payload)

        def body(rt):
            for i in range(1000):
                ops.allreduce(rt, np.ones(2, np.float32), f"after.{i}")
            raise AssertionError("the job went on after rank 1 failed")

        _, errors = world.run_collecting(body)
    for rank, e in enumerate(errors):
        assert isinstance(e, HoroError), (rank, repr(e))
        assert cause in str(e), (rank, str(e))
        if rank != 1:
            assert "rank 1 failed" in str(e), (rank, str(e))


def test_operation_after_shutdown_raises():
    hub = LoopbackHub(1)
    rt = Runtime(0, 1, loopback=hub)
    rt.connect()
    rt.shutdown()
    with pytest.raises(HoroShutdownError, match="shut down"):
        ops.allreduce(rt, np.ones(2, np.float32), "late")
    rt.destroy()
    hub.close()


def test_call_after_destroy_names_the_shutdown_not_an_earlier_failure():
    # horo_last_error() keeps the last failure's message; a call refused before it reaches the
    # core must not report that older, unrelated message.
    hub = LoopbackHub(1)
    rt = Runtime(0, 1, loopback=hub)
    rt.connect()
    with pytest.raises(HoroError, match="12345"):
        rt.remove_process_set(12345)
    rt.shutdown()
    rt.destroy()
    hub.close()
    with pytest.raises(HoroShutdownError, match="shut down") as raised:
        rt.stats()
    assert "12345" not in str(raised.value)


def test_removing_a_set_fails_its_pending_tensors_instead_of_hanging():
    from horo_core import dtypes
    from horo_core.runtime import TensorSpec

    with World(3) as world:
        set_id = world.run(lambda rt: rt.add_process_set([1, 2]))[0]
        keep = []

        def body(rt):
            handle = None
            if rt.rank == 1:  # rank 2 never submits it; then every rank removes the set
                a, o = np.ones(4, np.float32), np.zeros(4, np.float32)
                keep.append((a, o))
                (handle,) = rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec("t", a.ctypes.data, o.ctypes.data,
                                                                       dtypes.FLOAT32, (4,))], process_set_id=set_id)
            rt.remove_process_set(set_id)
            if handle is not None:
                with pytest.raises(HoroInvalidArgument, match="removed while tensor 't' was in flight"):
                    rt.wait(handle, timeout=30)
                rt.release(handle)
            return ops.allreduce(rt, np.ones(2, np.float32), "after.remove")

        assert all(np.all(out == 3) for out in world.run(body))


DESTROY_WHILE_POLLING = """
import sys, threading
sys.path.insert(0, {test_dir!r})
import numpy as np
from horo_core import dtypes
from horo_core._binding import lib
from horo_core.runtime import TensorSpec
from loopback_world import World

for _ in range(5):
    world = World(2)
    rt = world.runtimes[1]
    a, o = np.ones(4, np.float32), np.zeros(4, np.float32)
    (h,) = rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec("never", a.ctypes.data, o.ctypes.data, dtypes.FLOAT32, (4,))])
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            try:
                rt.poll(h)
                rt.wait(h, timeout=0.001)
            except Exception:
                pass

    threads = [threading.Thread(target=poll) for _ in range(4)]
    for t in threads:
        t.start()
    world.close()  # destroys every runtime while the threads are inside the C API
    stop.set()
    for t in threads:
        t.join()
print("survived")
"""


def test_destroy_while_other_threads_use_the_runtime_does_not_crash(tmp_path):
    import os
    import subprocess
    import sys
    script = tmp_path / "destroy.py"
    script.write_text(DESTROY_WHILE_POLLING.format(test_dir=os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "survived" in out.stdout, out.stderr[-3000:]


SHUTDOWN_TWICE = """
import sys, threading
sys.path.insert(0, {test_dir!r})
from loopback_world import World

world = World(2)

def both(rt):
    errors = []
    start = threading.Barrier(2)

    def shut():
        start.wait()
        try:
            rt.shutdown()
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=shut) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors

print("errors", world.run(both))
for rt in world.runtimes:
    rt.destroy()
print("survived")
"""


def test_shutdown_from_two_threads_at_once_returns_on_both(tmp_path):
    """Two threads of a rank shutting down at once (say, an atexit hook and the main thread): one
    joins the background thread, the other waits for it; neither fails, hangs or crashes. In a
    subprocess, so that a hang fails the test instead of stopping the suite."""
    import os
    import subprocess
    import sys
    script = tmp_path / "shutdown_twice.py"
    script.write_text(SHUTDOWN_TWICE.format(test_dir=os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("shutdown() from two threads at once did not return within 60 s") from None
    assert out.returncode == 0, out.stderr[-3000:]
    assert "errors [[], []]" in out.stdout and "survived" in out.stdout, out.stdout + out.stderr[-3000:]


def test_a_rank_that_shut_down_is_named_once():
    # The coordinator's notice begins "Horo has been shut down: "; the runtime added that again.
    with World(2) as world:
        def body(rt):
            if rt.rank == 1:
                rt.shutdown()
                return None
            time.sleep(0.5)
            with pytest.raises(HoroShutdownError) as raised:
                ops.allreduce(rt, np.ones(2, np.float32), "after.shutdown")
            return str(raised.value)
        message = world.run(body)[0]
    assert message.count("Horo has been shut down") == 1 and "rank 1 called shutdown()" in message, message


@pytest.mark.parametrize("size", [2, 3])
def test_grouped_calls_of_different_sizes_fail_on_every_rank(size):
    # Rank r groups 2 + r tensors: the first ranks' groups were complete and returned, while the
    # others waited for ever for members nobody else submits.
    with World(size) as world:
        def body(rt):
            names = [f"grouped.{i}" for i in range(2 + rt.rank)]
            with pytest.raises(HoroMismatchError) as raised:
                ops.grouped_allreduce(rt, [np.ones(3, np.float32) for _ in names], names, op=lib.HORO_OP_SUM)
            after = ops.allreduce(rt, np.ones(2, np.float32), "after.groups", op=lib.HORO_OP_SUM)
            return str(raised.value), after.tolist()
        for message, after in world.run(body):
            assert "Mismatched grouped calls for allreduce tensor 'grouped.0'" in message, message
            assert "rank 0 has it in a group of 2 tensors led by 'grouped.0', rank 1 has it in a group of 3" in message
            assert after == [float(size)] * 2


def test_a_group_mismatch_found_after_a_member_was_deferred_fails_that_member_too():
    # Rank 0 groups [a, z] and then reduces y alone; rank 1 groups [a, y]. a agrees (both lead a
    # group of 2 with it) and waits for its group; y does not, which fails the whole group, a
    # included, in the same round (a once stayed queued after its entry was gone).
    with World(2) as world:
        def body(rt):
            calls = [["a", "z"], ["y"]] if rt.rank == 0 else [["a", "y"]]
            arrays = {}
            handles = []
            for names in calls:
                specs = []
                for n in names:
                    arrays[n] = np.ones(2, np.float32)
                    specs.append(ops._spec(n, arrays[n], arrays[n], None))
                handles += rt.enqueue(lib.HORO_ALLREDUCE, specs, reduce_op=lib.HORO_OP_SUM)
            failures = []
            for h in handles:
                try:
                    rt.wait(h)
                except HoroMismatchError as e:
                    failures.append(str(e))
                finally:
                    rt.release(h)
            after = ops.allreduce(rt, np.ones(2, np.float32), "after.deferred", op=lib.HORO_OP_SUM)
            return failures, after.tolist()
        results = world.run(body)
    assert [len(f) for f, _ in results] == [3, 2], results
    for failures, after in results:
        assert all("Mismatched grouped calls for allreduce tensor 'y'" in f for f in failures), failures
        assert after == [2.0, 2.0]
