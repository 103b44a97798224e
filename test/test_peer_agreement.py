"""Steady-state steps without the coordinator (HORO_COORDINATOR_FREE, coordinator/peer_agreement.h):
a tensor submitted again with the same parameters is agreed between the ranks by announcing its
cache id to every peer, and rank 0 negotiates nothing. Every collective must give the exact values
it gives through the coordinator, changed tensors must be renegotiated (or named as a mismatch on
every rank), and evictions, joins, process sets, out-of-order submission and stalls must neither
hang nor change a result. Loopback ranks (threads) here, plus one job of real processes over shared
memory."""
import threading
import time

import numpy as np
import pytest

import horo_runner
from core_values import contribution, expected_allreduce, make, name, read, reduce_cases
from horo_core import dtypes
from horo_core import numpy_ops as ops
from horo_core._binding import lib
from horo_core.errors import HoroMismatchError, HoroShutdownError
from horo_core.runtime import TensorSpec
from loopback_world import World

STEPS = 12


def _step_values(rt, step):
    """One step of every cacheable collective (the same names and parameters every step); returns
    the results, which the caller compares with _expected."""
    r, n = rt.rank, rt.size
    out = {}
    out["sum"] = ops.allreduce(rt, np.full(5, r + 1.0 + step, np.float32), "sum")
    out["avg"] = ops.allreduce(rt, np.full(3, 2.0 * (r + step), np.float64), "avg", op=lib.HORO_OP_AVERAGE,
                               postscale_factor=0.5)
    out["max"] = ops.allreduce(rt, np.full(2, r * 10 + step, np.int32), "max", op=lib.HORO_OP_MAX)
    out["gather"] = ops.allgather(rt, np.full((r + 1, 2), r + step, np.int64), "gather")
    out["bcast"] = ops.broadcast(rt, np.full(4, 100.0 * r + step, np.float32), n - 1, "bcast")
    splits = [(r + j) % 2 + 1 for j in range(n)]
    rows = np.repeat(np.arange(n, dtype=np.float32) + 10 * r + step, splits)
    out["a2a"], out["a2a.splits"] = ops.alltoall(rt, rows, "a2a", splits=splits)
    out["rs"] = ops.reducescatter(rt, np.full((2 * n, 3), r + 1.0 + step, np.float32), "rs")
    out["group"] = ops.grouped_allreduce(rt, [np.full(2, r + step, np.float32), np.full(3, 2 * r, np.float32)],
                                         ["g0", "g1"])
    return out


def _expected(n, rank, step):
    ranks = np.arange(n)
    want = {
        "sum": np.full(5, ranks.sum() + n * (1.0 + step), np.float32),
        "avg": np.full(3, 2.0 * (ranks.mean() + step) * 0.5),
        "max": np.full(2, (n - 1) * 10 + step, np.int32),
        "gather": np.concatenate([np.full((q + 1, 2), q + step, np.int64) for q in ranks]),
        "bcast": np.full(4, 100.0 * (n - 1) + step, np.float32),
        "rs": np.full((2, 3), ranks.sum() + n * (1.0 + step), np.float32),
        "g0": np.full(2, ranks.sum() + n * step, np.float32),
        "g1": np.full(3, 2 * ranks.sum(), np.float32),
    }
    # alltoall: rank q sends (q + rank) % 2 + 1 rows of value rank + 10 q + step to this rank.
    received = [(q + rank) % 2 + 1 for q in ranks]
    want["a2a"] = np.concatenate([np.full(c, rank + 10.0 * q + step, np.float32) for q, c in zip(ranks, received)])
    want["a2a.splits"] = received
    return want


def _check_step(out, n, rank, step):
    want = _expected(n, rank, step)
    for key in ("sum", "avg", "max", "gather", "bcast", "rs", "a2a"):
        np.testing.assert_array_equal(out[key], want[key], err_msg=f"{key}, rank {rank}, step {step}")
    assert list(out["a2a.splits"]) == want["a2a.splits"]
    np.testing.assert_array_equal(out["group"][0], want["g0"])
    np.testing.assert_array_equal(out["group"][1], want["g1"])


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("enabled", ["1", "0"])
def test_repeated_steps_are_agreed_between_ranks_with_exact_values(size, enabled):
    with World(size, rank_env=lambda r: {"HORO_COORDINATOR_FREE": enabled}) as world:
        per_rank = world.run(lambda rt: [_step_values(rt, s) for s in range(STEPS)])
        stats = [rt.stats() for rt in world.runtimes]
    for rank, outs in enumerate(per_rank):
        for step, out in enumerate(outs):
            _check_step(out, size, rank, step)
    tensors = 9  # per step: sum, avg, max, gather, bcast, a2a, rs, and the group g0 + g1
    for st in stats:
        assert st.responses_agreed_by_peers + st.responses_from_coordinator == tensors * STEPS, st
        if enabled == "1":
            # Only the first step went through the coordinator (the group included).
            assert st.responses_from_coordinator == tensors, st
        else:
            assert st.responses_agreed_by_peers == 0, st


