"""Who makes progress: a caller waiting on a handle runs the negotiation and the collectives itself
(HORO_CALLER_PROGRESS, runtime/runtime_progress.cc), the background thread otherwise. Results must not
depend on which thread ran a pass, however many threads wait at once."""
import os
import threading

import numpy as np
import pytest

from horo_core._binding import lib
from horo_core.runtime import TensorSpec
from loopback_world import World


def _allreduce(rt, name, values, caller_waits):
    out = np.empty_like(values)
    spec = TensorSpec(name, values.ctypes.data, out.ctypes.data, lib.HORO_FLOAT32, values.shape, 0)
    (handle,) = rt.enqueue(lib.HORO_ALLREDUCE, [spec], caller_waits=caller_waits)
    return handle, out


def _threads_reduce(rt, threads, steps, caller_waits):
    """threads threads of this rank each run steps synchronous allreduces of their own names at
    once; returns {(thread, step): result}."""
    results = {}
    errors = []

    def body(t):
        try:
            for s in range(steps):
                values = np.full(5, rt.rank + 1 + 10 * t + 100 * s, dtype=np.float32)
                handle, out = _allreduce(rt, f"t{t}.s{s}", values, caller_waits)
                rt.wait_release(handle)
                results[(t, s)] = out
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert not w.is_alive(), "a waiting thread did not finish (hang)"
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("progress", ["1", "0"])
@pytest.mark.parametrize("caller_waits", [True, False])
def test_many_waiting_threads_per_rank_get_exact_results(progress, caller_waits):
    size, threads, steps = 3, 4, 25
    world = World(size, rank_env=lambda r: {"HORO_CALLER_PROGRESS": progress})
    try:
        per_rank = world.run(lambda rt: _threads_reduce(rt, threads, steps, caller_waits))
        stats = [rt.stats() for rt in world.runtimes]
    finally:
        for rt in world.runtimes:
            rt.destroy()
    ranks_sum = size * (size + 1) // 2
    for results in per_rank:
        for t in range(threads):
            for s in range(steps):
                expected = ranks_sum + size * (10 * t + 100 * s)
                np.testing.assert_array_equal(results[(t, s)], np.full(5, expected, dtype=np.float32))
    if progress == "1":
        # Waiting callers ran passes (the background thread may have run some too): on every rank
        # when callers said they wait, which leaves the background thread asleep; otherwise a caller
        # gets a pass only when it wins the try-lock against the awake background thread, which on a
        # loaded host may not happen on every rank.
        if caller_waits:
            assert all(st.passes_by_callers > 0 for st in stats), stats
        else:
            assert sum(st.passes_by_callers for st in stats) > 0, stats
    else:
        assert all(st.passes_by_callers == 0 and st.passes_by_background > 0 for st in stats), stats


def test_handle_whose_caller_said_it_waits_but_polls_still_completes():
    """caller_waits=True leaves the background thread asleep; a caller that only polls (which
    does not drive) must still see the handle complete, through the background thread."""
    world = World(2)
    try:
        def body(rt):
            values = np.full(3, rt.rank + 1.0, dtype=np.float32)
            handle, out = _allreduce(rt, "polled", values, caller_waits=True)
            done = threading.Event()

            def poll_until_done():
                while not rt.poll(handle):
                    pass
                done.set()

            poller = threading.Thread(target=poll_until_done, daemon=True)
            poller.start()
            assert done.wait(60), "the background thread never ran the negotiation"
            rt.wait_release(handle)
            return out

        for out in world.run(body):
            np.testing.assert_array_equal(out, np.full(3, 3.0, dtype=np.float32))
        assert all(rt.stats().passes_by_background > 0 for rt in world.runtimes)
    finally:
        for rt in world.runtimes:
            rt.destroy()


def test_a_caller_that_polls_in_a_loop_moves_the_collective_itself():
    """poll(driving=True), the user's poll(): a loop of them runs the negotiation and the data
    movement on the polling thread (the background thread, left asleep by caller_waits, need not
    get the core the loop holds)."""
    world = World(2)
    try:
        def body(rt):
            before = rt.stats().passes_by_callers
            outs = []
            for i in range(20):
                values = np.full(3, rt.rank + 1.0 + i, dtype=np.float32)
                handle, out = _allreduce(rt, f"driven.{i}", values, caller_waits=True)
                while not rt.poll(handle, driving=True):
                    pass
                rt.wait_release(handle)
                outs.append(out)
            return outs, rt.stats().passes_by_callers - before

        for outs, passes in world.run(body):
            for i, out in enumerate(outs):
                np.testing.assert_array_equal(out, np.full(3, 3.0 + 2 * i, dtype=np.float32))
            assert passes > 0
    finally:
        for rt in world.runtimes:
            rt.destroy()


