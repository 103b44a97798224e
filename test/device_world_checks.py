"""The core's CUDA path on ranks that are threads, against stand-ins for the CUDA driver and NCCL.

Run by test_device_executor.py in a subprocess whose LD_LIBRARY_PATH finds the stand-in
libcuda.so.1 (test/device_doubles/fake_cuda.c: "device memory" is host memory); argv[1] is the
stand-in NCCL. Exercises what a GPU run would, except the GPU: the per-set decision (shared GPU or
NCCL missing: staged by the core; own GPUs and NCCL: NCCL), communicator creation with the id
sent over Horo's transport, fused responses as one NCCL group, dtypes NCCL lacks staged (bfloat16
before NCCL 2.10), members with different NCCL versions staged, the ready event waited on, the
errors, and a communicator aborted when NCCL reports an error or a collective never finishes.
Exits non-zero with the failing check's message.
"""
import ctypes
import sys
import threading

from loopback_world import World

from horo_core._binding import lib
from horo_core.errors import (HoroInternalError, HoroInvalidArgument, HoroMismatchError, HoroTimeoutError,
                              HoroUnsupportedError)
from horo_core.runtime import TensorSpec

NCCL_PATH = sys.argv[1]
fake_nccl = ctypes.CDLL(NCCL_PATH)
fake_cuda = ctypes.CDLL("libcuda.so.1")
fake_nccl.fake_nccl_set_version.argtypes = [ctypes.c_int]
checks = 0


def expect(what, got, want):
    global checks
    checks += 1
    if got != want:
        raise AssertionError(f"{what}: got {got}, want {want}")


def spec(name, arr, dtype, ordinal, out=None):
    out = arr if out is None else out
    device = lib.HORO_DEVICE_HOST if ordinal is None else lib.HORO_DEVICE_CUDA_BASE + ordinal
    return TensorSpec(name, ctypes.addressof(arr), ctypes.addressof(out), dtype, (len(arr),), device)


def run_op(rt, op_type, specs, **options):
    handles = rt.enqueue(op_type, specs, caller_waits=True, **options)
    for h in handles:
        rt.wait(h)
        rt.release(h)


