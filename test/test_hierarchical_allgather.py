"""Hierarchical allgather through the real runtime, with ranks spread over emulated hosts.

In-process worlds (threads over the loopback transport, whose hub is given a host map) run
negotiation, response cache and the executor for real: exact values for every dtype with a
different first dimension per rank (zero included), grouped allgathers, process sets, the setting
on rank 0 deciding for every rank, and the runtime's stats showing which algorithm ran and exactly
how many bytes crossed hosts, against the ring's. Multi-process jobs (horo_runner.run, HORO_HOSTNAME
set per rank) do the same over TCP and shared memory, with 4 ranks on 2 hosts (2+2 and 3+1).
"""
import numpy as np
import pytest

import horo_runner
from core_values import ALL, make, name, read
from emulated_hosts import check_toggle_setting, delta, hosts_of, is_hierarchical, process_sets_to_try, world_per_layout
from horo_core import dtypes
from horo_core import numpy_ops as ops
from horo_core._binding import lib
from loopback_world import World

LAYOUTS = {"2+2": ["a", "a", "b", "b"], "3+1": ["a", "a", "a", "b"], "interleaved 2+2": ["a", "b", "a", "b"]}
WIDTHS = [(), (7,), (3, 1000)]  # row shapes: scalars, short rows, 12 KB float32 rows (the large case)


def rows(rank):
    """First dimension of rank's tensor: differs per rank, and rank 1 contributes nothing."""
    return (3 * rank + 2) % 5


def piece(rank, row_shape, dtype):
    """What rank contributes (exact in every dtype): small integers that tell ranks and rows apart."""
    count = rows(rank) * int(np.prod(row_shape, dtype=np.int64))
    i = np.arange(count)
    values = (rank + i) % 2 if dtype == dtypes.BOOL else rank * 16 + i % 13
    return np.asarray(values, dtype=np.float64).reshape((rows(rank),) + tuple(row_shape))


def expected(size, row_shape, dtype):
    return read(dtype, make(dtype, np.concatenate([piece(r, row_shape, dtype) for r in range(size)])))