def test_async_operations_complete_while_nobody_waits():
    """Enqueued without caller_waits, a batch completes through the background thread alone;
    waiting afterwards finds every handle done."""
    world = World(3)
    try:
        def body(rt):
            pending = []
            for i in range(20):
                values = np.full(4, float(rt.rank + i), dtype=np.float32)
                pending.append(_allreduce(rt, f"async.{i}", values, caller_waits=False))
            while not all(rt.poll(h) for h, _ in pending):
                pass
            outs = []
            for h, out in pending:
                rt.wait_release(h)
                outs.append(out)
            return outs

        for outs in world.run(body):
            for i, out in enumerate(outs):
                np.testing.assert_array_equal(out, np.full(4, 3.0 + 3 * i, dtype=np.float32))
    finally:
        for rt in world.runtimes:
            rt.destroy()


def _async_then_wait_job(calls):
    """Runs on every rank: calls asynchronous allreduces (caller_waits=False) of one name, each
    waited for at once; then one enqueued right after a synchronous call and only polled (without
    driving) until done. Returns (failures, background passes in the loop, the caller's)."""
    import numpy as np

    from horo_core import basics
    from horo_core._binding import lib
    from horo_core.runtime import prepare_run

    basics.init()
    rt = basics.runtime()
    n = basics.size()
    x = np.full(3, rt.rank + 1.0, np.float32)
    out = np.empty_like(x)
    total = n * (n + 1) / 2
    described = prepare_run(lib.HORO_ALLREDUCE, "allreduce.async", lib.HORO_FLOAT32, (3,), 0, lib.HORO_OP_SUM,
                            caller_waits=False)
    failures = []
    for _ in range(20):  # the first calls go through the coordinator
        rt.wait_release(rt.enqueue_prepared(described, x.ctypes.data, out.ctypes.data))
    before = rt.stats()
    for i in range(calls):
        out[:] = 0
        rt.wait_release(rt.enqueue_prepared(described, x.ctypes.data, out.ctypes.data))
        if not np.all(out == total):
            failures.append(f"call {i}: {out}")
    after = rt.stats()
    # Nobody waits for this one: the background thread, parked after the synchronous call, must
    # still take it up.
    rt.run(lib.HORO_ALLREDUCE, "sync", x.ctypes.data, out.ctypes.data, lib.HORO_FLOAT32, (3,), 0)
    out[:] = 0
    handle = rt.enqueue_prepared(described, x.ctypes.data, out.ctypes.data)
    while not rt.poll(handle):
        pass
    rt.wait_release(handle)
    if not np.all(out == total):
        failures.append(f"the polled call: {out}")
    basics.shutdown()
    return (failures, after.passes_by_background - before.passes_by_background,
            after.passes_by_callers - before.passes_by_callers)


@pytest.mark.alone
def test_an_async_call_waited_for_at_once_leaves_the_background_thread_asleep():
    """An asynchronous enqueue woke the background thread, though a caller that waits at once runs
    the collective itself: on 2 ranks of 2 cores the wake-up tripled the cost of
    ``synchronize(allreduce_async_(t))``. Enqueued while the thread is parked after a caller's pass,
    it is now left to the waiting caller (or to the park's end, 1 ms at most). Measured: 2-8
    background passes in 500 calls on a quiet host, 109 beside another job's 2 busy ranks (a rank
    switched out between its calls comes back past the 50 us window), against 438-492 with the
    wake-up. A wait that finds its call done (run by the background thread) counts as a drive
    too: before, such a caller's next enqueue woke the thread again, which often ran that call as
    well, and so on.

    The count depends on how the host schedules the ranks. On a host of 2 AMD EPYC vCPUs it was
    25-293 per rank before that fix (256 in one run of the suite) and 16-158 in most jobs since,
    but 206-438 in some jobs of one bad period of a few minutes, in which a tenth of the calls took
    about half a millisecond with either build (left alone, see docs/benchmarks.md). So a job over the
    bound of half the calls is run again, up to three jobs in all; with the wake-up on every
    enqueue every job is over it."""
    import horo_runner

    calls, jobs = 500, 3
    counts = []
    for _ in range(jobs):
        reports = horo_runner.run(_async_then_wait_job, args=(calls,), num_proc=2,
                                  env={"HORO_PEER_TIMEOUT_SECONDS": "60"})
        for rank, (failures, _, callers) in enumerate(reports):
            assert failures == [], f"rank {rank}: {failures[:5]}"
            assert callers > 0, f"rank {rank}: callers ran no pass"
        counts.append([background for _, background, _ in reports])
        if max(counts[-1]) < calls // 2:
            return
    pytest.fail(f"the background thread ran {counts} passes (per job, per rank) in {calls} calls")