def collectives(ordinal_of, enable_nccl, tag):
    """Allreduce (alone, fused, in place or not, Average, int16, bool) and broadcast on 2 ranks."""
    with World(2) as world:
        def body(rt):
            r = rt.rank
            version = rt.enable_cuda(NCCL_PATH if enable_nccl else None)
            expect(f"{tag}: NCCL version", version, 22907 if enable_nccl else 0)
            # This thread waits on its handles, so it runs device work itself (caller passes): its
            # own current CUDA context must be what it was afterwards.
            mine = ctypes.c_void_p(0xC0DE0 + r)
            fake_cuda.cuCtxSetCurrent(mine)
            dev = ordinal_of(r)
            a = (ctypes.c_float * 5)(*[r + 1.0] * 5)
            out = (ctypes.c_float * 5)()
            run_op(rt, lib.HORO_ALLREDUCE, [spec("a", a, lib.HORO_FLOAT32, dev, out)], reduce_op=lib.HORO_OP_SUM,
                   ready_event=0x1234)
            expect(f"{tag}: allreduce sum", list(out), [3.0] * 5)
            expect(f"{tag}: input untouched", list(a), [r + 1.0] * 5)
            # Average: the core sums, the adapter divides (and scales) on the device.
            run_op(rt, lib.HORO_ALLREDUCE, [spec("avg", a, lib.HORO_FLOAT32, dev)], reduce_op=lib.HORO_OP_AVERAGE,
                   prescale_factor=3.0)
            expect(f"{tag}: average leaves the division to the adapter", list(a), [3.0] * 5)
            xs = [(ctypes.c_float * (3 + i))(*[(r + 1.0) * (i + 1)] * (3 + i)) for i in range(3)]
            run_op(rt, lib.HORO_ALLREDUCE, [spec(f"g{i}", x, lib.HORO_FLOAT32, dev) for i, x in enumerate(xs)],
                   reduce_op=lib.HORO_OP_MAX)
            for i, x in enumerate(xs):
                expect(f"{tag}: fused max [{i}]", list(x), [2.0 * (i + 1)] * (3 + i))
            s = (ctypes.c_int16 * 4)(*[1000 * (r + 1)] * 4)
            run_op(rt, lib.HORO_ALLREDUCE, [spec("i16", s, lib.HORO_INT16, dev)], reduce_op=lib.HORO_OP_SUM)
            expect(f"{tag}: int16 sum (no NCCL type: staged)", list(s), [3000] * 4)
            b = (ctypes.c_uint8 * 3)(*[1, r, 0])
            run_op(rt, lib.HORO_ALLREDUCE, [spec("bool", b, lib.HORO_BOOL, dev)], reduce_op=lib.HORO_OP_SUM)
            expect(f"{tag}: bool sum is or", list(b), [1, 1, 0])
            b = (ctypes.c_uint8 * 3)(*[1, r, 0])
            run_op(rt, lib.HORO_ALLREDUCE, [spec("bool.p", b, lib.HORO_BOOL, dev)], reduce_op=lib.HORO_OP_PRODUCT)
            expect(f"{tag}: bool product is and", list(b), [1, 0, 0])
            v = (ctypes.c_int64 * 6)(*[10 * r + i for i in range(6)])
            w = (ctypes.c_int64 * 6)()
            run_op(rt, lib.HORO_BROADCAST, [spec("bc", v, lib.HORO_INT64, dev, w)], root_rank=1)
            expect(f"{tag}: broadcast from rank 1", list(w), [10 + i for i in range(6)])
            empty = (ctypes.c_float * 0)()
            run_op(rt, lib.HORO_ALLREDUCE, [spec("empty", empty, lib.HORO_FLOAT32, dev)])
            current = ctypes.c_void_p()
            fake_cuda.cuCtxGetCurrent(ctypes.byref(current))
            expect(f"{tag}: the waiting thread's CUDA context is its own again", current.value, mine.value)
            return True

        before = (fake_nccl.fake_nccl_allreduce_calls(), fake_nccl.fake_nccl_broadcast_calls(),
                  fake_nccl.fake_nccl_groups(), fake_cuda.fake_cuda_event_waits())
        world.run(body, timeout=60)
        after = (fake_nccl.fake_nccl_allreduce_calls(), fake_nccl.fake_nccl_broadcast_calls(),
                 fake_nccl.fake_nccl_groups(), fake_cuda.fake_cuda_event_waits())
        return [a - b for a, b in zip(after, before)]


def staged_large():
    """Staged collectives of several MB: a fused allreduce of tensors of odd lengths, out of place
    for one of them (each tensor's copies land at its own offset of the pinned buffer), and a
    broadcast from the last rank."""
    import numpy as np
    sizes = [1_500_000, 750_001, 2_000_000]  # 17 MB of float32
    with World(2) as world:
        def body(rt):
            r = rt.rank
            rt.enable_cuda(NCCL_PATH)
            ins = [(np.arange(n, dtype=np.float32) % 1000) + r for n in sizes]
            outs = [x if i != 1 else np.full_like(x, -1.0) for i, x in enumerate(ins)]
            specs = [TensorSpec(f"big{i}", x.ctypes.data, o.ctypes.data, lib.HORO_FLOAT32, x.shape,
                                lib.HORO_DEVICE_CUDA_BASE) for i, (x, o) in enumerate(zip(ins, outs))]
            run_op(rt, lib.HORO_ALLREDUCE, specs, reduce_op=lib.HORO_OP_SUM)
            for i, (n, o) in enumerate(zip(sizes, outs)):
                want = 2 * (np.arange(n, dtype=np.float32) % 1000) + 1
                expect(f"large staged allreduce [{i}] (first wrong index)",
                       int(np.argmax(o != want)) if not np.array_equal(o, want) else None, None)
            expect("large staged allreduce: input of the out-of-place tensor untouched", bool((ins[1] == (np.arange(
                sizes[1], dtype=np.float32) % 1000) + r).all()), True)
            b = np.arange(786_433, dtype=np.int64) * (r + 1)
            run_op(rt, lib.HORO_BROADCAST, [TensorSpec("bigbc", b.ctypes.data, b.ctypes.data, lib.HORO_INT64,
                                                       b.shape, lib.HORO_DEVICE_CUDA_BASE)], root_rank=1)
            expect("large staged broadcast from rank 1", bool((b == np.arange(b.size, dtype=np.int64) * 2).all()), True)
            return True
        before = (fake_nccl.fake_nccl_allreduce_calls(), fake_nccl.fake_nccl_broadcast_calls())
        world.run(body, timeout=60)
        after = (fake_nccl.fake_nccl_allreduce_calls(), fake_nccl.fake_nccl_broadcast_calls())
    expect("large staged collectives: nothing through NCCL (one GPU shared)", after, before)