def hierarchical_bytes_to_other_hosts(hosts, ranks, nbytes):
    """Bytes each member sends across hosts in one hierarchical allgather of nbytes[m] per member:
    shard owner s (local index s < S = smallest host) sends, in a ring over the hosts, shard s of
    every host's data but the next host's."""
    by_host = list(hosts_of(hosts, ranks).values())
    shards, count = min(len(m) for m in by_host), len(by_host)
    data = [sum(nbytes[m] for m in members) for members in by_host]
    out = [0] * len(ranks)
    for h, members in enumerate(by_host):
        for s, m in enumerate(members[:shards]):
            out[m] = sum(data[g] // shards + (s < data[g] % shards) for g in range(count) if g != (h + 1) % count)
    return out


def ring_bytes_to_other_hosts(hosts, ranks, nbytes):
    """Bytes each member sends across hosts in a ring allgather: member i sends every block but
    member i+1's to member i+1."""
    n = len(ranks)
    return [sum(nbytes) - nbytes[(i + 1) % n] if hosts[ranks[i]] != hosts[ranks[(i + 1) % n]] else 0
            for i in range(n)]


def grouped_allgather(rt, arrays, names, dtype=None, process_set_id=0):
    """Allgathers of several arrays negotiated as one group (what grouped_allgather enqueues)."""
    def read_all(rt, results):
        outs = []
        for like, result in zip(arrays, results):
            out = np.empty(result.shape, dtype=like.dtype)
            rt.copy_result(result, out.ctypes.data)
            outs.append(out)
        return outs

    specs = [ops._spec(n, a, None, dtype) for n, a in zip(names, arrays)]
    return ops._run(rt, lib.HORO_ALLGATHER, specs, read=read_all, process_set_id=process_set_id)


layout = world_per_layout(LAYOUTS)


def test_values_of_every_dtype(layout):
    world, hosts = layout

    def body(rt):
        before = rt.stats()
        got = []
        for dtype in ALL:
            for shape in WIDTHS:
                x = make(dtype, piece(rt.rank, shape, dtype))
                got.append((dtype, shape, read(dtype, ops.allgather(rt, x, f"h.{name(dtype)}.{shape}", dtype=dtype))))
        # Twice more, from the response cache, which must keep the algorithm.
        for _ in range(2):
            x = make(dtypes.FLOAT32, piece(rt.rank, (3, 1000), dtypes.FLOAT32))
            got.append((dtypes.FLOAT32, (3, 1000), ops.allgather(rt, x, "h.float32.(3, 1000)").astype(np.float64)))
        return got, delta(before, rt.stats())

    for got, d in world.run(body):
        for dtype, shape, g in got:
            want = expected(world.size, shape, dtype)
            assert g.shape == want.shape and np.array_equal(g, want), (name(dtype), shape)
        assert (d["allgather_hierarchical"], d["allgather_ring"]) == (len(got), 0)


def test_grouped_allgather(layout):
    world, hosts = layout
    shapes = [(), (5,), (2, 3000)]

    def body(rt):
        arrays = [make(dtypes.INT32, piece(rt.rank, s, dtypes.INT32)) for s in shapes]
        before = rt.stats()
        outs = grouped_allgather(rt, arrays, [f"group.{k}" for k in range(len(shapes))])
        return outs, delta(before, rt.stats())

    for outs, d in world.run(body):
        for out, shape in zip(outs, shapes):
            assert np.array_equal(out, expected(world.size, shape, dtypes.INT32)), shape
        assert (d["allgather_hierarchical"], d["allgather_ring"]) == (len(shapes), 0)


def test_bytes_across_hosts(layout):
    world, hosts = layout
    row_bytes = 4 * 3 * 1000
    nbytes = [rows(r) * row_bytes for r in range(world.size)]

    def body(rt):
        before = rt.stats()
        out = ops.allgather(rt, make(dtypes.FLOAT32, piece(rt.rank, (3, 1000), dtypes.FLOAT32)), "traffic")
        assert np.array_equal(out, expected(world.size, (3, 1000), dtypes.FLOAT32))
        return delta(before, rt.stats())["bytes_sent_other_hosts"]

    got = world.run(body)
    ranks = list(range(world.size))
    assert got == hierarchical_bytes_to_other_hosts(hosts, ranks, nbytes)
    assert sum(got) == sum(nbytes), "two hosts: every byte crosses once"
    assert sum(got) < sum(ring_bytes_to_other_hosts(hosts, ranks, nbytes))


def test_process_sets(layout):
    world, hosts = layout
    sets = process_sets_to_try(hosts)  # hierarchical, inside one host, one rank per host (the ring)

    def body(rt):
        ids = [rt.add_process_set(ranks) for ranks in sets]
        got = []
        for set_id, ranks in zip(ids, sets):
            if rt.rank not in ranks:
                continue
            members = rt.process_set_ranks(set_id)
            before = rt.stats()
            x = make(dtypes.FLOAT64, piece(rt.rank, (7,), dtypes.FLOAT64))
            out = ops.allgather(rt, x, f"ps.{set_id}", process_set_id=set_id)
            got.append((members, out, delta(before, rt.stats())))
        return got

    for got in world.run(body):
        for members, out, d in got:
            want = np.concatenate([piece(r, (7,), dtypes.FLOAT64) for r in members])
            assert np.array_equal(out, want), members
            path = (1, 0) if is_hierarchical(hosts, members) else (0, 1)
            assert (d["allgather_hierarchical"], d["allgather_ring"]) == path, (members, d)


@pytest.mark.parametrize("coordinator, others, path", [
    ("0", "1", "ring"),
    ("1", "0", "hierarchical"),
    ("auto", "0", "hierarchical"),
], ids=["off-on-rank-0", "on-on-rank-0", "auto-on-rank-0"])
def test_rank_0_setting_decides(coordinator, others, path):
    # Ranks with different settings still agree: every rank follows the coordinator's response.
    hosts = LAYOUTS["2+2"]
    nbytes = [rows(r) * 4 * 3000 for r in range(4)]

    def rank_env(r):
        if r == 0:
            return {"HOROVOD_HIERARCHICAL_ALLGATHER": coordinator}
        return {"HORO_HIERARCHICAL_ALLGATHER": others}

    with World(4, hosts=hosts, rank_env=rank_env) as world:
        def body(rt):
            before = rt.stats()
            small = ops.allgather(rt, make(dtypes.INT8, piece(rt.rank, (), dtypes.INT8)), "small")
            large = ops.allgather(rt, make(dtypes.FLOAT32, piece(rt.rank, (3, 1000), dtypes.FLOAT32)), "large")
            return small, large, delta(before, rt.stats())

        results = world.run(body)
    for small, large, d in results:
        assert np.array_equal(small, expected(4, (), dtypes.INT8))
        assert np.array_equal(large, expected(4, (3, 1000), dtypes.FLOAT32))
        assert (d["allgather_hierarchical"], d["allgather_ring"]) == ((2, 0) if path == "hierarchical" else (0, 2))
    small_bytes = [rows(r) for r in range(4)]
    model = hierarchical_bytes_to_other_hosts if path == "hierarchical" else ring_bytes_to_other_hosts
    want = [a + b for a, b in zip(model(hosts, [0, 1, 2, 3], small_bytes), model(hosts, [0, 1, 2, 3], nbytes))]
    assert [d["bytes_sent_other_hosts"] for _, _, d in results] == want


def test_setting_values(monkeypatch):
    check_toggle_setting(monkeypatch, "HIERARCHICAL_ALLGATHER")


# Multi-process jobs over TCP and shared memory ----------------------------------------------------

def _job(hosts, sets):
    """Runs on every rank of a horo_runner job: emulates a host per rank, runs the checks and
    returns (checks, failures, stats deltas)."""
    import os
    import traceback

    import numpy as np

    import rank_checks
    import test_hierarchical_allgather as t
    from core_values import ALL, make, name, read
    from horo_core import basics, dtypes
    from horo_core import numpy_ops as ops
    from horo_core.process_sets import ProcessSet

    rank = int(os.environ["HORO_RANK"])
    os.environ["HORO_HOSTNAME"] = f"emulated-{hosts[rank]}"  # read by the core at init
    process_sets = [ProcessSet(ranks) for ranks in sets]
    basics.init(process_sets=process_sets)
    rt = basics.runtime()
    n = basics.size()
    c = rank_checks.Checks()
    runs = {}

    def same_values(what, got, want):
        c.count += 1
        if got.shape != want.shape or not np.array_equal(got, want):
            c.fail(f"{what}: got shape {got.shape} {got.ravel()[:6].tolist()}, want {want.shape} "
                   f"{want.ravel()[:6].tolist()}")
    try:
        start = rt.stats()
        for dtype in ALL:
            for shape in t.WIDTHS:
                tag = f"job.{name(dtype)}.{shape}"
                out = ops.allgather(rt, make(dtype, t.piece(rank, shape, dtype)), tag, dtype=dtype)
                same_values(tag, read(dtype, out), t.expected(n, shape, dtype))
        shapes = [(), (5,), (2, 3000)]
        outs = t.grouped_allgather(rt, [make(dtypes.INT64, t.piece(rank, s, dtypes.INT64)) for s in shapes],
                                   [f"job.group.{k}" for k in range(len(shapes))])
        for out, shape in zip(outs, shapes):
            same_values(f"grouped {shape}", out.astype(np.float64), t.expected(n, shape, dtypes.INT64))
        runs["world"] = t.delta(start, rt.stats())

        before = rt.stats()
        out = ops.allgather(rt, make(dtypes.FLOAT32, t.piece(rank, (3, 1000), dtypes.FLOAT32)), "job.traffic")
        same_values("traffic", out, t.expected(n, (3, 1000), dtypes.FLOAT32))
        runs["traffic"] = t.delta(before, rt.stats())["bytes_sent_other_hosts"]

        for ps in process_sets:
            if not ps.included():
                continue
            before = rt.stats()
            out = ops.allgather(rt, make(dtypes.FLOAT64, t.piece(rank, (7,), dtypes.FLOAT64)),
                                f"job.set.{ps.process_set_id}", process_set_id=ps.process_set_id)
            same_values(f"set {ps.ranks}", out, np.concatenate([t.piece(r, (7,), dtypes.FLOAT64) for r in ps.ranks]))
            runs[tuple(ps.ranks)] = t.delta(before, rt.stats())["allgather_hierarchical"]
        ops.barrier(rt)  # a rank that shuts down ends the job for all: wait for the others' sets
    except Exception:  # noqa: BLE001 - reported to the test, which names the rank
        c.fail(f"raised:\n{traceback.format_exc()}")
    basics.shutdown()
    return c.count, c.failures, runs


def _run_job(hosts, sets):
    reports = horo_runner.run(_job, args=(hosts, sets), num_proc=len(hosts), env={"HORO_PEER_TIMEOUT_SECONDS": "60"})
    problems = [f"rank {r}: {f}" for r, (_, failures, _) in enumerate(reports) for f in failures]
    assert not problems, "\n".join(problems[:40])
    assert all(count == len(ALL) * len(WIDTHS) + 3 + 1 + sum(r in s for s in sets)
               for r, (count, _, _) in enumerate(reports))
    ranks = list(range(len(hosts)))
    for _, _, runs in reports:
        world = runs["world"]
        assert (world["allgather_hierarchical"], world["allgather_ring"]) == (len(ALL) * len(WIDTHS) + 3, 0)
    nbytes = [rows(r) * 4 * 3000 for r in ranks]
    assert [runs["traffic"] for _, _, runs in reports] == hierarchical_bytes_to_other_hosts(hosts, ranks, nbytes)
    for _, _, runs in reports:
        for key, hierarchical_runs in runs.items():
            if isinstance(key, tuple):
                assert hierarchical_runs == (1 if is_hierarchical(hosts, list(key)) else 0), key


def test_job_2_plus_2_hosts():
    _run_job(["a", "a", "b", "b"], [[0, 1, 2], [2, 3], [1, 3]])


def test_job_3_plus_1_hosts():
    _run_job(["a", "a", "a", "b"], [[1, 2, 3]])