def test_shape_changed_on_one_rank_is_a_mismatch_on_every_rank_and_the_name_recovers():
    with World(3) as world:
        def body(rt):
            for _ in range(3):
                ops.allreduce(rt, np.ones(4, np.float32), "w")
            shape = 5 if rt.rank == 1 else 4
            try:
                ops.allreduce(rt, np.ones(shape, np.float32), "w")
                message = None
            except HoroMismatchError as exc:
                message = str(exc)
            again = [ops.allreduce(rt, np.full(4, rt.rank + 1.0, np.float32), "w") for _ in range(3)]
            return message, again, rt.stats()

        results = world.run(body)
    for message, again, st in results:
        assert message is not None and "Mismatched shapes" in message and "rank 1 has [5]" in message, message
        for out in again:
            np.testing.assert_array_equal(out, np.full(4, 6.0, np.float32))
        assert st.responses_agreed_by_peers >= 4, st  # steps 2-3, then the renegotiated name again


def test_shape_changed_on_every_rank_is_renegotiated():
    with World(2) as world:
        def body(rt):
            outs = []
            for count in (3, 3, 3, 7, 7, 7, 3, 3):
                outs.append(ops.allreduce(rt, np.full(count, rt.rank + 1.0, np.float32), "grows"))
            return outs, rt.stats()

        results = world.run(body)
    for outs, st in results:
        assert [o.shape[0] for o in outs] == [3, 3, 3, 7, 7, 7, 3, 3]
        assert all(np.all(o == 3.0) for o in outs)
        # Each change went to the coordinator once; the repeats after it did not.
        assert st.responses_from_coordinator == 3 and st.responses_agreed_by_peers == 5, st


def test_out_of_order_submission_with_a_tiny_cache_keeps_every_value(monkeypatch):
    """Eight tensors in flight at once, submitted in a different order on every rank, with a cache
    of three entries: announced ids are evicted under the ranks' feet and must fall back to the
    coordinator; fusion and ordering must still pair every tensor with itself."""
    monkeypatch.setenv("HORO_CACHE_CAPACITY", "3")
    names = [f"t{i}" for i in range(8)]
    with World(3) as world:
        def body(rt):
            rng = np.random.default_rng(rt.rank)
            results = []
            for step in range(10):
                order = rng.permutation(len(names))
                arrays, outs, handles = [], {}, []
                for i in order:
                    a = np.full(i + 1, 100.0 * step + i + rt.rank, np.float64)
                    o = np.empty_like(a)
                    arrays.append(a)
                    outs[i] = o
                    spec = TensorSpec(names[i], a.ctypes.data, o.ctypes.data, lib.HORO_FLOAT64, a.shape)
                    handles.extend(rt.enqueue(lib.HORO_ALLREDUCE, [spec]))
                for h in handles:
                    rt.wait_release(h)
                results.append(outs)
            return results, rt.stats()

        per_rank = world.run(body)
    for results, st in per_rank:
        for step, outs in enumerate(results):
            for i, out in outs.items():
                np.testing.assert_array_equal(out, np.full(i + 1, 3 * (100.0 * step + i) + 3.0))
        assert st.responses_agreed_by_peers + st.responses_from_coordinator == 80, st


def test_join_stops_cached_steps_until_every_rank_joined():
    with World(3) as world:
        def body(rt):
            before = [ops.allreduce(rt, np.full(2, rt.rank + 1.0, np.float32), "j") for _ in range(3)]
            during = []
            if rt.rank == 2:
                last = ops.join(rt)
            else:
                during = [ops.allreduce(rt, np.full(2, rt.rank + 1.0, np.float32), "j") for _ in range(3)]
                last = ops.join(rt)
            after = [ops.allreduce(rt, np.full(2, rt.rank + 1.0, np.float32), "j") for _ in range(3)]
            return before, during, after, last, rt.stats()

        results = world.run(body)
    assert len({r[3] for r in results}) == 1
    for rank, (before, during, after, _, st) in enumerate(results):
        assert all(np.all(o == 6.0) for o in before + after)
        assert all(np.all(o == 3.0) for o in during), during  # rank 2 joined: it adds zeros
        assert st.responses_agreed_by_peers >= 4, st  # steps 2-3 before, and after the join


def test_cached_steps_in_a_process_set_while_a_non_member_idles():
    with World(3) as world:
        set_id = world.run(lambda rt: rt.add_process_set([0, 1]))[0]

        def body(rt):
            outs = []
            if rt.rank < 2:
                outs = [ops.allreduce(rt, np.full(3, rt.rank + 1.0, np.float32), "pair", process_set_id=set_id)
                        for _ in range(10)]
            else:
                time.sleep(0.2)  # answers the pair's rounds from its background thread meanwhile
            outs.append(ops.allreduce(rt, np.ones(1, np.float32), "all"))
            return outs, rt.stats()

        results = world.run(body)
    for rank, (outs, st) in enumerate(results):
        if rank < 2:
            assert all(np.all(o == 3.0) for o in outs[:-1])
            assert st.responses_agreed_by_peers == 9, st
        assert np.all(outs[-1] == 3.0)


