"""Every collective of the core over the STYLE.md matrix, with exact expected values.

Ranks are threads over the loopback transport, each with its own runtime (negotiation, response
cache, fusion and the algorithms all run for real). World sizes 1, 2, 3, 4, 5, 8; counts 0, 1, 7,
1000, 65537; every dtype; in-place and out-of-place.
"""
import threading
import time

import numpy as np
import pytest

from core_values import ALL, contribution, expected_allreduce, make, name, read
from horo_core import dtypes
from horo_core import numpy_ops as ops
from horo_core._binding import lib
from horo_core.errors import HoroInvalidArgument, HoroUnsupportedError
from horo_core.runtime import TensorSpec
from loopback_world import World

SIZES = [1, 2, 3, 4, 5, 8]
COUNTS = [0, 1, 7, 1000, 65537]
OPS = {"sum": lib.HORO_OP_SUM, "average": lib.HORO_OP_AVERAGE, "min": lib.HORO_OP_MIN,
       "max": lib.HORO_OP_MAX, "product": lib.HORO_OP_PRODUCT}


@pytest.fixture(scope="module", params=SIZES, ids=[f"np{n}" for n in SIZES])
def world(request):
    with World(request.param) as w:
        yield w


def test_allreduce_matrix(world):
    def body(rt):
        checked = 0
        for count in COUNTS:
            for dtype in ALL:
                for op_name, op in OPS.items():
                    if dtype == dtypes.BOOL and op_name == "average":
                        continue
                    for in_place in (False, True):
                        x = make(dtype, contribution(op_name, rt.rank, count))
                        tag = f"ar.{count}.{name(dtype)}.{op_name}.{in_place}"
                        out = ops.allreduce(rt, x, tag, op=op, out=x if in_place else None, dtype=dtype)
                        want = expected_allreduce(op_name, dtype, world.size, count)
                        got = read(dtype, out)
                        assert np.array_equal(got, want), f"{tag} on rank {rt.rank}: got {got[:8]}, want {want[:8]}"
                        if in_place:
                            assert out is x
                        checked += 1
        return checked

    assert all(c > 0 for c in world.run(body))


def test_allreduce_algorithms_agree_bitwise(world):
    # Random float32 data: every rank must end with exactly the same bits, whatever the algorithm.
    def body(rt):
        rng = np.random.default_rng(rt.rank)
        outs = []
        for count in (5, 3000, 300000):  # latency-optimal, and ring above 64 KiB
            x = rng.standard_normal(count).astype(np.float32)
            outs.append(ops.allreduce(rt, x, f"bits.{count}"))
        return outs

    results = world.run(body)
    for outs in results[1:]:
        for a, b in zip(results[0], outs):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("size", [2, 3])
def test_ranks_with_different_ring_slices_follow_rank_0(size):
    # On one host the ring allreduce runs slice by slice, so every rank must cut the same slices:
    # all follow the slice size that rank 0 stamps in the response. Chunks may differ per rank.
    slices = {0: "262144", 1: "4096", 2: "65536"}
    chunks = {0: "1048576", 1: "8192", 2: "300000"}
    with World(size, rank_env=lambda r: {"HORO_RING_SLICE_BYTES": slices[r], "HORO_CHUNK_BYTES": chunks[r]}) as w:
        def body(rt):
            rng = np.random.default_rng(rt.rank)
            x = rng.standard_normal(300001)
            y = np.full(200003, rt.rank + 1.0, dtype=np.float32)
            return ops.allreduce(rt, x, "chunks.random"), ops.allreduce(rt, y, "chunks.exact")

        results = w.run(body)
    for x, y in results:
        assert x.tobytes() == results[0][0].tobytes()
        assert np.all(y == size * (size + 1) / 2)


def test_ring_slice_setting_has_a_floor():
    # Every slice costs 2 (N-1) steps: a few bytes per slice would make a large allreduce crawl.
    with pytest.raises(Exception, match="HORO_RING_SLICE_BYTES must be at least 4096, got 100"):
        World(1, rank_env=lambda r: {"HORO_RING_SLICE_BYTES": "100"})


