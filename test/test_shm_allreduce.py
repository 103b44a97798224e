"""Ring allreduce over shared memory, whose scatter-reduce reduces straight out of the rings
(Transport::SendRecvReduce), against the same job over TCP, whose scatter-reduce receives into
scratch and then reduces.

Real processes on this host (horo_runner.run); HORO_SMALL_MESSAGE_BYTES=0 sends every count through
the ring, so blocks of one element, empty blocks and blocks larger than the ring chunk all occur.
Every dtype and op, prescale and postscale, zero and odd counts, a fused group and a reducescatter
(which shares the scatter-reduce) are checked against exact values on every rank, and the SHA-256 of
every result must be the same on every rank and in both jobs: reducing from the ring changes where
the bytes are read, never the order of the operations. The shared-memory job also runs the ring
slice by slice (its ranks share one host), the TCP job phase after phase (its hosts are unknown):
the same arithmetic in another order of steps.

One allreduce of 16 MB and a few bytes (uneven blocks that start mid cache line) is large enough
that the shared-memory job receives its allgather with non-temporal stores
(Transport::SendRecvUncached); its digest must match the TCP job's too.
"""
import pytest

import horo_runner

COUNTS = [0, 1, 7, 1000, 300001]  # 300001 float64 = 2.4 MB: several 256 KiB slices or 1 MiB chunks per block


