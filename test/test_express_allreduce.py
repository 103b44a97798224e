"""A synchronous allreduce of one small repeated tensor, run by its caller alone (horo_run,
runtime/runtime_express.cc): with nothing else pending on the rank it is announced at once, without
a queued entry or a handle, and reduced by the caller; anything unusual during its round (a peer
late, other news in the round, a message for the coordinator) hands it over to the queue. Either
way every value must be exact, a name in flight must stay refused to a second call, and nothing may
hang. Loopback ranks (threads) here, plus one job of real processes over shared memory."""
import random
import threading
import time

import numpy as np
import pytest

import horo_runner
from core_values import contribution, expected_allreduce, make, read, reduce_cases
from horo_core import numpy_ops as ops
from horo_core._binding import lib
from horo_core.errors import HoroInvalidArgument
from loopback_world import World


def express_counts(rt):
    st = rt.stats()
    return st.express_runs, st.express_handovers


def _exact_and_some_ran_alone(size, body):
    """Runs body, which returns (the wrong values it found, express_counts), on size loopback ranks:
    no rank may find a wrong value, and some call must have run alone. The first step of each name
    is negotiated. Later, a rank with nothing pending runs its call alone; one whose background
    thread already answered the round with an empty message (it came last) takes the general path."""
    with World(size) as world:
        results = world.run(body)
    for wrong, _ in results:
        assert wrong == []
    assert sum(runs for _, (runs, _) in results) > 0


@pytest.mark.parametrize("size", [2, 3])
def test_repeated_synchronous_allreduces_are_exact_for_every_dtype_and_op(size):
    cases = list(reduce_cases())

    def body(rt):
        wrong = []
        for step in range(3):
            for dtype, op_name, op in cases:
                got = ops.allreduce(rt, make(dtype, contribution(op_name, rt.rank, 5)), f"x.{dtype}.{op_name}",
                                    op=op, dtype=dtype)
                want = expected_allreduce(op_name, dtype, size, 5)
                if not np.array_equal(read(dtype, got), want):
                    wrong.append((step, dtype, op_name, read(dtype, got).tolist(), want.tolist()))
        return wrong, express_counts(rt)

    _exact_and_some_ran_alone(size, body)


@pytest.mark.parametrize("size", [2, 3])
def test_repeated_synchronous_broadcasts_run_alone_and_copy_the_roots_tensor(size):
    """horo_run of a small repeated broadcast takes the allreduce's path: the root alone announces
    its bytes, and every member copies them, in place or into another output, for every dtype and
    root. 4100 bytes take the data plane, as before."""
    from core_values import ALL, name

    def run_broadcast(rt, array, root, tag, out):  # out None: in place
        out = array if out is None else out
        spec = ops._spec(tag, array, out, None)
        rt.run(lib.HORO_BROADCAST, tag, spec.input_ptr, spec.output_ptr, spec.dtype, spec.shape, root_rank=root)
        return out

    def values(root, step, count):
        return np.arange(count, dtype=np.float64) % 50 + 3.0 * root + step

    def body(rt):
        wrong = []
        for step in range(4):
            for dtype in ALL:
                for root in range(size):
                    mine = make(dtype, values(rt.rank, step, 5))
                    want = read(dtype, make(dtype, values(root, step, 5)))
                    got = run_broadcast(rt, mine, root, f"b.{name(dtype)}.{root}", np.empty_like(mine))
                    inplace = run_broadcast(rt, mine.copy(), root, f"b.in.{name(dtype)}.{root}", None)
                    for tag, out in (("out", got), ("in place", inplace)):
                        if not np.array_equal(read(dtype, out), want):
                            wrong.append((step, name(dtype), root, tag, read(dtype, out).tolist()))
            big = values(rt.rank, step, 1025).astype(np.float32)
            if not np.array_equal(run_broadcast(rt, big, 0, "b.big", None), values(0, step, 1025).astype(np.float32)):
                wrong.append((step, "4100 bytes"))
        return wrong, express_counts(rt)

    _exact_and_some_ran_alone(size, body)


def test_prescale_postscale_and_average_are_applied_by_the_caller():
    def body(rt):
        got = []
        for step in range(20):
            x = np.full(3, rt.rank + 1.0 + step, np.float64)
            got.append(ops.allreduce(rt, x, "scaled", op=lib.HORO_OP_AVERAGE, prescale_factor=2.0,
                                     postscale_factor=0.25))
        return got

    with World(3) as world:
        results = world.run(body)
    for got in results:
        for step, out in enumerate(got):
            assert np.array_equal(out, np.full(3, 2.0 * (2.0 + step) * 0.25))  # mean of 1..3 + step


