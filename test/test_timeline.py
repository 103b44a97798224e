"""The timeline: HORO_TIMELINE / HORO_TIMELINE_MARK_CYCLES, start_timeline() / stop_timeline().

One launch of 3 ranks (with a process set {0, 2}) records four phases of the same workload (fused and
single allreduces, both allreduce algorithms, allgather, broadcast, alltoall, reducescatter, a
barrier, an allreduce on the process set, a shape mismatch and an oddly named tensor):

  a. started by HORO_TIMELINE with HORO_TIMELINE_MARK_CYCLES=1, ended by stop_timeline();
  b. start_timeline(mark_cycles=False) ... stop_timeline(); rank 0 reads the file at once;
  c. not recorded: rank 0 checks that the file of b did not change;
  d. start_timeline() and never stopped: the file is completed by shutdown().

Each file must be a JSON array (json.load) in Horovod's layout: the header with
start_time_since_epoch_in_micros, a process per tensor named by metadata, NEGOTIATE_<OP> with a
tick for every member rank, the op phase on the track of every rank that ran it with QUEUE, the
fusion-buffer copies and the algorithm, begin/end balanced and nested on every track, timestamps
that never decrease on a track, and only its own phase's tensors.
"""
import collections
import dataclasses
import json
import os
import time
from typing import List, Optional

import pytest

import horo_runner
from loopback_world import World

SIZE = 3
SUBSET = [0, 2]
ODD_NAME = 'odd "name" \\ with\ttab and ü'
ENV = {"HORO_TIMELINE_MARK_CYCLES": "1", "HORO_STALL_SHUTDOWN_TIME_SECONDS": "60",
       "HORO_PEER_TIMEOUT_SECONDS": "60"}
# Tensors of one workload: (name suffix, op phase, activities on every member rank).
ALLREDUCE_SMALL, ALLREDUCE_RING = "RECURSIVE_DOUBLING_ALLREDUCE", "RING_ALLREDUCE"
FUSED = ["QUEUE", "MEMCPY_IN_FUSION_BUFFER", ALLREDUCE_SMALL, "MEMCPY_OUT_FUSION_BUFFER"]
EXPECTED = [
    ("grouped_allreduce.{tag}.fused.0", "ALLREDUCE", FUSED),
    ("grouped_allreduce.{tag}.fused.1", "ALLREDUCE", FUSED),
    ("grouped_allreduce.{tag}.fused.2", "ALLREDUCE", FUSED),
    ("allreduce.{tag}.big", "ALLREDUCE", ["QUEUE", ALLREDUCE_RING]),
    ("allreduce.{tag}.single", "ALLREDUCE", ["QUEUE", ALLREDUCE_SMALL]),
    ("allgather.{tag}.gather", "ALLGATHER", ["QUEUE", "RING_ALLGATHER"]),
    ("broadcast.{tag}.bcast", "BROADCAST", ["QUEUE", "BINOMIAL_TREE_BROADCAST"]),
    ("alltoall.{tag}.alltoall", "ALLTOALL", ["QUEUE", "PAIRWISE_ALLTOALL"]),
    ("reducescatter.{tag}.rs", "REDUCESCATTER", ["QUEUE", "MEMCPY_IN_FUSION_BUFFER", "RING_REDUCESCATTER"]),
    ("allreduce.{tag}." + ODD_NAME, "ALLREDUCE", ["QUEUE", ALLREDUCE_SMALL]),
]


# The job ---------------------------------------------------------------------------------------