def _job(counts):
    """Runs on every rank: (number of checks, failures, result digests, ring allreduces run)."""
    import hashlib
    import os
    import traceback

    import numpy as np

    import rank_checks
    from core_values import contribution, expected_allreduce, make, name, read, reduce_cases
    from horo_core import basics, dtypes
    from horo_core import numpy_ops as ops

    rank = int(os.environ["HORO_RANK"])
    basics.init()
    rt = basics.runtime()
    n = basics.size()
    c = rank_checks.Checks()
    digests = []

    try:
        start = rt.stats()
        for count in counts:
            for dtype, op_name, op in reduce_cases():
                tag = f"shm.{count}.{name(dtype)}.{op_name}"
                out = ops.allreduce(rt, make(dtype, contribution(op_name, rank, count)), tag, op=op, dtype=dtype)
                c.same_array(tag, read(dtype, out), expected_allreduce(op_name, dtype, n, count))
                digests.append(hashlib.sha256(out.tobytes()).hexdigest())
        # Scale factors: exact in binary (x4 before, /8 after).
        for dtype in (dtypes.FLOAT16, dtypes.BFLOAT16, dtypes.FLOAT32, dtypes.FLOAT64, dtypes.INT32):
            out = ops.allreduce(rt, make(dtype, contribution("sum", rank, 70001)), f"scaled.{name(dtype)}",
                                prescale_factor=4.0, postscale_factor=0.125, dtype=dtype)
            want = expected_allreduce("sum", dtype, n, 70001) * 4.0 / 8.0
            if dtype == dtypes.INT32:
                want = np.trunc(want)
            c.same_array(f"scaled {name(dtype)}", read(dtype, out), want)
            digests.append(hashlib.sha256(out.tobytes()).hexdigest())
        # Random float32 values (rounding differs with the order of operations); the group's members
        # are under 1 MiB each, so they are reduced together in the fusion buffer.
        rng = np.random.default_rng(rank)
        arrays = [(rng.standard_normal(s) * 10.0 ** rng.integers(-6, 6, s)).astype(np.float32)
                  for s in (5, 3000, 200001)]
        before = rt.stats()
        fused = ops.grouped_allreduce(rt, arrays, ["random.0", "random.1", "random.2"])
        c.same("a fused group is one ring allreduce", rt.stats().allreduce_ring - before.allreduce_ring, 1)
        digests += [hashlib.sha256(a.tobytes()).hexdigest() for a in fused]
        # Reducescatter shares the ring's scatter-reduce; each rank's block differs, so its digest is
        # compared between the two jobs only, after an allgather of the blocks.
        rows = 3 * n + 1
        block = ops.reducescatter(rt, np.full((rows, 1001), rank + 1.0, dtype=np.float64), "reducescatter")
        my_rows = rows // n + (1 if rank < rows % n else 0)
        c.same_array("reducescatter block", block, np.full((my_rows, 1001), n * (n + 1) / 2.0))
        gathered = ops.allgather(rt, block, "reducescatter.gather")
        digests.append(hashlib.sha256(gathered.tobytes()).hexdigest())
        # Past AllreduceOptions::kUncachedResultBytes (16 MiB): the allgather writes around the caches.
        large = 4 * 1024 * 1024 + 5
        out = ops.allreduce(rt, ((np.arange(large) % 1013) * (rank + 1)).astype(np.float32), "uncached")
        c.same_array("16 MB allreduce", out, ((np.arange(large) % 1013) * (n * (n + 1) // 2)).astype(np.float32))
        digests.append(hashlib.sha256(out.tobytes()).hexdigest())
        ring_runs = rt.stats().allreduce_ring - start.allreduce_ring
        ops.barrier(rt)
    except Exception:  # noqa: BLE001 - reported to the test, which names the rank
        c.fail(f"raised:\n{traceback.format_exc()}")
    basics.shutdown()
    return c.count, c.failures, digests, ring_runs if "ring_runs" in locals() else None


def _run(np_, shm):
    env = {"HORO_PEER_TIMEOUT_SECONDS": "60", "HORO_SMALL_MESSAGE_BYTES": "0", "HORO_SHM_DISABLE": "0" if shm else "1"}
    reports = horo_runner.run(_job, args=(COUNTS,), num_proc=np_, env=env)
    problems = [f"rank {r}: {f}" for r, (_, failures, _, _) in enumerate(reports) for f in failures]
    assert not problems, "\n".join(problems[:40])
    assert all(count > 200 for count, _, _, _ in reports)
    # Every allreduce of a non-empty tensor ran the ring: one per (dtype, op) and count > 0, 5
    # scaled, 1 fused group, 1 of 16 MB.
    from core_values import reduce_cases
    cases = len(list(reduce_cases()))
    assert [runs for _, _, _, runs in reports] == [cases * (len(COUNTS) - 1) + 5 + 1 + 1] * np_
    digests = [d for _, _, d, _ in reports]
    assert all(d == digests[0] for d in digests)
    return digests[0]


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_shared_memory_matches_tcp(np_):
    assert _run(np_, shm=True) == _run(np_, shm=False)


def _chunks_job():
    """Runs on every rank with its own HORO_CHUNK_BYTES, which cuts the scatter-reduce of a
    reducescatter (a ring allreduce on one host cuts rank 0's slices): (number of checks, failures)."""
    import os
    import traceback

    import numpy as np

    import rank_checks
    from horo_core import basics
    from horo_core import numpy_ops as ops

    rank = int(os.environ["HORO_RANK"])
    os.environ["HORO_CHUNK_BYTES"] = {0: "1048576", 1: "8192", 2: "300000"}[rank]
    basics.init()
    rt = basics.runtime()
    n = basics.size()
    c = rank_checks.Checks()
    try:
        for count in (1001, 300001, 1000003):
            for step in range(2):  # the second time through the peer agreement
                out = ops.allreduce(rt, np.full(count, rank + 1.0, dtype=np.float32), f"chunks.{count}")
                c.same_array(f"allreduce of {count} floats, step {step}", out,
                             np.full(count, n * (n + 1) / 2.0, dtype=np.float32))
            rows = 3 * n + 1
            block = ops.reducescatter(rt, np.full((rows, count // 100 + 1), rank + 1.0), f"chunks.rs.{count}")
            my_rows = rows // n + (1 if rank < rows % n else 0)
            c.same_array(f"reducescatter of {count // 100 + 1} columns", block,
                         np.full((my_rows, count // 100 + 1), n * (n + 1) / 2.0))
        # An odd-length message after them: the streams must still be in step.
        odd = ops.broadcast(rt, np.arange(3, dtype=np.uint8) + rank, 0, "chunks.odd")
        c.same_array("odd broadcast", odd, np.arange(3, dtype=np.uint8))
        out = ops.allreduce(rt, np.full(300001, rank + 1.0, dtype=np.float32), "chunks.after")
        c.same_array("allreduce after the odd broadcast", out, np.full(300001, n * (n + 1) / 2.0, dtype=np.float32))
        ops.barrier(rt)
    except Exception:  # noqa: BLE001 - reported to the test, which names the rank
        c.fail(f"raised:\n{traceback.format_exc()}")
    basics.shutdown()
    return c.count, c.failures


@pytest.mark.parametrize("np_", [2, 3])
def test_ranks_with_different_chunks_over_shared_memory(np_):
    # Each data-plane message starts at a 64-byte boundary of its ring (ShmTransport), so sender and
    # receiver must cut the stream alike wherever a piece does not end on such a boundary; the
    # scatter-reduce's chunks, which each rank sets for itself, are rounded to 64 bytes for that.
    env = {"HORO_PEER_TIMEOUT_SECONDS": "20", "HORO_SMALL_MESSAGE_BYTES": "0"}
    reports = horo_runner.run(_chunks_job, num_proc=np_, env=env)
    problems = [f"rank {r}: {f}" for r, (_, failures) in enumerate(reports) for f in failures]
    assert not problems, "\n".join(problems[:40])
    assert all(count == 11 for count, _ in reports), [count for count, _ in reports]