def test_rank_that_skips_a_cached_tensor_is_reported_then_shut_down(monkeypatch, capfd):
    monkeypatch.setenv("HORO_STALL_CHECK_TIME_SECONDS", "0.2")
    monkeypatch.setenv("HORO_STALL_SHUTDOWN_TIME_SECONDS", "0.8")
    release = threading.Event()
    failed = []

    def body(rt):
        for _ in range(3):
            ops.allreduce(rt, np.ones(2, np.float32), "every.step")
        if rt.rank == 2:
            release.wait(20)  # never submits the fourth step
            return None
        try:
            return ops.allreduce(rt, np.ones(2, np.float32), "every.step")
        finally:
            failed.append(rt.rank)
            if len(failed) == 2:
                release.set()

    with World(3) as world:
        _, errors = world.run_collecting(body)
    for rank in (0, 1):
        assert isinstance(errors[rank], HoroShutdownError), repr(errors[rank])
        assert "rank 2: [every.step]" in str(errors[rank]), str(errors[rank])
    assert "Missing ranks" in capfd.readouterr().err


def _job(steps):
    """A job of real processes: every cacheable collective for several steps; returns the checks'
    failures and this rank's response counts."""
    from horo_core import basics

    basics.init()
    rt = basics.runtime()
    failures = []
    try:
        for step in range(steps):
            try:
                _check_step(_step_values(rt, step), rt.size, rt.rank, step)
            except AssertionError as exc:
                failures.append(str(exc)[:300])
        st = rt.stats()
        return failures, st.responses_agreed_by_peers, st.responses_from_coordinator
    finally:
        basics.shutdown()


@pytest.mark.parametrize("enabled", ["1", "0"])
def test_processes_over_shared_memory_agree_between_ranks(enabled):
    results = horo_runner.run(_job, args=(STEPS,), num_proc=3, env={"HORO_COORDINATOR_FREE": enabled})
    for failures, agreed, from_coordinator in results:
        assert failures == []
        assert agreed + from_coordinator == 9 * STEPS
        assert agreed == (9 * (STEPS - 1) if enabled == "1" else 0), (agreed, from_coordinator)


def test_names_used_alone_then_in_a_group_with_a_changed_member():
    """A group must reach the coordinator whole: once u0 and u1 (cached alone) are submitted as a
    group in which only u0 changed, announcing u1 as a cached step would leave the coordinator
    waiting for the group's second member forever. Repeated, the group is announced whole."""
    with World(3) as world:
        def body(rt):
            outs = []
            for _ in range(3):
                outs.append(ops.allreduce(rt, np.full(4, rt.rank + 1.0, np.float32), "u0"))
                outs.append(ops.allreduce(rt, np.full(2, rt.rank + 1.0, np.float32), "u1"))
            for _ in range(3):
                outs.extend(ops.grouped_allreduce(rt, [np.full(3, rt.rank + 1.0, np.float32),
                                                       np.full(2, rt.rank + 1.0, np.float32)], ["u0", "u1"]))
            for _ in range(2):
                outs.append(ops.allreduce(rt, np.full(2, rt.rank + 1.0, np.float32), "u1"))
            return outs

        for outs in world.run(body, timeout=60):
            assert [o.shape[0] for o in outs] == [4, 2] * 3 + [3, 2] * 3 + [2, 2]
            assert all(np.all(o == 6.0) for o in outs)


@pytest.mark.parametrize("size", [2, 3])
def test_small_allreduces_travel_with_the_announcements_for_every_dtype_and_op(size):
    """Small cached host allreduces are reduced by every rank from the contributions that came with
    the announcements (no data-plane step): every dtype and op, scale factors, odd counts, a
    tensor at the size limit and one just above it (which takes the data plane)."""
    counts = [1, 7, 250]
    cases = list(reduce_cases())

    def body(rt):
        failures = []
        start = rt.stats()
        for step in range(3):
            for dtype, op_name, op in cases:
                for count in counts:
                    tag = f"eager.{name(dtype)}.{op_name}.{count}"
                    out = ops.allreduce(rt, make(dtype, contribution(op_name, rt.rank, count)), tag, op=op, dtype=dtype)
                    want = expected_allreduce(op_name, dtype, size, count)
                    if not np.array_equal(read(dtype, out), want):
                        failures.append(f"{tag} step {step}: got {read(dtype, out)[:4]}, want {want[:4]}")
            # Scale factors, exact in binary; integers truncate.
            for dtype in (dtypes.FLOAT16, dtypes.BFLOAT16, dtypes.FLOAT32, dtypes.INT32):
                out = ops.allreduce(rt, make(dtype, contribution("sum", rt.rank, 9)), f"eager.scaled.{name(dtype)}",
                                    prescale_factor=4.0, postscale_factor=0.125, dtype=dtype)
                want = expected_allreduce("sum", dtype, size, 9) * 0.5
                if dtype == dtypes.INT32:
                    want = np.trunc(want)
                if not np.array_equal(read(dtype, out), want):
                    failures.append(f"scaled {name(dtype)}: got {read(dtype, out)}, want {want}")
            # 4096 bytes go with the announcements, 4104 take the data plane.
            for count in (1024, 1026):
                out = ops.allreduce(rt, np.full(count, rt.rank + 1.0, np.float32), f"eager.edge.{count}")
                if not np.all(out == size * (size + 1) / 2):
                    failures.append(f"edge {count}: {out[:4]}")
        end = rt.stats()
        return failures, end.allreduce_from_announcements - start.allreduce_from_announcements

    with World(size) as world:
        results = world.run(body)
    per_step = len(cases) * len(counts) + 4 + 1  # everything but the 4104-byte tensor
    for failures, from_announcements in results:
        assert failures == []
        # The first step goes through the coordinator and the data plane.
        assert from_announcements == 2 * per_step, from_announcements