def _shared_core_job(blocks, calls, pair_calls, done_file):
    """Runs on every rank, all ranks pinned to one CPU: blocks of calls synchronous allreduces of
    one name, then (with 3 ranks: ranks 0 and 1 only, while rank 2 sleeps until rank 0 creates
    done_file) pair_calls in a set of those two, then one together. Returns (failures, agreement
    rounds per block, passes by callers in the blocks, and on rank 2 of 3 the passes its background
    thread ran while it slept)."""
    import os
    import time

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before init: the runtime's threads inherit it
    import numpy as np

    from horo_core import basics
    from horo_core._binding import lib

    basics.init()
    rt = basics.runtime()
    n, rank = basics.size(), basics.rank()
    failures = []
    x = np.full(3, rank + 1.0, np.float32)
    out = np.empty_like(x)
    total = n * (n + 1) / 2

    def allreduce(name, process_set_id=0):
        # The synchronous path of the framework adapters (hvd.allreduce_): the caller drives.
        rt.run(lib.HORO_ALLREDUCE, name, x.ctypes.data, out.ctypes.data, lib.HORO_FLOAT32, (3,), process_set_id)
        return out

    pair = rt.add_process_set([0, 1]) if n > 2 else 0
    for _ in range(20):  # the first call goes through the coordinator; then the ranks agree alone
        allreduce("loop")
    start = rt.stats()
    rounds = []  # per block of calls: another job on the core can add rounds to one block, not to all
    for block in range(blocks):
        before = rt.stats().rounds_agreed
        for i in range(calls):
            allreduce("loop")
            if not np.all(out == total):
                failures.append(f"loop block {block} call {i}: {out}")
        rounds.append(rt.stats().rounds_agreed - before)
    end = rt.stats()
    # Rounds are global: while rank 2 sleeps, every round of the pair's cached steps needs its
    # message, which only its background thread can send (the first one perhaps an answer its
    # caller left unsent when its last call finished).
    background = None
    if n > 2 and rank < 2:
        for i in range(pair_calls):
            allreduce("pair", pair)
            if not np.all(out == 3.0):
                failures.append(f"pair call {i}: {out}")
        if rank == 0:
            open(done_file, "w").close()
    elif n > 2:
        before = rt.stats().passes_by_background
        deadline = time.monotonic() + 120
        while not os.path.exists(done_file) and time.monotonic() < deadline:
            time.sleep(0.01)
        background = rt.stats().passes_by_background - before
    allreduce("together")
    if not np.all(out == total):
        failures.append(f"together: {out}")
    basics.shutdown()
    return failures, rounds, end.passes_by_callers - start.passes_by_callers, background


@pytest.mark.alone
@pytest.mark.parametrize("np_", [2, 3])
def test_ranks_sharing_a_core_agree_one_round_per_call(np_, tmp_path):
    """On a shared core a rank often reads a peer's next round message in the pass that finishes its
    own call. Answering it at once with an empty message pushed its next call's announcement into
    the round after: two rounds, and two switches between the ranks, per call. The answer now waits
    for the caller's next call (or the background thread), so a loop takes about one round per call."""
    import horo_runner

    blocks, calls, pair_calls = 8, 300, 200
    env = {"HORO_PEER_TIMEOUT_SECONDS": "60", "HORO_DYNAMIC_PROCESS_SETS": "1"}
    # Measured: 1.0-1.2 rounds per call on a quiet core, up to 1.7 in a block shared with two busy
    # processes, 1.8-1.9 in every block of a job that ran beside another test suite on both cores,
    # 1.33-1.44 in every block of three jobs on a contended host (CI from a fresh clone, nothing
    # else running); 2.0 in every block with the answer sent at once. A job whose every block was
    # crowded out is run again (at most three jobs): the old behaviour fails all three.
    for attempt in range(3):
        done_file = str(tmp_path / f"pair_done.{attempt}")
        reports = horo_runner.run(_shared_core_job, args=(blocks, calls, pair_calls, done_file),
                                  num_proc=np_, env=env, bind_to="none")
        for rank, (failures, rounds, caller_passes, _) in enumerate(reports):
            assert failures == [], f"rank {rank}: {failures[:5]}"
            assert caller_passes > 0, f"rank {rank}: callers ran no pass"
            assert all(r >= calls for r in rounds), f"rank {rank}: {rounds} rounds for blocks of {calls} calls"
        crowded = [(rank, rounds) for rank, (_, rounds, _, _) in enumerate(reports) if min(rounds) > 1.5 * calls]
        if not crowded:
            break
    assert not crowded, f"(rank, rounds per block of {calls} calls) in three jobs, the last: {crowded}"
    if np_ == 3:
        # At least one pass per round of the pair (more when a pass finds nothing new to send).
        assert reports[2][3] >= pair_calls, f"rank 2's background thread ran {reports[2][3]} passes"