def workload(hvd, torch, tag, subset):
    """The same collectives in every phase; tensor names carry the phase's tag."""
    r, n = hvd.rank(), hvd.size()
    hvd.grouped_allreduce([torch.full((4 + i,), float(r)) for i in range(3)], name=f"{tag}.fused", op=hvd.Sum)
    hvd.allreduce(torch.ones(100_000), name=f"{tag}.big", op=hvd.Sum)  # 400 kB: the ring
    hvd.allreduce(torch.ones(5), name=f"{tag}.single", op=hvd.Sum)
    hvd.allgather(torch.full((r + 1, 2), r), name=f"{tag}.gather")
    hvd.broadcast(torch.full((3,), r), root_rank=1, name=f"{tag}.bcast")
    hvd.alltoall(torch.arange(n * 2), name=f"{tag}.alltoall")
    hvd.reducescatter(torch.ones(n * 2, 3), name=f"{tag}.rs", op=hvd.Sum)
    hvd.allreduce(torch.ones(1), name=f"{tag}.{ODD_NAME}", op=hvd.Sum)
    hvd.barrier()
    if r in subset.ranks:
        hvd.allreduce(torch.ones(2), name=f"{tag}.subset", process_set=subset, op=hvd.Sum)
    try:
        hvd.allreduce(torch.ones(2 + r), name=f"{tag}.mismatch")
        return "the shape mismatch was not reported"
    except hvd.HoroMismatchError:
        return None


def timeline_job(paths):
    import torch

    import horo_torch as hvd
    subset = hvd.ProcessSet(SUBSET)
    hvd.init(process_sets=[subset])
    rank = hvd.rank()
    problems = []
    report = {}

    problems.append(workload(hvd, torch, "a", subset))  # recording since init (HORO_TIMELINE)
    hvd.stop_timeline()

    hvd.start_timeline(paths["b"], mark_cycles=False)
    problems.append(workload(hvd, torch, "b", subset))
    hvd.stop_timeline()
    if rank == 0:
        with open(paths["b"], encoding="utf-8") as f:
            report["b at stop"] = f.read()

    problems.append(workload(hvd, torch, "c", subset))  # not recorded
    hvd.stop_timeline()  # stopping a stopped timeline does nothing
    if rank == 0:
        with open(paths["b"], encoding="utf-8") as f:
            report["b after c"] = f.read()

    hvd.start_timeline(paths["d"], mark_cycles=False)
    problems.append(workload(hvd, torch, "d", subset))
    hvd.shutdown()  # completes d's file
    report["problems"] = [p for p in problems if p]
    return report


# Reading a trace -------------------------------------------------------------------------------

@dataclasses.dataclass
class Slice:
    name: str
    begin: int
    end: Optional[int] = None
    args: dict = dataclasses.field(default_factory=dict)
    children: List["Slice"] = dataclasses.field(default_factory=list)
    ticks: List[dict] = dataclasses.field(default_factory=list)