def _repeat_until_handed_over(world, body, tries=5):
    """Runs body on every rank until rank 0 handed a call over (whether a call takes the express
    path at all depends on who holds the progress lock at that instant); returns the last results."""
    for _ in range(tries):
        before = express_counts(world.runtimes[0])[1]
        results = world.run(body)
        if express_counts(world.runtimes[0])[1] > before:
            return results
    raise AssertionError(f"rank 0 never handed an express call over in {tries} tries")


def test_a_peer_that_comes_late_gets_the_call_handed_over_and_exact():
    def body(rt):
        for _ in range(3):
            ops.allreduce(rt, np.ones(2, np.float32), "late")
        if rt.rank == 1:
            time.sleep(0.1)  # far past rank 0's spin time
        return ops.allreduce(rt, np.full(2, rt.rank + 1.0, np.float32), "late")

    with World(2) as world:
        results = _repeat_until_handed_over(world, body)
    for out in results:
        assert np.array_equal(out, np.full(2, 3.0, np.float32))


def test_a_round_with_other_news_is_completed_by_the_queue():
    # Rank 1 announces an asynchronous "b" in the round where rank 0 runs "a" alone.
    def body(rt):
        x = np.full(4, rt.rank + 1.0, np.float32)
        for _ in range(2):
            ops.allreduce(rt, x, "a")
            ops.allreduce(rt, x, "b")
        if rt.rank == 0:
            return ops.allreduce(rt, x, "a"), ops.allreduce(rt, x, "b")
        out_b = np.empty_like(x)
        handles = rt.enqueue(lib.HORO_ALLREDUCE, [ops._spec("b", x, out_b, None)])
        out_a = ops.allreduce(rt, x, "a")
        rt.wait(handles[0])
        rt.release(handles[0])
        return out_a, out_b

    with World(2) as world:
        results = _repeat_until_handed_over(world, body)
    for out_a, out_b in results:
        assert np.array_equal(out_a, np.full(4, 3.0, np.float32))
        assert np.array_equal(out_b, np.full(4, 3.0, np.float32))


def test_a_new_tensor_from_a_peer_during_the_round_reaches_the_coordinator():
    # Rank 1 sends the coordinator a request for a tensor never seen before while rank 0 waits
    # for its round of "a": rank 0 hands "a" over and negotiates "new" too.
    def body(rt):
        x = np.full(2, rt.rank + 1.0, np.float32)
        ops.allreduce(rt, x, "a")
        results = []
        for k in range(4):
            if rt.rank == 1:
                out_new = np.empty_like(x)
                handles = rt.enqueue(lib.HORO_ALLREDUCE, [ops._spec(f"new.{k}", x, out_new, None)])
                time.sleep(0.01)
                out_a = ops.allreduce(rt, x, "a")
                rt.wait(handles[0])
                rt.release(handles[0])
            else:
                out_a = ops.allreduce(rt, x, "a")
                out_new = ops.allreduce(rt, x, f"new.{k}")
            results.append((out_a, out_new))
        return results

    with World(2) as world:
        results = world.run(body)
    for per_rank in results:
        for out_a, out_new in per_rank:
            assert np.array_equal(out_a, np.full(2, 3.0, np.float32))
            assert np.array_equal(out_new, np.full(2, 3.0, np.float32))


def test_a_name_in_flight_in_an_express_call_is_refused_to_a_second_call():
    # Rank 0 waits up to its spin time (1 s) for rank 1 in an express call of "x"; another thread
    # of rank 0 submitting "x" meanwhile is told it is in flight, as through the queue.
    refused = []

    def body(rt):
        x = np.full(2, rt.rank + 1.0, np.float32)
        for _ in range(2):
            ops.allreduce(rt, x, "x")
        if rt.rank == 1:
            time.sleep(0.5)
            return ops.allreduce(rt, x, "x")

        def second():
            time.sleep(0.15)
            try:
                rt.enqueue(lib.HORO_ALLREDUCE, [ops._spec("x", x, np.empty_like(x), None)])
            except HoroInvalidArgument as exc:
                refused.append(str(exc))

        other = threading.Thread(target=second)
        other.start()
        out = ops.allreduce(rt, x, "x")
        other.join(10)
        return out

    with World(2, rank_env=lambda r: {"HORO_SPIN_MICROSECONDS": "1000000"}) as world:
        results = world.run(body)
    assert len(refused) == 1 and "is already in flight" in refused[0], refused
    for out in results:
        assert np.array_equal(out, np.full(2, 3.0, np.float32))