def _poll_job(blocks, calls, pin):
    """Runs on every rank: blocks of calls synchronous allreduces of one name; pin "own" puts rank r
    on the r-th CPU of the launcher's set, "one" every rank on the first, "none" leaves them.
    Returns (failures, [(polls, yields) per block])."""
    import os

    cpus = sorted(os.sched_getaffinity(0))
    rank = int(os.environ["HORO_RANK"])
    if pin != "none":
        os.sched_setaffinity(0, {cpus[rank % len(cpus)] if pin == "own" else cpus[0]})
    import numpy as np

    from horo_core import basics
    from horo_core._binding import lib

    basics.init()
    rt = basics.runtime()
    x = np.full(2, rank + 1.0, np.float32)
    out = np.empty_like(x)
    total = basics.size() * (basics.size() + 1) / 2
    failures, per_block = [], []
    for block in range(blocks + 1):  # the first block lets the poll's score settle
        before = rt.stats()
        for i in range(calls):
            rt.run(lib.HORO_ALLREDUCE, "poll", x.ctypes.data, out.ctypes.data, lib.HORO_FLOAT32, (2,), 0)
            if not np.all(out == total):
                failures.append(f"block {block} call {i}: {out}")
        after = rt.stats()
        if block > 0:
            per_block.append((after.caller_polls - before.caller_polls, after.caller_yields - before.caller_yields))
    basics.shutdown()
    return failures, per_block


def _run_poll_job(np_, pin, blocks=8, calls=250):
    import horo_runner

    reports = horo_runner.run(_poll_job, args=(blocks, calls, pin), num_proc=np_, env={"HORO_PEER_TIMEOUT_SECONDS": "60"},
                              bind_to="none")
    for rank, (failures, _) in enumerate(reports):
        assert failures == [], f"rank {rank}: {failures[:5]}"
    return [per_block for _, per_block in reports], calls


@pytest.mark.alone
def test_waiting_callers_poll_when_each_rank_has_a_core():
    """A caller waiting on a peer that runs on another core busy-polls for a few microseconds
    before it yields its core, so a loop of small synchronous allreduces rarely makes the system
    call: measured 0.08-0.21 yields per call, 1.05-1.26 without the poll."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs, one per rank")
    # A job whose every block was spoiled (the host took a CPU away from the guest, or another job
    # ran on it; seen on a contended host: the best block at 0.96 yields per call) is run again, at
    # most three jobs: without the poll every job fails.
    for attempt in range(3):
        per_rank, calls = _run_poll_job(2, "own")
        # The rank that usually arrives second seldom waits, and may have stopped polling.
        assert sum(polls for blocks in per_rank for polls, _ in blocks) > 0, f"no rank polled: {per_rank}"
        # The best block of each rank: another job on the machine can spoil some of them, not all.
        spoiled = [(rank, blocks) for rank, blocks in enumerate(per_rank)
                   if min(yields for _, yields in blocks) > 0.6 * calls]
        # On a host that steals the guest's CPUs for whole jobs (seen in CI: best blocks at 1.1 and
        # 3 yields per call), the polls cannot pay off, but a rank with a core of its own still keeps
        # polling in some block, where ranks sharing a core stop (at most 0.2 per call, the test
        # below): the decision this test is about.
        kept_polling = max(polls for blocks in per_rank for polls, _ in blocks) > 0.2 * calls
        if not spoiled or kept_polling:
            break
    assert not spoiled or kept_polling, (f"(rank, (polls, yields) per block of {calls} calls) in three jobs, "
                                         f"the last: {per_rank}")


def test_waiting_callers_stop_polling_on_a_shared_core():
    """Ranks that share one core never see a peer's message arrive while they poll (the peer needs
    that core): the poll stops paying off and is left off, but for a probe every 32 waits."""
    per_rank, calls = _run_poll_job(2, "one")
    for rank, blocks in enumerate(per_rank):
        # Measured: 0.02 polls per call; a poll that never turned off would take one per call.
        assert min(polls for polls, _ in blocks) <= 0.2 * calls, f"rank {rank}: {blocks} (polls, yields)"


def test_waiting_callers_never_poll_with_more_ranks_than_cpus():
    cpus = os.cpu_count() or 1
    if cpus > 3:
        pytest.skip(f"{cpus + 1} ranks would be needed to outnumber this machine's {cpus} CPUs")
    per_rank, _ = _run_poll_job(cpus + 1, "none", blocks=2, calls=100)
    for rank, blocks in enumerate(per_rank):
        assert all(polls == 0 for polls, _ in blocks), f"rank {rank}: {blocks} (polls, yields)"