@pytest.mark.parametrize("value", ["inf", "2e6", "0"])
def test_peer_timeout_setting_is_bounded(value):
    # Every deadline made from it must fit a clock's count; beyond that the first wait would end
    # at once with a timeout that names an impossible number of seconds.
    with pytest.raises(Exception, match="HORO_PEER_TIMEOUT_SECONDS must be > 0 and at most 1000000, got"):
        World(1, rank_env=lambda r: {"HORO_PEER_TIMEOUT_SECONDS": value})


@pytest.mark.parametrize("name,value,message", [
    ("HORO_START_TIMEOUT", "inf", "HORO_START_TIMEOUT must be > 0 and at most 1000000, got inf"),
    ("HORO_START_TIMEOUT", "0", "HORO_START_TIMEOUT must be > 0 and at most 1000000, got 0"),
    ("HORO_CYCLE_TIME", "2e6", "HORO_CYCLE_TIME must be between 0 and 1000000, got 2e\\+06"),
    ("HORO_SPIN_MICROSECONDS", "-1", "HORO_SPIN_MICROSECONDS must be between 0 and 1000000, got -1"),
    ("HORO_STALL_CHECK_TIME_SECONDS", "-inf", "HORO_STALL_CHECK_TIME_SECONDS must be between 0 and 1000000, got -inf"),
    ("HORO_STALL_SHUTDOWN_TIME_SECONDS", "inf",
     "HORO_STALL_SHUTDOWN_TIME_SECONDS must be between 0 and 1000000, got inf"),
    ("HOROVOD_CYCLE_TIME", "-1", "HOROVOD_CYCLE_TIME must be between 0 and 1000000, got -1"),
    # NaN compares false with every bound; it is refused as text, whatever the setting.
    ("HORO_CYCLE_TIME", "nan", "HORO_CYCLE_TIME='nan' is not a valid float"),
    ("HOROVOD_SPIN_MICROSECONDS", "NaN", "HOROVOD_SPIN_MICROSECONDS='NaN' is not a valid float"),
    ("HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "nan", "HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE='nan' is not a valid float"),
    # A negative capacity once switched the cache off silently; a number past int64 was clamped.
    ("HOROVOD_CACHE_CAPACITY", "-5", "HOROVOD_CACHE_CAPACITY must be >= 0 \\(0 disables the cache\\), got -5"),
    ("HOROVOD_FUSION_THRESHOLD", "-1", "HOROVOD_FUSION_THRESHOLD must be >= 0, got -1"),
    ("HORO_FUSION_THRESHOLD", "99999999999999999999999",
     "HORO_FUSION_THRESHOLD='99999999999999999999999' is not a valid int"),
    # Settings read from words name the words.
    ("HOROVOD_LOG_LEVEL", "bogus", "HOROVOD_LOG_LEVEL='bogus' is not one of: TRACE, DEBUG, INFO, WARNING, ERROR or FATAL"),
    ("HORO_HIERARCHICAL_ALLREDUCE", "sometimes", "HORO_HIERARCHICAL_ALLREDUCE='sometimes' is not one of: auto, 1 or 0"),
])
def test_duration_settings_are_bounded(name, value, message):
    # Before, inf overflowed the start deadline, and NaN passed the checks of cycle time and spin.
    with pytest.raises(Exception, match=message):
        World(1, rank_env=lambda r: {name: value})


def test_empty_horo_setting_leaves_horovods_and_two_values_are_named(monkeypatch, capfd):
    """An empty HORO_<name> counts as unset, so HOROVOD_<name> applies; when both are set to
    different values, HORO_<name> applies and init says which one it ignored."""
    from horo_core import config
    monkeypatch.setenv("HORO_STALL_CHECK_DISABLE", "")
    monkeypatch.setenv("HOROVOD_STALL_CHECK_DISABLE", "1")
    monkeypatch.setenv("HORO_CACHE_CAPACITY", "")
    monkeypatch.setenv("HOROVOD_CACHE_CAPACITY", "7")
    assert (config.value("STALL_CHECK_DISABLE"), config.value("CACHE_CAPACITY")) == ("1", "7")
    with World(1, rank_env=lambda r: {"HORO_CYCLE_TIME": "2", "HOROVOD_CYCLE_TIME": "7"}):
        pass
    assert "HORO_CYCLE_TIME='2' applies; HOROVOD_CYCLE_TIME='7' is ignored" in capfd.readouterr().err
    # The same value written two ways ("60" by hororun, "60.0" in the user's shell) is no conflict.
    with World(1, rank_env=lambda r: {"HORO_START_TIMEOUT": "60", "HOROVOD_START_TIMEOUT": "60.0"}):
        pass
    assert "START_TIMEOUT" not in capfd.readouterr().err


def test_horovod_settings_for_what_horo_lacks_are_named_at_init(capfd):
    """HOROVOD_GLOO_TIMEOUT_SECONDS and the like configure parts of Horovod that Horo does not
    have: init says that they change nothing (and what to set instead, where there is something)."""
    with World(1, rank_env=lambda r: {"HOROVOD_GLOO_TIMEOUT_SECONDS": "600", "HOROVOD_NUM_NCCL_STREAMS": "2",
                                      "HOROVOD_TORUS_ALLREDUCE": ""}):
        pass
    err = capfd.readouterr().err
    assert ("HOROVOD_GLOO_TIMEOUT_SECONDS='600' has no effect in Horo: connection timeouts are "
            "HORO_START_TIMEOUT and HORO_PEER_TIMEOUT_SECONDS") in err
    assert "HOROVOD_NUM_NCCL_STREAMS='2' has no effect in Horo\n" in err
    assert "TORUS" not in err  # empty counts as unset


def test_wait_without_a_bound_waits_and_nan_is_refused():
    """An infinite or huge timeout is no timeout (it once overflowed and returned at once)."""
    timeouts = (float("inf"), 1e12)
    waiting = [threading.Event() for _ in timeouts]
    with World(2) as w:
        def body(rt):
            got = []
            for i, timeout in enumerate(timeouts):
                x = np.full(3, rt.rank + 1.0, dtype=np.float32)
                if rt.rank == 1:
                    # Submits once rank 0 is about to wait, and a little later, so that its wait
                    # starts before the collective can complete (nothing observable says it has).
                    assert waiting[i].wait(60)
                    time.sleep(0.2)
                handles = rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec(f"late.{i}", x.ctypes.data, x.ctypes.data,
                                                                     lib.HORO_FLOAT32, (3,))])
                if rt.rank == 0:
                    waiting[i].set()
                rt.wait(handles[0], timeout=timeout)
                rt.release(handles[0])
                got.append(x.tolist())
            x = np.ones(1, dtype=np.float32)
            h = rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec("nan", x.ctypes.data, x.ctypes.data, lib.HORO_FLOAT32, (1,))])
            with pytest.raises(HoroInvalidArgument, match="the timeout is NaN"):
                rt.wait(h[0], timeout=float("nan"))
            rt.wait(h[0])
            rt.release(h[0])
            return got

        for got in w.run(body):
            assert got == [[3.0] * 3] * 2