@pytest.mark.parametrize("size", [2, 3, 5])
def test_small_reducescatters_reduce_this_ranks_part_from_the_announcements(size):
    """A repeated reducescatter of at most 4096 input bytes travels with the announcements and every
    rank reduces only the rows of its own part: every dtype and op, parts of unequal rows (and none,
    with fewer rows than ranks), rows of no elements, scale factors; an input of 4100 bytes takes
    the data plane. The first step, through the coordinator and the ring, must give the same."""
    cases = list(reduce_cases())

    def part(total, index):
        base, extra = divmod(total, size)
        return index * base + min(index, extra), base + (1 if index < extra else 0)

    def body(rt):
        failures = []
        start = rt.stats()
        off_and_rows = {}
        for step in range(3):
            for dtype, op_name, op in cases:
                for rows in (1, size + 1, 2 * size + 1):
                    tag = f"rs.{name(dtype)}.{op_name}.{rows}"
                    x = make(dtype, contribution(op_name, rt.rank, rows * 2).reshape(rows, 2))
                    got = read(dtype, ops.reducescatter(rt, x, tag, op=op, dtype=dtype))
                    first, mine = off_and_rows.setdefault(rows, part(rows, rt.rank))
                    want = expected_allreduce(op_name, dtype, size, rows * 2).reshape(rows, 2)[first:first + mine]
                    if got.shape != want.shape or not np.array_equal(got, want):
                        failures.append(f"{tag} step {step}: got {got.tolist()}, want {want.tolist()}")
            x = make(dtypes.FLOAT32, contribution("sum", rt.rank, 18).reshape(9, 2))
            got = ops.reducescatter(rt, x, "rs.scaled", prescale_factor=4.0, postscale_factor=0.125)
            first, mine = part(9, rt.rank)
            want = (expected_allreduce("sum", dtypes.FLOAT32, size, 18) * 0.5).reshape(9, 2)[first:first + mine]
            if not np.array_equal(got, want):
                failures.append(f"scaled step {step}: got {got.tolist()}, want {want.tolist()}")
            empty = ops.reducescatter(rt, np.zeros((size + 1, 0), np.float32), "rs.no_elements")
            if empty.shape != (part(size + 1, rt.rank)[1], 0):
                failures.append(f"rows of no elements step {step}: shape {empty.shape}")
            # 1024 float32 go with the announcements, 1025 take the data plane.
            for count in (1024, 1025):
                got = ops.reducescatter(rt, np.full(count, rt.rank + 1.0, np.float32), f"rs.edge.{count}")
                if got.shape != (part(count, rt.rank)[1],) or not np.all(got == size * (size + 1) / 2):
                    failures.append(f"edge {count} step {step}: {got.shape}")
        end = rt.stats()
        return failures, end.reducescatter_from_announcements - start.reducescatter_from_announcements

    with World(size) as world:
        results = world.run(body)
    per_step = len(cases) * 3 + 2  # and the scaled one and the 4096-byte one (no elements: no bytes to announce)
    for failures, from_announcements in results:
        assert failures == [], failures[:10]
        # The first step goes through the coordinator and the data plane.
        assert from_announcements == 2 * per_step, from_announcements