class Trace:
    """A timeline file, checked for structure while it is read: header, metadata for every pid and
    tid used, begin/end balanced and nested and timestamps never decreasing on every track."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
        head = events[0]
        assert (head["name"], head["ph"], head["pid"]) == ("process_name", "M", 0), head
        self.start_us = head["args"]["start_time_since_epoch_in_micros"]
        process, thread = {}, {}
        for e in events:
            if e["ph"] == "M" and e["name"] == "process_name" and "name" in e["args"]:
                assert e["pid"] not in process, f"pid {e['pid']} named twice"
                process[e["pid"]] = e["args"]["name"]
            if e["ph"] == "M" and e["name"] == "thread_name":
                assert e["tid"] not in thread, f"tid {e['tid']} named twice"
                thread[e["tid"]] = (e["pid"], e["args"]["name"])
        sorted_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_sort_index"}
        assert set(process) <= sorted_pids
        self.tracks = collections.defaultdict(list)  # (tensor, "rank R" | "negotiation") -> slices
        self.markers = []
        open_slices = collections.defaultdict(list)
        last_ts = {}
        for e in events:
            if e["ph"] == "M":
                continue
            if e["ph"] == "i":
                assert e["s"] == "g" and e["ts"] >= 0, e
                self.markers.append(e)
                continue
            pid, tid, ts = e["pid"], e["tid"], e["ts"]
            assert pid in process and tid in thread and thread[tid][0] == pid, f"unnamed pid/tid: {e}"
            key = (process[pid], thread[tid][1])
            assert ts >= last_ts.get(key, 0), f"time goes back on {key}: {e}"
            last_ts[key] = ts
            stack = open_slices[key]
            if e["ph"] == "B":
                s = Slice(e["name"], ts, args=e.get("args", {}))
                (stack[-1].children if stack else self.tracks[key]).append(s)
                stack.append(s)
            elif e["ph"] == "E":
                assert "name" not in e and stack, f"end without begin on {key}: {e}"
                s = stack.pop()
                s.end = ts
                s.args.update(e.get("args", {}))
            else:
                assert e["ph"] == "X" and e["dur"] == 0, e
                assert stack, f"tick outside a slice on {key}: {e}"
                stack[-1].ticks.append(e)
        unbalanced = {k: [s.name for s in v] for k, v in open_slices.items() if v}
        assert not unbalanced, f"slices never ended: {unbalanced}"
        self.tensors = set(process.values())

    def only(self, tensor, track):
        slices = self.tracks[(tensor, track)]
        assert len(slices) == 1, f"{tensor} on {track}: want one slice, got {[s.name for s in slices]}"
        return slices[0]


def check_phase(trace, tag, next_tag, mark_cycles):
    """What one workload must have left in a trace of its own. Workers may run ahead into the next
    phase before rank 0 stops: the negotiation of its first tensors may then have begun in this
    trace, but nothing of the next phase ran in it."""
    ranks = [f"rank {r}" for r in range(SIZE)]
    expected = [(name.format(tag=tag), op, acts) for name, op, acts in EXPECTED]
    subset_name = f"allreduce.{tag}.subset (process set 1)"
    names = {n for n, _, _ in expected} | {subset_name, f"allreduce.{tag}.mismatch"}
    executed = {tensor for tensor, track in trace.tracks if track != "negotiation"}
    barriers = {t for t in executed if t.startswith("barrier.")}
    assert len(barriers) == 1, executed
    assert executed == names | barriers, f"tensors of other phases or missing: {executed ^ (names | barriers)}"
    for tensor in trace.tensors - executed:
        assert next_tag and f".{next_tag}." in tensor or tensor.startswith("barrier."), tensor
    for name, op, activities in expected + [(barriers.pop(), "BARRIER", ["QUEUE"])]:
        negotiation = trace.only(name, "negotiation")
        assert negotiation.name == f"NEGOTIATE_{op}", (name, negotiation)
        assert sorted(t["name"] for t in negotiation.ticks) == ["0", "1", "2"], (name, negotiation.ticks)
        assert all(negotiation.begin <= t["ts"] <= negotiation.end for t in negotiation.ticks)
        for track in ranks:
            phase = trace.only(name, track)
            assert phase.name == op and [c.name for c in phase.children] == activities, (name, track, phase)
            assert phase.begin <= phase.children[0].begin and phase.children[-1].end <= phase.end
            # Every rank's events are on rank 0's time axis: a rank runs a tensor only after rank 0
            # answered its negotiation (1 ms of slack for the clocks of the ranks).
            assert phase.begin >= negotiation.end - 1000, (name, track, phase.begin, negotiation.end)
            if op != "BARRIER":
                assert set(phase.args) == {"dtype", "shape"}, (name, phase.args)
    for track in ranks:
        fused = [trace.only(f"grouped_allreduce.{tag}.fused.{i}", track) for i in range(3)]
        assert len({f.children[1].begin for f in fused}) == 1, f"{track}: the group was not fused"
        assert [f.args["shape"] for f in fused] == ["[4]", "[5]", "[6]"]
        error = trace.only(f"allreduce.{tag}.mismatch", track)
        assert error.name == "ERROR" and "Mismatched shapes" in error.args["message"], error
    assert trace.only(f"allreduce.{tag}.mismatch", "negotiation").name == "NEGOTIATE_ALLREDUCE"
    subset = trace.only(subset_name, "negotiation")
    assert sorted(t["name"] for t in subset.ticks) == ["0", "2"]
    assert {track for tensor, track in trace.tracks if tensor == subset_name} == {"negotiation", "rank 0", "rank 2"}
    cycles = [m for m in trace.markers if m["name"] == "CYCLE_START"]
    assert (len(cycles) > 0) == mark_cycles and len(cycles) == len(trace.markers)


def test_timeline_records_every_rank(tmp_path):
    paths = {tag: str(tmp_path / f"timeline_{tag}.json") for tag in "abd"}
    started = time.time() * 1e6
    reports = horo_runner.run(timeline_job, args=(paths,), num_proc=SIZE, env={**ENV, "HORO_TIMELINE": paths["a"]})
    ended = time.time() * 1e6
    for r, report in enumerate(reports):
        assert report["problems"] == [], f"rank {r}: {report['problems']}"
    traces = {tag: Trace(paths[tag]) for tag in "abd"}
    for tag, next_tag in [("a", "b"), ("b", "c"), ("d", None)]:
        assert started <= traces[tag].start_us <= ended, (tag, traces[tag].start_us)
        check_phase(traces[tag], tag, next_tag, mark_cycles=tag == "a")
    # stop_timeline() left a complete file on rank 0 at once, and nothing was written after it.
    assert json.loads(reports[0]["b at stop"]) and reports[0]["b after c"] == reports[0]["b at stop"]
    with open(paths["b"], encoding="utf-8") as f:
        assert f.read() == reports[0]["b at stop"]
    assert traces["a"].start_us < traces["b"].start_us < traces["d"].start_us


def repeated_steps_job(pause_s, steps):
    import torch

    import horo_torch as hvd
    hvd.init()
    for _ in range(steps):
        hvd.allreduce(torch.ones(1000), name="repeated", op=hvd.Sum)
        time.sleep(pause_s)  # no collective runs meanwhile
    hvd.shutdown()


def test_agreed_steps_start_when_the_ranks_agree(tmp_path):
    """A repeated tensor agreed between the ranks (no coordinator list) begins its op phase when the
    round completes; it once began at the last coordinator list, a step or more earlier. With
    mark_cycles every such round is marked CYCLE_START (only the coordinator's lists were, so a
    training loop's steady state showed none)."""
    path = str(tmp_path / "repeated.json")
    pause_s, steps = 0.25, 5
    horo_runner.run(repeated_steps_job, args=(pause_s, steps), num_proc=2,
                    env={"HORO_TIMELINE": path, "HORO_TIMELINE_MARK_CYCLES": "1"})
    trace = Trace(path)
    for track in ("rank 0", "rank 1"):
        phases = trace.tracks[("allreduce.repeated", track)]
        assert len(phases) == steps, (track, [p.name for p in phases])
        durations_ms = [(p.end - p.begin) / 1e3 for p in phases]
        assert all(p.name == "ALLREDUCE" for p in phases)
        assert max(durations_ms) < pause_s * 1e3 / 2, (track, durations_ms)
    cycles = [m["ts"] for m in trace.markers if m["name"] == "CYCLE_START"]
    phases = trace.tracks[("allreduce.repeated", "rank 0")]
    for before, phase in zip([None] + phases, phases):  # a cycle began in the pause before each step
        assert any((before is None or before.end <= ts) and ts <= phase.begin for ts in cycles), (cycles, phase)


def switch_job(paths, late_s):
    import torch

    import horo_torch as hvd
    hvd.init()
    rank = hvd.rank()
    if rank == 1:  # ready before the recording starts; rank 0 comes late_s after it started
        pending = hvd.allreduce_async(torch.ones(4), name="pending")
    hvd.barrier()  # rank 1's request has reached the coordinator
    hvd.start_timeline(paths["a"])
    if rank == 0:
        time.sleep(late_s)
        pending = hvd.allreduce_async(torch.ones(4), name="pending")
    hvd.synchronize(pending)
    for _ in range(3):
        hvd.allreduce(torch.ones(4), name="x")
    # The file is cut at rank 0's switch on the common clock. A repeated small allreduce can end on
    # rank 0 before rank 1 even began it (the peers' data comes with their announcements), so
    # without the barrier rank 1's third x would rightly belong to the new file.
    hvd.barrier()
    hvd.start_timeline(paths["b"])  # a new file while recording
    for _ in range(3):
        hvd.allreduce(torch.ones(4), name="y")
    hvd.stop_timeline()
    hvd.shutdown()


def test_switching_files_keeps_every_rank_and_pending_negotiations_show_the_wait(tmp_path):
    """start_timeline(new path) while recording: the old file gets every rank's events up to rank
    0's switch (the workers' last ones once went missing) and the new one what follows. A negotiation
    under way when recording starts is drawn from the start, with the rank that was ready ticked
    there: the file shows rank 1 waiting for rank 0."""
    paths = {tag: str(tmp_path / f"{tag}.json") for tag in "ab"}
    late_s = 0.3
    horo_runner.run(switch_job, args=(paths, late_s), num_proc=2, env={"HORO_TIMELINE": "DYNAMIC"})
    a, b = Trace(paths["a"]), Trace(paths["b"])
    for track in ("rank 0", "rank 1"):
        assert len(a.tracks[("allreduce.x", track)]) == 3, (track, a.tracks.keys())
        assert len(b.tracks[("allreduce.y", track)]) == 3, (track, b.tracks.keys())
        assert ("allreduce.y", track) not in a.tracks and ("allreduce.x", track) not in b.tracks
    negotiation = a.only("allreduce.pending", "negotiation")
    ticks = {t["name"]: t["ts"] for t in negotiation.ticks}
    assert negotiation.begin < late_s * 1e6 / 3 and ticks["1"] == negotiation.begin, (negotiation, ticks)
    assert ticks["0"] - ticks["1"] >= late_s * 1e6 * 0.9, ticks


# Errors, in-process ----------------------------------------------------------------------------

def test_start_timeline_errors(monkeypatch, tmp_path):
    import horo_torch
    from horo_core.errors import HoroInvalidArgument, HoroNotInitializedError

    with pytest.raises(HoroNotInitializedError, match="has not been initialized"):
        horo_torch.start_timeline(str(tmp_path / "x.json"))
    with pytest.raises(HoroNotInitializedError, match="has not been initialized"):
        horo_torch.stop_timeline()

    # Like Horovod, start_timeline needs HORO_TIMELINE (a path or DYNAMIC) set before init.
    for name in ("HORO_TIMELINE", "HOROVOD_TIMELINE"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "refused.json"
    with World(2) as world:
        _, errors = world.run_collecting(lambda rt: rt.start_timeline(str(path)))
        for e in errors:
            assert isinstance(e, HoroInvalidArgument) and isinstance(e, ValueError), e
            assert "Set HORO_TIMELINE=DYNAMIC" in str(e) and "HOROVOD_TIMELINE=DYNAMIC" in str(e)
        world.run(lambda rt: rt.stop_timeline())  # nothing to stop
    assert not path.exists()

    # HOROVOD_TIMELINE=DYNAMIC enables the API without starting anything; rank 0 alone opens the
    # file, so only rank 0 reports a path it cannot create.
    monkeypatch.setenv("HOROVOD_TIMELINE", "DYNAMIC")
    bad = tmp_path / "missing-dir" / "t.json"
    good = tmp_path / "good.json"
    with World(2) as world:
        assert not os.path.exists("DYNAMIC")
        _, errors = world.run_collecting(lambda rt: rt.start_timeline(str(bad)))
        assert isinstance(errors[0], HoroInvalidArgument) and str(bad) in str(errors[0]), errors[0]
        assert "No such file or directory" in str(errors[0]) and errors[1] is None
        world.run(lambda rt: rt.stop_timeline())
        world.run(lambda rt: rt.start_timeline(str(good), True))
        world.run(lambda rt: rt.stop_timeline())
    with open(good) as f:
        events = json.load(f)
    assert events[0]["args"]["start_time_since_epoch_in_micros"] > 0


def test_timeline_setting_is_in_the_table(monkeypatch):
    from horo_core import config
    monkeypatch.setenv("HOROVOD_TIMELINE", "/tmp/t.json")
    monkeypatch.setenv("HORO_TIMELINE_MARK_CYCLES", "1")
    settings = {s.name: s for s in config.settings()}
    assert settings["TIMELINE"].value == "/tmp/t.json" and settings["TIMELINE"].default == ""
    assert settings["TIMELINE_MARK_CYCLES"].value == "1" and settings["TIMELINE_MARK_CYCLES"].default == "0"
    monkeypatch.setenv("HORO_TIMELINE_MARK_CYCLES", "maybe")
    with pytest.raises(ValueError, match="HORO_TIMELINE_MARK_CYCLES='maybe' is not a valid bool"):
        config.settings()