def test_scale_factors(world):
    def body(rt):
        x = np.full(1001, rt.rank + 1.0, dtype=np.float32)
        out = ops.allreduce(rt, x, "scaled", op=lib.HORO_OP_SUM, prescale_factor=2.0, postscale_factor=0.25)
        return out

    want = world.size * (world.size + 1) / 2 * 2.0 * 0.25
    for out in world.run(body):
        assert np.all(out == np.float32(want))


def test_grouped_and_fused_allreduce(world):
    # (300000,) float64 is 2.4 MB: members of at least 1 MiB are reduced in place, the rest of the
    # group through the fusion buffer, around it.
    shapes = [(3,), (2, 5), (300000,), (0,), (7, 1, 3)]

    def body(rt):
        arrays = [np.full(s, float(rt.rank + 1) * (k + 1), dtype=np.float64) for k, s in enumerate(shapes)]
        grouped = ops.grouped_allreduce(rt, arrays, [f"group.{k}" for k in range(len(shapes))])
        # Many small async allreduces in flight at once are negotiated together and fused.
        xs = [np.full(17, float(rt.rank + k), dtype=np.float32) for k in range(40)]
        outs = [np.empty_like(x) for x in xs]
        from horo_core.runtime import TensorSpec
        handles = [rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec(f"fused.{k}", x.ctypes.data, o.ctypes.data,
                                                               dtypes.FLOAT32, x.shape)])[0]
                   for k, (x, o) in enumerate(zip(xs, outs))]
        for h in handles:
            rt.wait(h)
            rt.release(h)
        return grouped, outs

    n = world.size
    for grouped, outs in world.run(body):
        for k, (s, g) in enumerate(zip(shapes, grouped)):
            assert g.shape == s and np.all(g == n * (n + 1) / 2 * (k + 1))
        for k, o in enumerate(outs):
            assert np.all(o == sum(r + k for r in range(n)))