@pytest.mark.parametrize("size", [2, 3, 5])
def test_small_allgathers_are_laid_out_from_the_announcements(size):
    """A repeated allgather of at most 4096 gathered bytes travels with the announcements and every
    rank lays the members' rows end to end itself: every dtype, members without rows, rows of
    several elements and of none; an allgather in which no member has rows, and one of 4100 bytes,
    take the data plane."""
    from core_values import ALL

    def rows_of(r, width):
        return (r % 3) * (width + 1)  # rank 0 (and 3) has no rows

    def part(r, count, value):
        return np.arange(count, dtype=np.float64) + 100.0 * r + value

    def body(rt):
        failures = []
        start = rt.stats()
        for step in range(3):
            for dtype in ALL:
                for width in (1, 3, 0):
                    rows = rows_of(rt.rank, width)
                    x = make(dtype, part(rt.rank, rows * width, step).reshape(rows, width))
                    got = read(dtype, ops.allgather(rt, x, f"ag.{name(dtype)}.{width}", dtype=dtype))
                    every = sum(rows_of(r, width) for r in range(size))
                    want = read(dtype, make(dtype, np.concatenate(
                        [part(r, rows_of(r, width) * width, step) for r in range(size)]).reshape(every, width)))
                    if got.shape != want.shape or not np.array_equal(got, want):
                        failures.append(f"{name(dtype)} width {width} step {step}: got {got.shape}, want {want.shape}")
            nobody = ops.allgather(rt, np.zeros((0, 2)), "ag.nobody")
            if nobody.shape != (0, 2):
                failures.append(f"no rows anywhere: {nobody.shape}")
            # 1024 float32 in all go with the announcements, 1025 take the data plane.
            for total in (1024, 1025):
                count = total // size + (1 if rt.rank < total % size else 0)
                got = ops.allgather(rt, part(rt.rank, count, step).astype(np.float32), f"ag.edge.{total}")
                want = np.concatenate([part(r, total // size + (1 if r < total % size else 0), step)
                                       for r in range(size)]).astype(np.float32)
                if not np.array_equal(got, want):
                    failures.append(f"edge {total} step {step}")
        end = rt.stats()
        return (failures, end.allgather_from_announcements - start.allgather_from_announcements,
                end.allgather_ring - start.allgather_ring)

    with World(size) as world:
        results = world.run(body)
    eager_per_step = len(ALL) * 2 + 1  # widths 1 and 3, and the 1024-element edge; width 0 has no bytes
    per_step = len(ALL) * 3 + 3
    for failures, from_announcements, ring in results:
        assert failures == []
        # The first step goes through the coordinator and the data plane.
        assert from_announcements == 2 * eager_per_step, from_announcements
        assert ring == 3 * per_step - 2 * eager_per_step, ring


@pytest.mark.parametrize("size", [2, 3, 5])
def test_small_alltoalls_take_this_ranks_rows_from_the_announcements(size):
    """A repeated alltoall whose every member sends at most 4096 bytes travels with the
    announcements and every rank takes the rows each member sent it: every dtype, splits of no
    rows, rows of several elements and of none, the default equal splits; an alltoall in which
    nobody sends a row, one of 1025 float32 per rank and one where a single member sends 4100 bytes
    take the data plane. The first step, through the coordinator and the data plane, must give the
    same values and received splits."""
    from core_values import ALL

    def splits_of(r):
        return [(r + 2 * j) % 3 for j in range(size)]  # some members get no rows

    def block(r, j, rows, width, step):
        # The rows member r sends member j; small values, exact in every dtype.
        return (r * 16 + j * 4 + step + np.arange(rows)[:, None] + np.arange(width)[None, :]).astype(np.float64)

    def check(failures, tag, got, got_splits, want, want_splits):
        if got.shape != want.shape or not np.array_equal(got, want) or list(got_splits) != list(want_splits):
            failures.append(f"{tag}: got {got.shape} {list(got_splits)}, want {want.shape} {list(want_splits)}")

    def body(rt):
        failures = []
        start = rt.stats()
        me = rt.rank
        for step in range(3):
            for dtype in ALL:
                for width in (1, 3, 0):
                    splits = splits_of(me)
                    x = np.concatenate([block(me, j, splits[j], width, step) for j in range(size)])
                    out, received = ops.alltoall(rt, make(dtype, x), f"a2a.{name(dtype)}.{width}", splits=splits,
                                                 dtype=dtype)
                    want_splits = [splits_of(q)[me] for q in range(size)]
                    want = np.concatenate([block(q, me, want_splits[q], width, step) for q in range(size)])
                    check(failures, f"{name(dtype)} width {width} step {step}", read(dtype, out), received,
                          read(dtype, make(dtype, want)), want_splits)
            x = np.concatenate([block(me, j, 2, 2, step) for j in range(size)]).astype(np.float32)
            out, received = ops.alltoall(rt, x, "a2a.equal")
            want = np.concatenate([block(q, me, 2, 2, step) for q in range(size)]).astype(np.float32)
            check(failures, f"equal splits step {step}", out, received, want, [2] * size)
            out, received = ops.alltoall(rt, np.zeros((0, 2), np.float32), "a2a.nobody", splits=[0] * size)
            check(failures, f"nobody step {step}", out, received, np.zeros((0, 2), np.float32), [0] * size)
            # 1024 float32 per member go with the announcements, 1025 take the data plane, and so
            # does everybody's alltoall once one member sends 1025.
            for tag, rows_of in (("1024", lambda r: 1024), ("1025", lambda r: 1025),
                                 ("one.1025", lambda r: 1025 if r == 1 else size)):
                def splits_for(r):
                    base, extra = divmod(rows_of(r), size)
                    return [base + (1 if j < extra else 0) for j in range(size)]
                splits = splits_for(me)
                x = np.concatenate([block(me, j, splits[j], 1, step) for j in range(size)]).astype(np.float32)
                out, received = ops.alltoall(rt, x, f"a2a.edge.{tag}", splits=splits)
                want_splits = [splits_for(q)[me] for q in range(size)]
                want = np.concatenate([block(q, me, want_splits[q], 1, step) for q in range(size)]).astype(np.float32)
                check(failures, f"edge {tag} step {step}", out, received, want, want_splits)
        end = rt.stats()
        return failures, end.alltoall_from_announcements - start.alltoall_from_announcements

    with World(size) as world:
        results = world.run(body)
    eager_per_step = len(ALL) * 2 + 2  # widths 1 and 3, equal splits, the 1024-row edge
    for failures, from_announcements in results:
        assert failures == [], failures[:10]
        # The first step goes through the coordinator and the data plane.
        assert from_announcements == 2 * eager_per_step, from_announcements


@pytest.mark.parametrize("size", [2, 3])
def test_small_broadcasts_copy_the_roots_tensor_from_its_announcement(size):
    """A repeated broadcast of at most 4096 bytes travels with the root's announcement (the other
    members announce no bytes) and every member copies the root's tensor itself: every dtype and
    every root, in place and into another output. An empty tensor (no bytes from anyone, as an
    allgather without rows) and one of 4100 bytes take the data plane. The first step, through the
    coordinator and the data plane, must give the same values."""
    from core_values import ALL

    def values(root, step, count):
        return np.arange(count, dtype=np.float64) % 50 + 3.0 * root + step

    def body(rt):
        failures = []
        start = rt.stats()
        for step in range(3):
            for dtype in ALL:
                for root in range(size):
                    mine = make(dtype, values(rt.rank, step, 6).reshape(2, 3))
                    want = read(dtype, make(dtype, values(root, step, 6).reshape(2, 3)))
                    got = ops.broadcast(rt, mine.copy(), root, f"bc.{name(dtype)}.{root}", dtype=dtype)
                    inplace = mine.copy()
                    ops.broadcast(rt, inplace, root, f"bc.in.{name(dtype)}.{root}", out=inplace, dtype=dtype)
                    for tag, out in (("out", got), ("in place", inplace)):
                        if out.shape != (2, 3) or not np.array_equal(read(dtype, out), want):
                            failures.append(f"{name(dtype)} root {root} step {step} {tag}: {read(dtype, out).tolist()}")
            empty = ops.broadcast(rt, np.zeros((0, 4), np.float32), size - 1, "bc.empty")
            if empty.shape != (0, 4):
                failures.append(f"empty: {empty.shape}")
            # 1024 float32 go with the root's announcement, 1025 take the data plane.
            for count in (1024, 1025):
                got = ops.broadcast(rt, values(rt.rank, step, count).astype(np.float32), 1, f"bc.edge.{count}")
                if not np.array_equal(got, values(1, step, count).astype(np.float32)):
                    failures.append(f"edge {count} step {step}")
        end = rt.stats()
        return failures, end.broadcast_from_announcements - start.broadcast_from_announcements

    with World(size) as world:
        results = world.run(body)
    eager_per_step = len(ALL) * size * 2 + 1  # every dtype, root and output, and the 1024-element edge
    for failures, from_announcements in results:
        assert failures == [], failures[:10]
        # The first step goes through the coordinator and the data plane.
        assert from_announcements == 2 * eager_per_step, from_announcements


def test_announced_data_is_reduced_alike_on_every_rank():
    """Random float32 values: the sum depends on the order of the additions, so every rank must
    reduce the contributions in the same (member) order to get the same bytes."""
    def body(rt):
        rng = np.random.default_rng(rt.rank)
        outs = []
        for step in range(4):
            values = (rng.standard_normal(300) * 10.0 ** rng.integers(-6, 6, 300)).astype(np.float32)
            outs.append(ops.allreduce(rt, values, "random", op=lib.HORO_OP_AVERAGE))
        return outs, rt.stats().allreduce_from_announcements

    with World(3) as world:
        results = world.run(body)
    assert all(r[1] == 3 for r in results)
    for step in range(4):
        first = results[0][0][step]
        for outs, _ in results[1:]:
            assert outs[step].tobytes() == first.tobytes(), step


def test_ranks_with_different_fusion_settings_fuse_agreed_steps_alike():
    """Agreed steps are fused by each rank itself: it must use the threshold the coordinator stamped
    in the responses, not its own setting, or the ranks run different collectives."""
    names = [f"f{i}" for i in range(6)]
    env = {0: {"HORO_FUSION_THRESHOLD": str(64 << 20)}, 1: {"HORO_FUSION_THRESHOLD": "0"},
           2: {"HORO_FUSION_THRESHOLD": "64"}}

    def body(rt):
        results = []
        for step in range(6):
            arrays, outs, handles = [], [], []
            for i, n in enumerate(names):
                a = np.full(2000 + i, float(rt.rank + step + i), np.float32)  # above the 4 KB of announcements
                o = np.empty_like(a)
                arrays.append(a)
                outs.append(o)
                handles.extend(rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec(n, a.ctypes.data, o.ctypes.data,
                                                                          lib.HORO_FLOAT32, a.shape)]))
            for h in handles:
                rt.wait_release(h)
            results.append(outs)
        return results

    with World(3, rank_env=lambda r: env[r]) as world:
        per_rank = world.run(body, timeout=60)
    for results in per_rank:
        for step, outs in enumerate(results):
            for i, out in enumerate(outs):
                np.testing.assert_array_equal(out, np.full(2000 + i, 3.0 * (step + i) + 3.0, np.float32))