def staged_when_versions_say_so():
    """bfloat16 needs NCCL 2.10; members whose NCCL versions differ must not share a communicator.
    Either way every member stages, and the sum is still right."""
    bf16 = {1.0: 0x3F80, 2.0: 0x4000, 3.0: 0x4040}
    for versions, tag in (((2800, 2800), "NCCL 2.8: bfloat16 staged"),
                          ((22907, 21803), "different NCCL versions: staged")):
        with World(2) as world:
            def body(rt):
                r = rt.rank
                fake_nccl.fake_nccl_set_version(versions[r])  # this thread's NCCL, read by enable_cuda
                expect(f"{tag}: version", rt.enable_cuda(NCCL_PATH), versions[r])
                h = (ctypes.c_uint16 * 4)(*[bf16[r + 1.0]] * 4)
                run_op(rt, lib.HORO_ALLREDUCE, [spec("bf", h, lib.HORO_BFLOAT16, r)], reduce_op=lib.HORO_OP_SUM)
                expect(f"{tag}: bfloat16 sum", list(h), [bf16[3.0]] * 4)
                f = (ctypes.c_float * 3)(*[r + 1.0] * 3)
                run_op(rt, lib.HORO_ALLREDUCE, [spec("f", f, lib.HORO_FLOAT32, r)], reduce_op=lib.HORO_OP_SUM)
                expect(f"{tag}: float32 sum", list(f), [3.0] * 3)
                return True
            before = fake_nccl.fake_nccl_allreduce_calls()
            world.run(body, timeout=60)
            calls = fake_nccl.fake_nccl_allreduce_calls() - before
        # float32 goes through NCCL when the versions agree; nothing does when they differ.
        expect(f"{tag}: NCCL allreduces", calls, 2 if versions[0] == versions[1] else 0)