@pytest.mark.parametrize("dtype", ALL, ids=name)
def test_allgather(world, dtype):
    def body(rt):
        got = []
        for width in (1, 7, 1000):
            rows = rt.rank % 3  # some ranks contribute nothing
            x = make(dtype, np.full((rows, width), (rt.rank % 2) + 1.0))
            got.append(read(dtype, ops.allgather(rt, x, f"ag.{width}", dtype=dtype)))
        return got

    for got in world.run(body):
        for g, width in zip(got, (1, 7, 1000)):
            want = np.concatenate([np.full((r % 3, width), (r % 2) + 1.0) for r in range(world.size)])
            if dtype == dtypes.BOOL:
                want = (want != 0).astype(np.float64)
            assert g.shape == want.shape and np.array_equal(g, want)


@pytest.mark.parametrize("dtype", ALL, ids=name)
def test_broadcast_from_every_root(world, dtype):
    def body(rt):
        got = []
        for root in range(world.size):
            for count in COUNTS:
                x = make(dtype, np.full(count, (rt.rank % 5) + 1.0))
                in_place = (root + count) % 2 == 0
                out = ops.broadcast(rt, x, root, f"bc.{root}.{count}", out=x if in_place else None, dtype=dtype)
                got.append((root, count, read(dtype, out)))
        return got

    for got in world.run(body):
        for root, count, g in got:
            value = 1.0 if dtype == dtypes.BOOL else (root % 5) + 1.0
            assert np.array_equal(g, np.full(count, value)), f"root {root} count {count}"


@pytest.mark.parametrize("dtype", ALL, ids=name)
def test_alltoall(world, dtype):
    n = world.size

    def body(rt):
        splits = [(rt.rank + j) % 3 for j in range(n)]
        rows = np.concatenate([np.full((splits[j], 2), (rt.rank * 10 + j) % 100) for j in range(n)]) \
            if sum(splits) else np.zeros((0, 2))
        out, received = ops.alltoall(rt, make(dtype, rows), "a2a", splits=splits, dtype=dtype)
        equal_in = make(dtype, np.full((2 * n, 3), rt.rank + 1.0))
        equal_out, equal_received = ops.alltoall(rt, equal_in, "a2a.equal", dtype=dtype)
        return read(dtype, out), received, read(dtype, equal_out), equal_received

    for r, (out, received, equal_out, equal_received) in enumerate(world.run(body)):
        assert received == [(j + r) % 3 for j in range(n)]
        parts = [np.full(((j + r) % 3, 2), (j * 10 + r) % 100) for j in range(n)]
        want = np.concatenate(parts) if sum(received) else np.zeros((0, 2))
        if dtype == dtypes.BOOL:
            want = (want != 0).astype(np.float64)
        assert np.array_equal(out, want)
        assert equal_received == [2] * n
        want_equal = np.concatenate([np.full((2, 3), j + 1.0) for j in range(n)])
        if dtype == dtypes.BOOL:
            want_equal = np.ones_like(want_equal)
        assert np.array_equal(equal_out, want_equal)