def test_cached_alltoall_whose_splits_no_longer_fit_is_refused_on_every_rank():
    from horo_core.errors import HoroInvalidArgument

    with World(2) as world:
        def body(rt):
            for _ in range(2):
                ops.alltoall(rt, np.ones((8, 4), np.float32), "a2a.fit", splits=[4, 4])
            try:
                ops.alltoall(rt, np.ones((2, 4), np.float32), "a2a.fit", splits=[4, 4])
            except HoroInvalidArgument as exc:
                return str(exc)
            return None

        messages = world.run(body, timeout=60)
    for message in messages:
        assert message is not None and "splits that sum to 8, expected its first dimension 2" in message, message


def test_cached_tensor_submitted_just_before_a_join_runs_with_the_joined_ranks():
    """Rank 0 submits a cached allreduce and joins without waiting for it while the others have
    joined: it must run with the joined ranks' neutral values (as through the coordinator), not wait
    for announcements that will never come."""
    with World(3) as world:
        def body(rt):
            for _ in range(3):
                ops.allreduce(rt, np.full(3, rt.rank + 1.0, np.float32), "late")
            if rt.rank != 0:
                return ops.join(rt), None
            a = np.full(3, 10.0, np.float32)
            o = np.empty_like(a)
            (handle,) = rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec("late", a.ctypes.data, o.ctypes.data,
                                                                   lib.HORO_FLOAT32, a.shape)])
            last = ops.join(rt)
            rt.wait_release(handle)
            return last, o

        results = world.run(body, timeout=60)
    assert len({last for last, _ in results}) == 1
    np.testing.assert_array_equal(results[0][1], np.full(3, 10.0, np.float32))