def test_threads_of_a_rank_making_synchronous_calls_at_once_get_exact_values():
    # Two threads per rank, each a loop of its own tensor: one may run alone while the other
    # waits for the progress lock or goes through the queue, in any order on each rank.
    steps = 150

    def body(rt):
        wrong = []

        def loop(k):
            for step in range(steps):
                got = ops.allreduce(rt, np.full(k + 1, rt.rank + step, np.float32), f"thread.{k}")
                if not np.array_equal(got, np.full(k + 1, sum(range(rt.size)) + rt.size * step, np.float32)):
                    wrong.append((k, step, got.tolist()))

        threads = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return wrong, [t.is_alive() for t in threads]

    with World(3) as world:
        results = world.run(body)
    for wrong, alive in results:
        assert wrong == [] and alive == [False, False], (wrong, alive)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_mixes_of_express_calls_queued_calls_and_delays(seed):
    # Every rank makes the same calls in the same order (async ones waited for later), each rank
    # sleeping at random: every kind of round the express path can meet, with exact sums.
    plan_rng = random.Random(seed)
    plan = []
    for step in range(60):
        kind = plan_rng.choice(["sync", "sync", "sync", "async", "new", "group"])
        plan.append((kind, plan_rng.randrange(4), step))

    def body(rt):
        rng = random.Random(seed * 100 + rt.rank)
        pending = []  # (name, handle, out, want, step, input), waited for in random order
        wrong = []

        def wait(entry):
            _, handle, out, want, at, _ = entry
            rt.wait(handle)
            rt.release(handle)
            if not np.array_equal(out, want):
                wrong.append((at, out.tolist()))

        for kind, which, step in plan:
            x = np.full(which + 1, rt.rank + step, np.float64)
            want = np.full(which + 1, sum(range(rt.size)) + rt.size * step, np.float64)
            if rng.random() < 0.2:
                time.sleep(rng.random() * 0.002)
            if kind == "sync":
                got = ops.allreduce(rt, x, f"sync.{which}")
                if not np.array_equal(got, want):
                    wrong.append((step, got.tolist()))
            elif kind == "group":
                got = ops.grouped_allreduce(rt, [x, x + 1], [f"g.{which}.0", f"g.{which}.1"])
                if not (np.array_equal(got[0], want) and np.array_equal(got[1], want + rt.size)):
                    wrong.append((step, [g.tolist() for g in got]))
            else:
                name = f"async.{which}" if kind == "async" else f"new.{step}"
                for entry in [e for e in pending if e[0] == name]:  # a name in flight is refused
                    pending.remove(entry)
                    wait(entry)
                out = np.empty_like(x)
                handle = rt.enqueue(lib.HORO_ALLREDUCE, [ops._spec(name, x, out, None)])[0]
                pending.append((name, handle, out, want, step, x))  # x must live until then
            if len(pending) > 2 or (pending and rng.random() < 0.3):
                wait(pending.pop(rng.randrange(len(pending))))
        for entry in pending:
            wait(entry)
        return wrong

    with World(3) as world:
        results = world.run(body)
    for wrong in results:
        assert wrong == []


def _process_job(steps):
    """Real processes over shared memory: a loop of synchronous allreduces, every few steps one
    rank late; returns the wrong results and this rank's express counts."""
    from horo_core import basics

    basics.init()
    rt = basics.runtime()
    wrong = []
    try:
        for step in range(steps):
            if step % 50 == 7 and rt.rank == step % rt.size:
                time.sleep(0.01)
            got = ops.allreduce(rt, np.full(3, rt.rank + step, np.float32), "loss")
            want = np.full(3, sum(range(rt.size)) + rt.size * step, np.float32)
            if not np.array_equal(got, want):
                wrong.append((step, got.tolist()))
        return wrong, express_counts(rt)
    finally:
        basics.shutdown()


def test_processes_over_shared_memory_run_repeated_allreduces_alone():
    results = horo_runner.run(_process_job, args=(400,), num_proc=3)
    for wrong, _ in results:
        assert wrong == []
    counts = [c for _, c in results]
    # Most steps ran alone; the ranks waiting for a late one handed theirs over.
    assert sum(r for r, _ in counts) > 0 and sum(h for _, h in counts) > 0, counts