@pytest.mark.parametrize("dtype", ALL, ids=name)
def test_reducescatter(world, dtype):
    n = world.size

    def body(rt):
        got = []
        for rows in (0, 1, n, 2 * n + 1):
            x = make(dtype, np.full((rows, 3), rt.rank + 1.0))
            op = lib.HORO_OP_MAX if dtype == dtypes.BOOL else lib.HORO_OP_SUM
            got.append((rows, read(dtype, ops.reducescatter(rt, x, f"rs.{rows}", op=op, dtype=dtype))))
        return got

    for r, got in enumerate(world.run(body)):
        for rows, g in got:
            mine = rows // n + (1 if r < rows % n else 0)
            value = 1.0 if dtype == dtypes.BOOL else n * (n + 1) / 2
            assert g.shape == (mine, 3) and np.all(g == value), f"rows {rows}"


def test_results_go_to_an_output_of_exactly_their_size(world):
    """An allgather, alltoall or reducescatter whose output_bytes equal the result's size writes it
    to the output (Result.data_ptr 0); any other guess leaves the output alone and the core holds
    the result. Both through enqueue and through run_result_prepared, whose failures leave no
    handle behind."""
    from horo_core.runtime import prepare_run
    n = world.size
    pad = 8  # float64 sentinels on each side of the output

    def cases(rank):
        gathered = np.concatenate([np.full((r % 3, 2), r + 1.0) for r in range(n)])
        rows = np.full((rank % 3, 2), rank + 1.0)
        yield "ag", lib.HORO_ALLGATHER, rows, {}, gathered
        splits = [(rank + j) % 2 for j in range(n)]
        sent = np.concatenate([np.full((splits[j], 2), 10.0 * rank + j) for j in range(n)] + [np.zeros((0, 2))])
        received = np.concatenate([np.full(((j + rank) % 2, 2), 10.0 * j + rank) for j in range(n)] + [np.zeros((0, 2))])
        yield "a2a", lib.HORO_ALLTOALL, sent, {"splits": splits}, received
        mine = (2 * n + 1) // n + (1 if rank < (2 * n + 1) % n else 0)
        yield "rs", lib.HORO_REDUCESCATTER, np.full((2 * n + 1, 2), rank + 1.0), {}, np.full((mine, 2), n * (n + 1) / 2)

    def body(rt):
        checked = 0
        for tag, op, x, options, want in cases(rt.rank):
            for extra in (0, -1, 1):  # the exact size, one element short, one too many
                elements = want.size + extra
                if elements < 0:
                    continue
                backing = np.full(elements + 2 * pad, -7.0)
                out = backing[pad:pad + elements]
                spec = TensorSpec(f"{tag}.{extra}", x.ctypes.data, out.ctypes.data, lib.HORO_FLOAT64, x.shape,
                                  output_bytes=out.nbytes)
                (h,) = rt.enqueue(op, [spec], **options)
                try:
                    rt.wait(h)
                    res = rt.result(h)
                    assert res.nbytes == want.nbytes and res.shape == want.shape, (tag, extra, res)
                    if extra == 0:
                        assert res.data_ptr == 0, (tag, "an output of the result's size was not used")
                        got = out.reshape(want.shape)
                    else:
                        assert res.data_ptr != 0 or res.nbytes == 0, (tag, extra, "the result is not the core's")
                        got = np.empty(want.shape)
                        rt.copy_result(res, got.ctypes.data)
                        assert np.all(out == -7.0), (tag, extra, "the output was touched")
                finally:
                    rt.release(h)
                assert np.array_equal(got, want), (tag, extra, got, want)
                assert np.all(backing[:pad] == -7.0) and np.all(backing[pad + elements:] == -7.0), (tag, extra)
                checked += 1
        # The one-call form, for an allgather: a fitting guess, a wrong one, and none.
        x = np.full((rt.rank % 3, 2), rt.rank + 1.0)
        want = np.concatenate([np.full((r % 3, 2), r + 1.0) for r in range(n)])
        prepared = prepare_run(lib.HORO_ALLGATHER, "ag.run", lib.HORO_FLOAT64, x.shape, 0)
        for guess in ("fits", "wrong", "none"):
            out = np.full({"fits": want.size, "wrong": want.size + 2, "none": 0}[guess], -7.0)
            handle, filled = rt.run_result_prepared(prepared, x.ctypes.data, 0 if guess == "none" else out.ctypes.data,
                                                    out.nbytes)
            res = rt.result_of(filled)
            assert res.shape == want.shape and res.nbytes == want.nbytes
            if guess == "fits":
                assert handle == 0 and res.data_ptr == 0
                got = out.reshape(want.shape)
            else:
                assert handle != 0 and (res.data_ptr != 0 or res.nbytes == 0) and np.all(out == -7.0)
                got = np.empty(want.shape)
                rt.copy_result(res, got.ctypes.data)
                rt.release(handle)
            assert np.array_equal(got, want), (guess, got)
        # An alltoall's result carries the splits it received: they outlive the handle, released
        # when the result went to the output, until this thread's next call. Two alltoalls of
        # other splits take turns, so that a stale or freed copy shows.
        runs = []
        for shift in (1, 2):
            splits = [(rt.rank + j) % 2 + shift for j in range(n)]
            x = np.concatenate([np.full((splits[j], 2), 10.0 * rt.rank + j) for j in range(n)])
            received = [(j + rt.rank) % 2 + shift for j in range(n)]
            want = np.concatenate([np.full((received[j], 2), 10.0 * j + rt.rank) for j in range(n)])
            runs.append((prepare_run(lib.HORO_ALLTOALL, f"a2a.run.{shift}", lib.HORO_FLOAT64, x.shape, 0,
                                     splits=splits), x, received, want))
        for call in range(6):
            prepared, x, received, want = runs[call % 2]
            out = np.full(want.size, -7.0)
            handle, filled = rt.run_result_prepared(prepared, x.ctypes.data, out.ctypes.data, out.nbytes)
            assert handle == 0, "a result written to the output left a handle to release"
            assert rt.received_splits_of(filled) == received, (call, rt.received_splits_of(filled))
            res = rt.result_of(filled)
            assert res.data_ptr == 0 and res.received_splits == received, res
            assert np.array_equal(out.reshape(want.shape), want), (call, out)
            checked += 1
        # A guess that does not fit: the handle holds the result, the splits are there all the same.
        prepared, x, received, want = runs[0]
        handle, filled = rt.run_result_prepared(prepared, x.ctypes.data, 0, 0)
        try:
            assert handle != 0 and rt.received_splits_of(filled) == received
            got = np.empty(want.shape)
            rt.copy_result(rt.result_of(filled), got.ctypes.data)
        finally:
            rt.release(handle)
        assert np.array_equal(got, want)
        scalar = np.array(1.0)
        bad = prepare_run(lib.HORO_ALLGATHER, "ag.scalar", lib.HORO_FLOAT64, (), 0)
        with pytest.raises(HoroInvalidArgument, match="scalar"):
            rt.run_result_prepared(bad, scalar.ctypes.data, 0, 0)
        not_sized = prepare_run(lib.HORO_ALLREDUCE, "ar.run", lib.HORO_FLOAT64, (1,), 0)
        with pytest.raises(HoroInvalidArgument, match="takes allgather, alltoall and reducescatter"):
            rt.run_result_prepared(not_sized, scalar.ctypes.data, scalar.ctypes.data, 8)
        return checked

    assert all(checked >= 6 for checked in world.run(body))