@pytest.mark.parametrize("count", [4, 2000], ids=["announced with its data", "on the data plane"])
def test_a_join_right_after_a_cached_submission_keeps_the_ranks_in_step(monkeypatch, count):
    """Rank 1 submits a cached allreduce without waiting and joins while the round carrying its
    announcement may still be open. That round can complete the step on every rank: rank 1 must run
    it too (it used to take its sent announcement back, so the others ran the step without it: a
    hang on the data plane, a wrong value for small tensors, or a stale request at the coordinator
    that later failed the others' smaller batch as a mismatch)."""
    monkeypatch.setenv("HORO_PEER_TIMEOUT_SECONDS", "10")
    iterations = 30

    def body(rt):
        rng = np.random.default_rng(rt.rank)
        got, errors = [], []
        for it in range(iterations):
            name = f"w{it}"
            for _ in range(3):
                ops.allreduce(rt, np.ones(count, np.float32), name)
            if rt.rank == 1:
                a, o = np.ones(count, np.float32), np.empty(count, np.float32)
                (handle,) = rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec(name, a.ctypes.data, o.ctypes.data,
                                                                       lib.HORO_FLOAT32, a.shape)])
                until = time.perf_counter() + rng.random() * 0.0005  # let its announcement go out
                while time.perf_counter() < until:
                    pass
                ops.join(rt)
                rt.wait_release(handle)
                got.append(float(o[0]))
                continue
            got.append(float(ops.allreduce(rt, np.ones(count, np.float32), name)[0]))
            try:  # rank 1 has joined: a smaller last batch
                out = ops.allreduce(rt, np.full(3, rt.rank + 1.0, np.float32), name)
                if not np.all(out == 4.0):
                    errors.append(f"iteration {it}: {out}")
            except Exception as exc:  # noqa: BLE001 - reported below with the iteration
                errors.append(f"iteration {it}: {type(exc).__name__}: {exc}")
            ops.join(rt)
        return got, errors

    with World(3) as world:
        results = world.run(body, timeout=120)
    assert [errors for _, errors in results] == [[], [], []]
    assert [got for got, _ in results] == [[3.0] * iterations] * 3


def _random_plan(seed, steps):
    """Per step: (name, kind, count) of a random subset of eight names; a tensor's kind is fixed,
    its count changes now and then (the same on every rank)."""
    plan_rng = np.random.default_rng(seed)
    kinds = ["allreduce", "allgather", "broadcast"]
    tensors = {f"r{i}": [kinds[i % 3], int(plan_rng.choice([3, 700, 1500]))] for i in range(8)}
    plan = []
    for _ in range(steps):
        for spec in tensors.values():
            if plan_rng.random() < 0.1:
                spec[1] = int(plan_rng.choice([3, 700, 1500]))
        chosen = sorted(plan_rng.choice(sorted(tensors), size=int(plan_rng.integers(1, 9)), replace=False))
        entries = [(n, tensors[n][0], tensors[n][1]) for n in chosen]
        if plan_rng.random() < 0.5:  # a grouped allreduce of two tensors
            entries.append(("g", "group", (int(plan_rng.choice([3, 900])), int(plan_rng.choice([3, 900])))))
        plan.append(entries)
    return plan


