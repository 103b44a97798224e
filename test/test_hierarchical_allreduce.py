"""Hierarchical allreduce through the real runtime, with ranks spread over emulated hosts.

In-process worlds (threads over the loopback transport, whose hub is given a host map) run
negotiation, response cache, fusion and the executor for real: exact values for every dtype and
op (Average and scale factors included), small and large, fused, in process sets, bitwise identical
results on every rank, and the runtime's stats showing which algorithm ran and how many bytes
crossed hosts. Multi-process jobs (horo_runner.run, HORO_HOSTNAME set per rank) do the same over
TCP and shared memory, with 4 ranks on 2 hosts and 3 ranks on 2 hosts.
"""
import numpy as np
import pytest

import horo_runner
from core_values import ALL, contribution, expected_allreduce, make, name, read
from emulated_hosts import check_toggle_setting, delta, hosts_of, is_hierarchical, process_sets_to_try, world_per_layout
from horo_core import dtypes
from horo_core import numpy_ops as ops
from horo_core._binding import lib
from loopback_world import World

OPS = {"sum": lib.HORO_OP_SUM, "average": lib.HORO_OP_AVERAGE, "min": lib.HORO_OP_MIN,
       "max": lib.HORO_OP_MAX, "product": lib.HORO_OP_PRODUCT}
COUNTS = [1, 7, 1000, 65537]  # up to 64 KiB the small-message path, above it the sharded one
LAYOUTS = {"2+2": ["a", "a", "b", "b"], "2+1": ["a", "a", "b"], "interleaved 3+2": ["a", "b", "a", "b", "a"]}