def test_barrier_and_repeated_steps_use_the_cache(world):
    def body(rt):
        total = 0.0
        for step in range(50):  # the same names every step: answered from the response cache
            ops.barrier(rt)
            total += float(ops.allreduce(rt, np.full(4, step, dtype=np.float64), "steady")[0])
        return total

    for total in world.run(body):
        assert total == world.size * sum(range(50))


# Below this squared norm a vector's Adasum coefficient stays 1 (Horovod's sqrt(DBL_MIN)).
ADASUM_TINY = float(np.sqrt(np.finfo(np.float64).tiny))


def adasum_reference(vectors):
    """Horovod's Adasum tree over float64 copies: level by level, (v0 + v1), (v2 + v3), then up."""
    v = [np.asarray(x, np.float64).copy() for x in vectors]
    stride = 1
    while stride < len(v):
        for i in range(0, len(v) - stride, 2 * stride):
            a, b = v[i], v[i + stride]
            # Summed in order, in float64, as the core sums (np.dot's blocked sum rounds differently).
            dot, aa, bb = (float(np.cumsum(x * y)[-1]) for x, y in ((a, b), (a, a), (b, b)))
            ca = 1.0 - dot / aa * 0.5 if aa >= ADASUM_TINY else 1.0
            cb = 1.0 - dot / bb * 0.5 if bb >= ADASUM_TINY else 1.0
            v[i] = ca * a + cb * b
        stride *= 2
    return v[0]