def _random_steps(rt, seed, steps):
    """Runs _random_plan(seed, steps) on this rank, submitting in its own random order and waiting
    in another; returns the wrong results and the stats."""
    size = rt.size

    def values(rank, step, name, count):
        return np.full(count, float((rank + 1) * (step + 1) + int(name[1:])), np.float64)

    rng = np.random.default_rng(1000 * seed + rt.rank)
    bad = []
    for step, entries in enumerate(_random_plan(seed, steps)):
        pending = []
        for j in rng.permutation(len(entries)):
            name, kind, count = entries[j]
            if kind == "group":
                arrays = [values(rt.rank, step, f"g{k}", c) for k, c in enumerate(count)]
                outs = [np.empty_like(a) for a in arrays]
                specs = [TensorSpec(f"g{k}", a.ctypes.data, o.ctypes.data, lib.HORO_FLOAT64, a.shape)
                         for k, (a, o) in enumerate(zip(arrays, outs))]
                for k, h in enumerate(rt.enqueue(lib.HORO_ALLREDUCE, specs)):
                    pending.append((f"g{k}", "allreduce", count[k], arrays[k], outs[k], h))
                continue
            if kind == "allgather":
                a = values(rt.rank, step, name, count * (rt.rank + 1))
                (h,) = rt.enqueue(lib.HORO_ALLGATHER, [TensorSpec(name, a.ctypes.data, 0, lib.HORO_FLOAT64, a.shape)])
                pending.append((name, kind, count, a, None, h))
                continue
            a = values(rt.rank, step, name, count)
            o = np.empty_like(a)
            op = lib.HORO_BROADCAST if kind == "broadcast" else lib.HORO_ALLREDUCE
            (h,) = rt.enqueue(op, [TensorSpec(name, a.ctypes.data, o.ctypes.data, lib.HORO_FLOAT64, a.shape)],
                              root_rank=step % size)
            pending.append((name, kind, count, a, o, h))
        for j in rng.permutation(len(pending)):
            name, kind, count, a, o, h = pending[j]
            rt.wait(h)
            if kind == "allgather":
                res = rt.result(h)
                o = np.empty(res.shape, np.float64)
                rt.copy_result(res, o.ctypes.data)
                want = np.concatenate([values(q, step, name, count * (q + 1)) for q in range(size)])
            elif kind == "broadcast":
                want = values(step % size, step, name, count)
            else:
                want = sum(values(q, step, name, count) for q in range(size))
            rt.release(h)
            if o.shape != want.shape or not np.array_equal(o, want):
                bad.append(f"step {step} {name} ({kind}, {count}): got {o[:3]}, want {want[:3]}")
    return bad, rt.stats()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_steps_in_random_orders_with_a_small_cache(monkeypatch, seed):
    """A randomized schedule (the same on every rank): each step submits a random subset of eight
    names (allreduce, allgather or broadcast; small tensors that travel with the announcements and
    larger ones that do not) and often a grouped allreduce, sometimes with a new shape, every rank
    in its own random order and waiting in another, with a cache of four entries. Every result must
    be exact and nothing may hang."""
    monkeypatch.setenv("HORO_CACHE_CAPACITY", "4")
    with World(3) as world:
        results = world.run(lambda rt: _random_steps(rt, seed, 30), timeout=120)
    for bad, st in results:
        assert bad == []
        assert st.responses_agreed_by_peers > 0, st


def _random_job(seed, steps):
    from horo_core import basics

    basics.init()
    try:
        bad, st = _random_steps(basics.runtime(), seed, steps)
        return bad, st.responses_agreed_by_peers
    finally:
        basics.shutdown()


def test_random_steps_between_processes_over_shared_memory():
    results = horo_runner.run(_random_job, args=(6, 30), num_proc=3, env={"HORO_CACHE_CAPACITY": "4"})
    for bad, agreed in results:
        assert bad == []
        assert agreed > 0


@pytest.mark.parametrize("seed", [4, 5])
def test_random_allreduce_steps_with_random_joins(seed):
    """Randomized steps of cached allreduces (small and large, and a group) in per-rank random
    orders, where in some steps one rank joins at once instead of submitting: the others' results
    leave it out, every join returns the same last rank, and the steps after it are agreed between
    the ranks again."""
    size, steps = 3, 24
    plan_rng = np.random.default_rng(seed)
    plan = []
    for step in range(steps):
        names = sorted(plan_rng.choice([f"j{i}" for i in range(6)], size=int(plan_rng.integers(1, 7)), replace=False))
        joiner = int(plan_rng.integers(0, size)) if plan_rng.random() < 0.3 else -1
        plan.append((names, joiner))

    def count_of(name):
        return 3 if int(name[1:]) % 2 else 900

    def values(rank, step, name):
        return np.full(count_of(name), float((rank + 1) * (step + 1) + int(name[1:])), np.float64)

    def body(rt):
        rng = np.random.default_rng(1000 * seed + rt.rank)
        bad, lasts = [], {}
        for step, (names, joiner) in enumerate(plan):
            if rt.rank == joiner:
                lasts[step] = ops.join(rt)
                continue
            pending = []
            for j in rng.permutation(len(names) + 1):
                if j == len(names):  # a grouped allreduce of two tensors, every step
                    arrays = [values(rt.rank, step, n) for n in ("j6", "j7")]
                    outs = [np.empty_like(a) for a in arrays]
                    specs = [TensorSpec(n, a.ctypes.data, o.ctypes.data, lib.HORO_FLOAT64, a.shape)
                             for n, a, o in zip(("j6", "j7"), arrays, outs)]
                    for n, a, o, h in zip(("j6", "j7"), arrays, outs, rt.enqueue(lib.HORO_ALLREDUCE, specs)):
                        pending.append((n, a, o, h))
                    continue
                a = values(rt.rank, step, names[j])
                o = np.empty_like(a)
                (h,) = rt.enqueue(lib.HORO_ALLREDUCE, [TensorSpec(names[j], a.ctypes.data, o.ctypes.data,
                                                                  lib.HORO_FLOAT64, a.shape)])
                pending.append((names[j], a, o, h))
            for j in rng.permutation(len(pending)):
                name, a, o, h = pending[j]
                rt.wait_release(h)
                want = sum(values(q, step, name) for q in range(size) if q != joiner)
                if not np.array_equal(o, want):
                    bad.append(f"step {step} {name} (joiner {joiner}): got {o[:3]}, want {want[:3]}")
            if joiner >= 0:
                lasts[step] = ops.join(rt)
        return bad, lasts, rt.stats()

    with World(size) as world:
        results = world.run(body, timeout=120)
    for bad, lasts, st in results:
        assert bad == []
        assert lasts == results[0][1]
        assert st.responses_agreed_by_peers > 0, st
    assert set(results[0][1]) == {step for step, (_, joiner) in enumerate(plan) if joiner >= 0}