def bytes_to_other_hosts(hosts, ranks, nbytes):
    """Bytes each member sends across hosts in one sharded hierarchical allreduce: only the shard
    owners (local index < smallest host size) do, a ring among the hosts over one shard."""
    by_host = hosts_of(hosts, ranks)
    shards, count = min(len(m) for m in by_host.values()), len(by_host)
    local = {m: i for members in by_host.values() for i, m in enumerate(members)}
    return [2 * (count - 1) * (nbytes // shards) // count if local[m] < shards else 0 for m in range(len(ranks))]


layout = world_per_layout(LAYOUTS)


def test_values_of_every_dtype_and_op(layout):
    world, hosts = layout
    n = world.size

    def body(rt):
        before = rt.stats()
        runs = 0
        for count in COUNTS:
            for dtype in ALL:
                for op_name, op in OPS.items():
                    if dtype == dtypes.BOOL and op_name == "average":
                        continue
                    tag = f"h.{count}.{name(dtype)}.{op_name}"
                    out = ops.allreduce(rt, make(dtype, contribution(op_name, rt.rank, count)), tag, op=op,
                                        dtype=dtype)
                    want = expected_allreduce(op_name, dtype, n, count)
                    got = read(dtype, out)
                    assert np.array_equal(got, want), f"{tag} on rank {rt.rank}: got {got[:8]}, want {want[:8]}"
                    runs += 1
        return runs, delta(before, rt.stats())

    for runs, d in world.run(body):
        assert d["allreduce_hierarchical"] == runs
        assert d["allreduce_ring"] == d["allreduce_recursive_doubling"] == 0


def test_fused_scaled_and_bitwise_identical(layout):
    world, hosts = layout
    n = world.size
    sizes = [3, 1000, 30000, 70001]  # fused into one response of ~400 KB, the sharded path

    def body(rt):
        rng = np.random.default_rng(rt.rank)
        arrays = [(rng.standard_normal(s) * 10.0 ** rng.integers(-6, 6, s)).astype(np.float32) for s in sizes]
        before = rt.stats()
        fused = ops.grouped_allreduce(rt, arrays, [f"fused.{k}" for k in range(len(sizes))])
        fused_runs = delta(before, rt.stats())["allreduce_hierarchical"]
        small = ops.allreduce(rt, arrays[1], "small.random")
        scaled = ops.allreduce(rt, np.full(1001, rt.rank + 1.0, dtype=np.float32), "scaled",
                               prescale_factor=2.0, postscale_factor=0.25)
        average = ops.allreduce(rt, np.full(100000, 3 * rt.rank + 1, dtype=np.int32), "int.average",
                                op=lib.HORO_OP_AVERAGE)
        return arrays, fused, fused_runs, small, scaled, average

    results = world.run(body)
    inputs = [r[0] for r in results]
    for arrays, fused, fused_runs, small, scaled, average in results:
        assert fused_runs == 1, "a fused response is one collective"
        for k, got in enumerate(fused):
            want = sum(i[k].astype(np.float64) for i in inputs)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3 * np.abs(want).max())
        assert np.all(scaled == np.float32(n * (n + 1) / 2 * 2.0 * 0.25))
        assert np.all(average == sum(3 * r + 1 for r in range(n)) // n)
    for r in range(1, n):
        for a, b in zip(results[0][1] + [results[0][3]], results[r][1] + [results[r][3]]):
            assert a.tobytes() == b.tobytes(), f"rank {r} differs from rank 0 in some bits"


def test_bytes_across_hosts_are_the_shards(layout):
    world, hosts = layout
    count = 60 * 1024  # float32: 240 KB, divisible by every shard and host count here
    expected = bytes_to_other_hosts(hosts, list(range(world.size)), 4 * count)

    def body(rt):
        before = rt.stats()
        out = ops.allreduce(rt, np.ones(count, dtype=np.float32), "traffic")
        assert np.all(out == world.size)
        return delta(before, rt.stats())

    got = [d["bytes_sent_other_hosts"] for d in world.run(body)]
    assert got == expected


def test_process_sets(layout):
    world, hosts = layout
    sets = process_sets_to_try(hosts)

    def body(rt):
        ids = [rt.add_process_set(ranks) for ranks in sets]
        got = []
        for set_id, ranks in zip(ids, sets):
            if rt.rank not in ranks:
                continue
            members = rt.process_set_ranks(set_id)
            index = members.index(rt.rank)
            before = rt.stats()
            outs = [ops.allreduce(rt, make(dtypes.INT32, contribution("sum", index, c)), f"ps.{set_id}.{c}",
                                  process_set_id=set_id, dtype=dtypes.INT32) for c in (7, 65537)]
            got.append((members, outs, delta(before, rt.stats())))
        return got

    for got in world.run(body):
        for members, outs, d in got:
            for out, c in zip(outs, (7, 65537)):
                assert np.array_equal(out, expected_allreduce("sum", dtypes.INT32, len(members), c))
            if is_hierarchical(hosts, members):
                assert d["allreduce_hierarchical"] == 2, (members, d)
            else:
                assert (d["allreduce_hierarchical"], d["allreduce_recursive_doubling"], d["allreduce_ring"]) == \
                    (0, 1, 1), (members, d)


def test_joined_rank_contributes_neutral_values(layout):
    world, hosts = layout
    last = world.size - 1  # a rank of the second host

    def body(rt):
        if rt.rank == last:
            return None, ops.join(rt)
        before = rt.stats()
        outs = [ops.allreduce(rt, np.full(count, rt.rank + 1.0, np.float32), f"joined.{count}", op=op)
                for count in (7, 65537) for op in (lib.HORO_OP_SUM, lib.HORO_OP_MIN)]
        return (outs, delta(before, rt.stats())), ops.join(rt)

    others = range(world.size - 1)
    for values, _ in world.run(body):
        if values is None:
            continue
        outs, d = values
        for out, want in zip(outs, [sum(r + 1 for r in others), 1.0] * 2):
            assert np.all(out == want)
        assert d["allreduce_hierarchical"] == 4, "the joined rank takes part with neutral values"


@pytest.mark.parametrize("coordinator, others, path", [
    ("0", "1", "flat"),
    ("1", "0", "hierarchical"),
], ids=["off-on-rank-0", "on-on-rank-0"])
def test_rank_0_setting_decides(coordinator, others, path):
    # Ranks with different settings still agree: every rank follows the coordinator's response.
    def rank_env(r):
        if r == 0:
            return {"HOROVOD_HIERARCHICAL_ALLREDUCE": coordinator}
        return {"HORO_HIERARCHICAL_ALLREDUCE": others}

    with World(4, hosts=LAYOUTS["2+2"], rank_env=rank_env) as world:
        def body(rt):
            before = rt.stats()
            small = ops.allreduce(rt, np.full(7, rt.rank + 1.0), "small")
            large = ops.allreduce(rt, np.full(65537, rt.rank + 1.0), "large")
            return small, large, delta(before, rt.stats())

        for small, large, d in world.run(body):
            assert np.all(small == 10.0) and np.all(large == 10.0)
            if path == "flat":
                assert (d["allreduce_hierarchical"], d["allreduce_recursive_doubling"], d["allreduce_ring"]) == (0, 1, 1)
            else:
                assert (d["allreduce_hierarchical"], d["allreduce_recursive_doubling"], d["allreduce_ring"]) == (2, 0, 0)


def test_setting_values(monkeypatch):
    check_toggle_setting(monkeypatch, "HIERARCHICAL_ALLREDUCE")


# Multi-process jobs over TCP and shared memory ----------------------------------------------------

def _job(hosts, sets):
    """Runs on every rank of a horo_runner job: emulates a host per rank, runs the checks and
    returns (checks, failures, result digests, stats)."""
    import hashlib
    import os
    import traceback

    import numpy as np

    import rank_checks
    from core_values import contribution, expected_allreduce, make, name, read, reduce_cases
    from horo_core import basics, dtypes
    from horo_core import numpy_ops as ops
    from horo_core._binding import lib
    from horo_core.process_sets import ProcessSet

    rank = int(os.environ["HORO_RANK"])
    os.environ["HORO_HOSTNAME"] = f"emulated-{hosts[rank]}"  # read by the core at init
    process_sets = [ProcessSet(ranks) for ranks in sets]
    basics.init(process_sets=process_sets)
    rt = basics.runtime()
    n = basics.size()
    c = rank_checks.Checks()
    digests = []

    def same_values(what, got, want):
        c.count += 1
        if got.shape != want.shape or not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)[:1].tolist() if got.shape == want.shape else "shape"
            c.fail(f"{what}: got {got[:6].tolist()}, want {want[:6].tolist()} (first difference at {bad})")
    try:
        start = rt.stats()
        runs = 0
        for count in (7, 65537):
            for dtype, op_name, op in reduce_cases():
                tag = f"job.{count}.{name(dtype)}.{op_name}"
                out = ops.allreduce(rt, make(dtype, contribution(op_name, rank, count)), tag, op=op, dtype=dtype)
                same_values(tag, read(dtype, out), expected_allreduce(op_name, dtype, n, count))
                runs += 1
        rng = np.random.default_rng(rank)
        arrays = [(rng.standard_normal(s) * 10.0 ** rng.integers(-6, 6, s)).astype(np.float32)
                  for s in (5, 3000, 200000)]  # each under 1 MiB, so the group stays fused
        before = rt.stats()
        fused = ops.grouped_allreduce(rt, arrays, ["random.0", "random.1", "random.2"])
        c.same("a fused group is one hierarchical collective",
               rt.stats().allreduce_hierarchical - before.allreduce_hierarchical, 1)
        for a in fused + [ops.allreduce(rt, arrays[0], "random.small")]:
            digests.append(hashlib.sha256(a.tobytes()).hexdigest())
        runs += 2
        end = rt.stats()
        c.same("allreduces run hierarchically", end.allreduce_hierarchical - start.allreduce_hierarchical, runs)
        c.same("allreduces run flat", (end.allreduce_ring + end.allreduce_recursive_doubling)
               - (start.allreduce_ring + start.allreduce_recursive_doubling), 0)

        before = rt.stats()
        ops.allreduce(rt, np.ones(60 * 1024, dtype=np.float32), "traffic")
        traffic = rt.stats().bytes_sent_other_hosts - before.bytes_sent_other_hosts

        for ps in process_sets:
            if not ps.included():
                continue
            before = rt.stats()
            for count in (7, 65537):
                out = ops.allreduce(rt, make(dtypes.FLOAT64, contribution("average", ps.rank(), count)),
                                    f"set.{ps.process_set_id}.{count}", op=lib.HORO_OP_AVERAGE,
                                    process_set_id=ps.process_set_id, dtype=dtypes.FLOAT64)
                same_values(f"set {ps.ranks} count {count}", out,
                            expected_allreduce("average", dtypes.FLOAT64, ps.size(), count))
            after = rt.stats()
            digests.append((tuple(ps.ranks), after.allreduce_hierarchical - before.allreduce_hierarchical))
        ops.barrier(rt)  # a rank that shuts down ends the job for all: wait for the others' sets
    except Exception:  # noqa: BLE001 - reported to the test, which names the rank
        c.fail(f"raised:\n{traceback.format_exc()}")
    basics.shutdown()
    return c.count, c.failures, digests, traffic if "traffic" in locals() else None


def _run_job(hosts, sets):
    reports = horo_runner.run(_job, args=(hosts, sets), num_proc=len(hosts), env={"HORO_PEER_TIMEOUT_SECONDS": "60"})
    problems = [f"rank {r}: {f}" for r, (_, failures, _, _) in enumerate(reports) for f in failures]
    assert not problems, "\n".join(problems[:40])
    assert all(count > 100 for count, _, _, _ in reports)
    digests = [d for _, _, d, _ in reports]
    # Every rank ends with the same bytes (the process-set entries are per member and skipped).
    result_digests = [[x for x in d if isinstance(x, str)] for d in digests]
    assert all(d == result_digests[0] for d in result_digests)
    expected_traffic = bytes_to_other_hosts(hosts, list(range(len(hosts))), 4 * 60 * 1024)
    assert [t for _, _, _, t in reports] == expected_traffic
    for d in digests:
        for ranks, hierarchical_runs in (x for x in d if not isinstance(x, str)):
            assert hierarchical_runs == (2 if is_hierarchical(hosts, list(ranks)) else 0), ranks


def test_job_4_ranks_on_2_hosts():
    # Sets: spanning both hosts unevenly (hierarchical), inside one host and one rank per host (flat).
    _run_job(["a", "a", "b", "b"], [[0, 1, 2], [2, 3], [1, 3]])


def test_job_3_ranks_on_2_hosts():
    _run_job(["a", "a", "b"], [[0, 2]])