@pytest.mark.parametrize("size", [2, 3, 4])
def test_adasum_combines_as_horovod_does(size):
    """Adasum sums orthogonal vectors and averages parallel ones; several tensors of one step get
    their own coefficients; small and large tensors (announced or allgathered) agree bitwise on
    every rank with the float64 reference."""
    rng = np.random.default_rng(size)
    small = [rng.standard_normal(7) for _ in range(size)]
    large = [rng.standard_normal(70001) for _ in range(size)]
    with World(size) as w:
        def body(rt):
            r = rt.rank
            outs = []
            for step in range(3):  # repeated: later steps are agreed without the coordinator
                outs.append(ops.grouped_allreduce(rt, [small[r].copy(), large[r].copy()], ["adasum.small",
                                                  "adasum.large"], op=lib.HORO_OP_ADASUM))
            parallel = ops.allreduce(rt, np.full(4, 2.0), "adasum.parallel", op=lib.HORO_OP_ADASUM)
            # Small parallel gradients are averaged too (a 1e-8 cut-off once summed them).
            small_parallel = ops.allreduce(rt, np.full(1024, 1e-6), "adasum.small_parallel", op=lib.HORO_OP_ADASUM)
            assert np.array_equal(small_parallel, np.full(1024, 1e-6)), small_parallel[:4]
            basis = np.zeros(size)
            basis[r] = r + 1.0
            orthogonal = ops.allreduce(rt, basis, "adasum.orthogonal", op=lib.HORO_OP_ADASUM)
            half = ops.allreduce(rt, np.full(3, r + 1.0, np.float32), "adasum.f32", op=lib.HORO_OP_ADASUM)
            # float16 and bfloat16 (bits as uint16) hold the orthogonal case exactly.
            f16 = ops.allreduce(rt, basis.astype(np.float16), "adasum.f16", op=lib.HORO_OP_ADASUM)
            bf16_bits = (basis.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            bf16 = ops.allreduce(rt, bf16_bits, "adasum.bf16", op=lib.HORO_OP_ADASUM, dtype=dtypes.BFLOAT16)
            narrow = (f16.astype(np.float64), (bf16.astype(np.uint32) << 16).view(np.float32).astype(np.float64))
            return outs, parallel, orthogonal, half, narrow

        results = w.run(body)
    want_small, want_large = adasum_reference(small), adasum_reference(large)
    for outs, parallel, orthogonal, half, narrow in results:
        assert all(np.array_equal(x, np.arange(1.0, size + 1)) for x in narrow), narrow
        for got_small, got_large in outs:
            assert np.array_equal(got_small, want_small) and np.array_equal(got_large, want_large)
        assert np.array_equal(parallel, np.full(4, 2.0))  # identical vectors: their average
        assert np.array_equal(orthogonal, np.arange(1.0, size + 1))  # orthogonal vectors: their sum
        assert np.allclose(half, adasum_reference([np.full(3, s + 1.0) for s in range(size)]), rtol=1e-6)
        assert half.tobytes() == results[0][3].tobytes()


def test_adasum_refuses_what_it_does_not_define():
    with World(1) as w:
        rt = w.runtimes[0]
        with pytest.raises(HoroInvalidArgument, match="Adasum is defined for float16, bfloat16, float32 and float64"):
            ops.allreduce(rt, np.ones(3, np.int32), "adasum.int", op=lib.HORO_OP_ADASUM)
        with pytest.raises(HoroUnsupportedError, match="Adasum applies to allreduce only"):
            ops.reducescatter(rt, np.ones(4, np.float32), "adasum.rs", op=lib.HORO_OP_ADASUM)
        assert np.array_equal(ops.allreduce(rt, np.full(2, 3.0), "adasum.one", op=lib.HORO_OP_ADASUM), [3.0, 3.0])