def communicator_aborted_on_failure():
    """An NCCL error, or a collective that never finishes, fails the tensor on every rank with an
    error naming it, after the rank aborted its communicator (no kernel of it left queued)."""
    cases = (("async error", 3, {}, HoroInternalError, "fake NCCL error"),
             ("timeout", 0, {"HORO_PEER_TIMEOUT_SECONDS": "1"}, HoroTimeoutError, "did not finish within"))
    for tag, async_error, env, error, text in cases:
        fake_nccl.fake_nccl_reset_aborted()  # earlier worlds aborted theirs at teardown
        both_warm = threading.Barrier(2)
        with World(2, rank_env=lambda r: env) as world:
            def body(rt):
                r = rt.rank
                rt.enable_cuda(NCCL_PATH)
                a = (ctypes.c_float * 4)(*[r + 1.0] * 4)
                run_op(rt, lib.HORO_ALLREDUCE, [spec("warm", a, lib.HORO_FLOAT32, r)])  # makes the communicator
                expect(f"{tag}: nothing aborted while it works", fake_nccl.fake_nccl_aborted(r), 0)
                if both_warm.wait() == 0:
                    fake_nccl.fake_nccl_set_async_error(async_error)
                    fake_cuda.fake_cuda_set_streams_busy(1)
                both_warm.wait()
                try:
                    run_op(rt, lib.HORO_ALLREDUCE, [spec("stuck", a, lib.HORO_FLOAT32, r)])
                    raise AssertionError(f"{tag}: the collective succeeded")
                except error as exc:
                    expect(f"{tag}: the error names the tensor and the cause",
                           f"NCCL allreduce of tensor 'stuck' on rank {r}" in str(exc) and text in str(exc), True)
                expect(f"{tag}: communicator aborted before the handle failed", fake_nccl.fake_nccl_aborted(r), 1)
                return True
            try:
                world.run(body, timeout=60)
            finally:
                fake_nccl.fake_nccl_set_async_error(0)
                fake_cuda.fake_cuda_set_streams_busy(0)
        # Not aborted a second time at teardown (the aborted communicator was forgotten).
        expect(f"{tag}: one abort per rank in all", [fake_nccl.fake_nccl_aborted(r) for r in range(2)], [1, 1])


def main():
    # Two ranks on one GPU: NCCL is loaded but the core stages (NCCL refuses duplicate GPUs).
    calls, bcasts, groups, waits = collectives(lambda r: 0, True, "shared GPU")
    expect("shared GPU: no NCCL allreduce", (calls, bcasts), (0, 0))
    expect("shared GPU: the ready event is waited on by each rank", waits, 2)
    # One GPU each and NCCL everywhere: NCCL, except int16 (staged). Per rank: a, avg, 3 fused
    # (one group), bool, bool.p = 7 allreduces in 6 groups, 1 broadcast.
    calls, bcasts, groups, waits = collectives(lambda r: r, True, "own GPUs")
    expect("own GPUs: NCCL allreduces (2 ranks)", calls, 14)
    expect("own GPUs: NCCL broadcasts", bcasts, 2)
    expect("own GPUs: NCCL groups (fused response = one group)", groups, 12)
    # Own GPUs but no NCCL: staged.
    calls, bcasts, _, _ = collectives(lambda r: r, False, "no NCCL")
    expect("no NCCL: nothing through NCCL", (calls, bcasts), (0, 0))

    with World(2) as world:
        def errors(rt):
            r = rt.rank
            rt.enable_cuda(NCCL_PATH)
            a = (ctypes.c_float * 2)(1, 2)
            try:
                rt.enqueue(lib.HORO_ALLGATHER, [spec("ag", a, lib.HORO_FLOAT32, r)])
                raise AssertionError("allgather of device memory was accepted")
            except HoroUnsupportedError as exc:
                expect("allgather refused", "allreduce and broadcast only" in str(exc), True)
            try:
                rt.enqueue(lib.HORO_ALLREDUCE, [spec("far", a, lib.HORO_FLOAT32, 5)])
                raise AssertionError("device 5 was accepted")
            except HoroInvalidArgument as exc:
                expect("missing device", f"CUDA device 5 does not exist on rank {r}" in str(exc), True)
            try:
                run_op(rt, lib.HORO_ALLREDUCE, [spec("mixed", a, lib.HORO_FLOAT32, None if r == 0 else r)])
                raise AssertionError("host/device mismatch was accepted")
            except HoroMismatchError as exc:
                expect("mismatch names it", "Mismatched CPU/GPU device selection for allreduce tensor 'mixed': "
                                            "rank 0 has CPU, rank 1 has GPU" in str(exc), True)
            return True
        world.run(errors, timeout=60)
    staged_large()
    staged_when_versions_say_so()
    communicator_aborted_on_failure()
    print(f"device world checks passed: {checks}")


if __name__ == "__main__":
    main()
