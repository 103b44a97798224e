"""Failures of horo_torch jobs as users see them, over real processes and TCP.

* Ranks that disagree about a tensor: every rank raises the same HoroMismatchError (a
  HorovodInternalError and a RuntimeError) naming the tensor, the ranks and both values, and the
  next collective works.
* A rank killed with SIGKILL or frozen with SIGSTOP: every other rank raises instead of hanging,
  and hororun exits non-zero naming the rank.
* A rank that never submits a tensor: the stall warning names it and the tensor, and with
  HORO_STALL_SHUTDOWN_TIME_SECONDS the other ranks get an error.

Ranks are started either by hororun / horo_runner.run, or directly as torchrun-style processes
(RANK, WORLD_SIZE and a rendezvous that rank 0 hosts) where a test must talk to single ranks;
hororun would end the other ranks as soon as one fails, before they could report.
"""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import horo_runner
from free_ports import free_port

N = 3
CHILD_TIMEOUT = 120  # guards against a hang only; no test asserts on time


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def write_script(tmp_path, body):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def spawn_ranks(script, n, args=(), **settings):
    """Starts n ranks of script as torchrun would (rank 0 hosts the rendezvous); returns Popens
    with text pipes for stdin, stdout and stderr."""
    port = free_port()
    procs = []
    for rank in range(n):
        env = clean_env(RANK=rank, WORLD_SIZE=n, LOCAL_RANK=rank, LOCAL_WORLD_SIZE=n,
                        HORO_RENDEZVOUS_ADDR="127.0.0.1", HORO_RENDEZVOUS_PORT=port, HORO_SECRET="5e" * 16,
                        **settings)
        procs.append(subprocess.Popen([sys.executable, script, *map(str, args)], env=env, text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def finish(proc):
    """(returncode, stdout, stderr) of a process, killing it if it outlives CHILD_TIMEOUT."""
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"rank did not finish:\nstdout:\n{out}\nstderr:\n{err}") from None
    return proc.returncode, out, err


def reports(out):
    """The JSON lines a worker printed with report()."""
    return [json.loads(line[len("REPORT "):]) for line in out.splitlines() if line.startswith("REPORT ")]


def hororun(*args):
    return subprocess.run([sys.executable, "-m", "horo_runner.launch", *args], env=clean_env(), text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=CHILD_TIMEOUT)


# Shared by the worker scripts: print one JSON line describing an outcome.
REPORT = """
    import json, os, signal, sys
    import torch
    import horo_torch as hvd

    def report(what, fn):
        try:
            value = fn()
            print("REPORT " + json.dumps({"what": what, "value": value.tolist()}), flush=True)
        except Exception as exc:
            print("REPORT " + json.dumps({"what": what, "error": [c.__name__ for c in type(exc).__mro__],
                                          "message": str(exc)}), flush=True)
"""

INTERNAL = {"HoroInternalError", "RuntimeError"}  # HorovodInternalError is HoroInternalError


# Mismatches ---------------------------------------------------------------------------------------

def mismatch_cases(hvd, torch, rank):
    """(case, call, expected message); rank 1 or 2 disagrees with the others."""
    one, two = rank == 1, rank == 2
    return [
        ("shape", lambda: hvd.allreduce(torch.ones(4 if one else 3, 2), name="mm.shape"),
         "Mismatched shapes for allreduce tensor 'allreduce.mm.shape': ranks 0, 2 have [3, 2], rank 1 has [4, 2]"),
        # Every rank is named, those that passed the same value together (rank 0's too).
        ("shape on every rank", lambda: hvd.allreduce(torch.ones(3 + rank), name="mm.shapes"),
         "Mismatched shapes for allreduce tensor 'allreduce.mm.shapes': rank 0 has [3], rank 1 has [4], "
         "rank 2 has [5]"),
        ("shape on two ranks", lambda: hvd.allreduce(torch.ones(4 if rank else 3), name="mm.shapes2"),
         "Mismatched shapes for allreduce tensor 'allreduce.mm.shapes2': rank 0 has [3], ranks 1, 2 have [4]"),
        ("dtype", lambda: hvd.allreduce(torch.ones(3, dtype=torch.float64 if two else torch.float32), name="mm.dtype"),
         "Mismatched data types for allreduce tensor 'allreduce.mm.dtype': ranks 0, 1 have float32, "
         "rank 2 has float64"),
        ("op", lambda: hvd.allreduce(torch.ones(3), op=hvd.Max if one else hvd.Sum, name="mm.op"),
         "Mismatched reduction operations for allreduce tensor 'allreduce.mm.op': ranks 0, 2 have Sum, rank 1 has Max"),
        ("root rank", lambda: hvd.broadcast(torch.ones(3), root_rank=1 if two else 0, name="mm.root"),
         "Mismatched root ranks for broadcast tensor 'broadcast.mm.root': ranks 0, 1 have 0, rank 2 has 1"),
        ("prescale", lambda: hvd.allreduce(torch.ones(3), prescale_factor=2.0 if one else 1.0, name="mm.pre"),
         "Mismatched scale factors for allreduce tensor 'allreduce.mm.pre': ranks 0, 2 have prescale 1 / postscale 1, "
         "rank 1 has prescale 2 / postscale 1"),
        ("postscale", lambda: hvd.synchronize(hvd.allreduce_async_(torch.ones(3), postscale_factor=0.5 if two else 1.0,
                                                                   name="mm.post")),
         "Mismatched scale factors for allreduce tensor 'allreduce.mm.post': ranks 0, 1 have prescale 1 / postscale 1, "
         "rank 2 has prescale 1 / postscale 0.5"),
        ("alltoall trailing shape", lambda: hvd.alltoall(torch.ones(3, 2 if two else 1), splits=[1, 1, 1],
                                                         name="mm.a2a2"),
         "Mismatched shapes for alltoall tensor 'alltoall.mm.a2a2': ranks 0, 1 have rank 2 tensor with trailing "
         "dimensions [1], rank 2 has rank 2 tensor with trailing dimensions [2]"),
        ("allgather trailing shape", lambda: hvd.allgather(torch.ones(rank + 1, 2 if one else 1), name="mm.ag"),
         "Mismatched shapes for allgather tensor 'allgather.mm.ag': ranks 0, 2 have rank 2 tensor with trailing "
         "dimensions [1], rank 1 has rank 2 tensor with trailing dimensions [2]"),
        ("reducescatter shape", lambda: hvd.reducescatter(torch.ones(4 if two else 3), name="mm.rs"),
         "Mismatched shapes for reducescatter tensor 'reducescatter.mm.rs': ranks 0, 1 have [3], rank 2 has [4]"),
        ("reducescatter op", lambda: hvd.reducescatter(torch.ones(3), op=hvd.Sum if one else hvd.Average,
                                                       name="mm.rsop"),
         "Mismatched reduction operations for reducescatter tensor 'reducescatter.mm.rsop': ranks 0, 2 have Average, "
         "rank 1 has Sum"),
        ("grouped member", lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(3 if one else 4)], name="mm.g"),
         "Mismatched shapes for allreduce tensor 'grouped_allreduce.mm.g.1': ranks 0, 2 have [4], rank 1 has [3]"),
        # A grouped call of one tensor against groups of two (it once left every rank waiting).
        ("grouped size", lambda: hvd.grouped_allreduce([torch.ones(2)] * (1 if one else 2), name="mm.gs"),
         "Mismatched grouped calls for allreduce tensor 'grouped_allreduce.mm.gs.0': ranks 0, 2 have it in a "
         "group of 2 tensors led by 'grouped_allreduce.mm.gs.0', rank 1 has it as a single tensor"),
        # The same under a name the response cache holds, whose members the ranks announce by id.
        ("grouped size, cached", lambda: [hvd.grouped_allreduce([torch.ones(2)] * 2, name="mm.gsc") for _ in range(3)]
         and hvd.grouped_allreduce([torch.ones(2)] * (1 if one else 2), name="mm.gsc"),
         "Mismatched grouped calls for allreduce tensor 'grouped_allreduce.mm.gsc.0': ranks 0, 2 have it in a "
         "group of 2 tensors led by 'grouped_allreduce.mm.gsc.0', rank 1 has it as a single tensor"),
    ]


def mismatch_job():
    import torch

    import horo_torch as hvd
    hvd.init()
    rank = hvd.rank()
    out = []
    for case, call, _ in mismatch_cases(hvd, torch, rank):
        entry = {"case": case}
        try:
            entry["value"] = call()
        except Exception as exc:  # noqa: BLE001 - the type is what is checked
            entry.update(error=type(exc).__name__, message=str(exc),
                         is_internal=isinstance(exc, hvd.HorovodInternalError),
                         is_runtime=isinstance(exc, RuntimeError))
        # The job goes on: the next collective completes with exact values.
        entry["after"] = hvd.allreduce(torch.full((2,), rank + 1.0), op=hvd.Sum, name=f"after.{case}").tolist()
        out.append(entry)
    # Collectives other than allreduce while a rank has joined are refused on the others.
    if rank == 2:
        out.append({"case": "join", "join": hvd.join()})
    else:
        entry = {"case": "join"}
        try:
            hvd.allgather(torch.ones(1), name="mm.join")
        except Exception as exc:  # noqa: BLE001
            entry.update(error=type(exc).__name__, message=str(exc))
        entry["join"] = hvd.join()
        out.append(entry)
    hvd.shutdown()
    return out


def test_mismatch_raises_on_every_rank_and_the_job_goes_on():
    import torch

    import horo_torch as hvd
    cases = mismatch_cases(hvd, torch, 0)
    results = horo_runner.run(mismatch_job, num_proc=N)
    for rank, entries in enumerate(results):
        assert [e["case"] for e in entries] == [c for c, _, _ in cases] + ["join"]
        for (case, _, message), entry in zip(cases, entries):
            assert "value" not in entry, f"rank {rank} {case}: no error"
            assert (entry["error"], entry["message"]) == ("HoroMismatchError", message), f"rank {rank} {case}"
            assert entry["is_internal"] and entry["is_runtime"], f"rank {rank} {case}"
            assert entry["after"] == [6.0, 6.0], f"rank {rank} {case}"
        join = entries[-1]
        # Rank 2 joined first; ranks 0 and 1 join after their allgather failed, either may be last.
        assert join["join"] == results[0][-1]["join"] and join["join"] in (0, 1)
        if rank != 2:
            assert join["error"] == "HoroMismatchError"
            assert join["message"] == ("allgather of tensor 'allgather.mm.join' is not supported while ranks have "
                                       "joined (rank 2 joined process set 0); only allreduce works with join")


def invalid_splits_job():
    import torch

    import horo_torch as hvd
    hvd.init()
    rank = hvd.rank()
    # Rank 1's splits do not add up to its first dimension; the others are fine. Every rank must
    # get the error (not wait for rank 1), and the job goes on.
    splits = [1, 1, 0] if rank == 1 else [1, 1, 1]
    entry = {}
    try:
        entry["value"] = hvd.alltoall(torch.ones(3), splits=splits, name="bad.splits")
    except ValueError as exc:
        entry.update(error=type(exc).__name__, message=str(exc))
    entry["after"] = hvd.allreduce(torch.full((2,), rank + 1.0), op=hvd.Sum, name="after.splits").tolist()
    return entry


def test_invalid_splits_on_one_rank_raise_value_error_on_every_rank():
    for rank, entry in enumerate(horo_runner.run(invalid_splits_job, num_proc=N)):
        assert "value" not in entry, f"rank {rank}: no error"
        assert entry["error"] == "HoroInvalidArgument", f"rank {rank}"
        assert entry["message"] == ("alltoall tensor 'alltoall.bad.splits': rank 1 passed splits that sum to 2, "
                                    "expected its first dimension 3"), f"rank {rank}"
        assert entry["after"] == [6.0, 6.0]


def refused_input_job():
    import torch

    import horo_torch as hvd
    hvd.init()
    rank = hvd.rank()
    out = {}

    def attempt(case, call):
        try:
            value = call()
            out[case] = {"value": value.tolist() if isinstance(value, torch.Tensor) else repr(value)}
        except Exception as exc:  # noqa: BLE001 - the type is what is checked
            out[case] = {"error": type(exc).__name__, "message": str(exc)}
        # The job goes on: an unnamed collective after it agrees on its name and values.
        out[case]["after"] = hvd.allreduce(torch.full((2,), rank + 1.0), op=hvd.Sum).tolist()

    def dtype_on(bad_rank, dtype=torch.complex64):
        return dtype if rank == bad_rank else torch.float32

    # A name the ranks have agreed on before, so that the others run it from the response cache.
    for _ in range(3):
        hvd.allreduce(torch.ones(3), name="known")
    attempt("cached name", lambda: hvd.allreduce(torch.ones(3, dtype=dtype_on(1)), name="known"))
    attempt("cached name again", lambda: hvd.allreduce(torch.ones(3), name="known"))
    attempt("unnamed sparse", lambda: hvd.allreduce(torch.eye(3).to_sparse() if rank == 2 else torch.eye(3)))
    attempt("grouped member", lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(2, dtype=dtype_on(1))],
                                                            name="group"))
    attempt("async", lambda: hvd.synchronize(hvd.allreduce_async_(torch.ones(2, dtype=dtype_on(2)), name="async")))
    attempt("allgather", lambda: hvd.allgather(torch.ones(2, dtype=dtype_on(0, torch.complex128)), name="gather"))
    attempt("broadcast sparse", lambda: hvd.broadcast(torch.eye(2).to_sparse() if rank == 1 else torch.eye(2), 0,
                                                      name="bcast"))
    attempt("every rank", lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64), name="all"))
    # Not a tensor at all, on one rank: a Python number, a NumPy array, a grouped member; also under
    # a name the ranks agreed on before (its memo on this rank must not raise first).
    attempt("a float", lambda: hvd.allreduce(2.0 if rank == 1 else torch.ones(2), name="float"))
    attempt("a NumPy array", lambda: hvd.allgather(np.ones(2, np.float32) if rank == 0 else torch.ones(2),
                                                   name="array"))
    attempt("a float, grouped", lambda: hvd.grouped_reducescatter(
        [torch.ones(3), 1.0 if rank == 2 else torch.ones(3)], name="float.g"))
    attempt("a float, cached name", lambda: hvd.allreduce(3.0 if rank == 1 else torch.ones(3), name="known"))
    attempt("a float, broadcast_", lambda: hvd.broadcast_(1.0 if rank == 2 else torch.ones(2), 0, name="float.b"))
    # An argument the core refuses (an op it does not know), passed by one rank only.
    attempt("unknown op", lambda: hvd.allreduce(torch.ones(2), op=99 if rank == 2 else hvd.Sum, name="op"))
    attempt("unknown op, grouped", lambda: hvd.grouped_allreduce([torch.ones(2)] * 2, op=98 if rank == 0 else hvd.Sum,
                                                                 name="op.g"))
    # Horovod's deprecated average beside op: Horovod's ValueError, on every rank.
    attempt("average beside op", lambda: hvd.allreduce(torch.ones(2), average=True if rank == 1 else None, op=hvd.Sum,
                                                       name="both"))
    # Arguments of the wrong type, checked before the core: refused the same way.
    attempt("op of the wrong type", lambda: hvd.allreduce(torch.ones(2), op="sum" if rank == 1 else hvd.Sum,
                                                          name="op.type"))
    attempt("root_rank of the wrong type, async", lambda: hvd.synchronize(
        hvd.broadcast_async(torch.ones(2), 0.0 if rank == 2 else 0, name="root.type")))
    attempt("fractional splits", lambda: hvd.alltoall(torch.ones(3), splits=[1, 1.5, 0.5] if rank == 0 else [1, 1, 1],
                                                      name="splits.type"))
    attempt("one number for splits", lambda: hvd.alltoall(torch.ones(3), splits=3 if rank == 1 else [1, 1, 1],
                                                          name="splits.one"))
    attempt("a split past int64", lambda: hvd.alltoall(torch.ones(3), splits=[2**63, 0, 0] if rank == 2 else [1, 1, 1],
                                                       name="splits.big"))
    # Options given as values that cannot be a cache's key (a NumPy array, a list): checked as any
    # other value, accepted or refused on every rank.
    attempt("a NumPy array for a scale", lambda: hvd.allreduce(torch.ones(3), name="scale.array",
                                                               prescale_factor=np.array(1.0) if rank == 1 else 1.0))
    attempt("a NumPy array for a root", lambda: hvd.broadcast(torch.ones(3), np.array(0) if rank == 2 else 0,
                                                              name="root.array"))
    attempt("a list for a scale", lambda: hvd.allreduce(torch.ones(2), prescale_factor=[0.5] if rank == 1 else 0.5,
                                                        name="scale.list"))
    attempt("a scale past float's range", lambda: hvd.allreduce(torch.ones(2), prescale_factor=10**400 if rank == 0
                                                                else 1.0, name="scale.big"))
    attempt("reducescatter, a scale that is no number", lambda: hvd.reducescatter(
        torch.ones(3), prescale_factor="x" if rank == 2 else 1.0, name="rs.scale"))

    # A compression that fails on one rank: not a compressor at all, or one that raises there.
    class Failing:
        @staticmethod
        def compress(tensor):
            raise ValueError("no room")

        @staticmethod
        def decompress(tensor, ctx):
            return tensor

    def compression_on(bad_rank, bad):
        return bad if rank == bad_rank else hvd.Compression.none

    attempt("not a compression", lambda: hvd.allreduce(torch.ones(2), compression=compression_on(1, object()),
                                                       name="compress.not"))
    attempt("a compression that raises, grouped", lambda: hvd.grouped_allreduce(
        [torch.ones(2)] * 2, compression=compression_on(2, Failing), name="compress.g"))
    attempt("reducescatter, a compression that raises", lambda: hvd.reducescatter(
        torch.ones(3), compression=compression_on(0, Failing), name="compress.rs"))
    hvd.shutdown()
    return out


def test_input_only_one_rank_refuses_raises_on_every_rank():
    """A tensor that one rank's binding cannot pass to the core (an unsupported dtype, a sparse
    layout, not a tensor at all, a compression that fails on it) fails the collective on every rank,
    named after that rank, instead of raising on that rank alone while the others wait for it."""
    supported = "(supported: uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, bool, uint16)"
    sparse = ("passed a tensor of layout torch.sparse_coo; collectives take dense (strided) tensors: call "
              ".to_dense(), or reduce a sparse gradient with sparse_allreduce_async or DistributedOptimizer")
    not_tensor = "where a torch.Tensor is expected: convert it with torch.as_tensor()"
    expected = {
        "cached name": f"allreduce tensor 'allreduce.known': rank 1 passed dtype torch.complex64, which is not "
                       f"supported {supported}",
        "cached name again": None,
        "unnamed sparse": f"allreduce tensor 'allreduce.noname.2': rank 2 {sparse}",
        "grouped member": f"allreduce tensor 'grouped_allreduce.group.0': rank 1 passed dtype torch.complex64 for "
                          f"'grouped_allreduce.group.1', which is not supported {supported}",
        "async": f"allreduce tensor 'allreduce.async': rank 2 passed dtype torch.complex64, which is not supported "
                 f"{supported}",
        "allgather": f"allgather tensor 'allgather.gather': rank 0 passed dtype torch.complex128, which is not "
                     f"supported {supported}",
        "broadcast sparse": f"broadcast tensor 'broadcast.bcast': rank 1 {sparse}",
        "every rank": f"allreduce tensor 'allreduce.all': ranks 0, 1, 2 passed dtype torch.complex64, which is not "
                      f"supported {supported}",
        "a float": f"allreduce tensor 'allreduce.float': rank 1 passed a value of type float {not_tensor}",
        "a NumPy array": f"allgather tensor 'allgather.array': rank 0 passed a value of type ndarray {not_tensor}",
        "a float, grouped": f"reducescatter tensor 'grouped_reducescatter.float.g.0': rank 2 passed a value of type "
                            f"float for 'grouped_reducescatter.float.g.1' {not_tensor}",
        "a float, cached name": f"allreduce tensor 'allreduce.known': rank 1 passed a value of type float {not_tensor}",
        "a float, broadcast_": f"broadcast tensor 'broadcast.float.b': rank 2 passed a value of type float "
                               f"{not_tensor}",
        "unknown op": "allreduce tensor 'allreduce.op': rank 2 passed an invalid argument: unknown reduce op 99",
        "unknown op, grouped": "allreduce tensor 'grouped_allreduce.op.g.0': rank 0 passed an invalid argument for "
                               "'grouped_allreduce.op.g.0': unknown reduce op 98",
        "average beside op": "allreduce tensor 'allreduce.both': rank 1 passed an invalid argument: The op parameter "
                             "supersedes average. Please provide only one of them.",
        "op of the wrong type": "allreduce tensor 'allreduce.op.type': rank 1 passed an invalid argument: op must be "
                                "one of hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max and hvd.Product, got 'sum'",
        "root_rank of the wrong type, async": "broadcast tensor 'broadcast.root.type': rank 2 passed an invalid "
                                              "argument: root_rank must be an integer rank, got 0.0",
        "fractional splits": "alltoall tensor 'alltoall.splits.type': rank 0 passed an invalid argument: alltoall "
                             "splits must be whole numbers, got [1, 1.5, 0.5]",
        "one number for splits": "alltoall tensor 'alltoall.splits.one': rank 1 passed 1 splits, expected one per rank "
                                 "of the process set (3)",
        "a split past int64": "alltoall tensor 'alltoall.splits.big': rank 2 passed an invalid argument: alltoall "
                              f"splits must be whole numbers, got [{2**63}, 0, 0]",
        "a NumPy array for a scale": None,
        "a NumPy array for a root": None,
        "a list for a scale": "allreduce tensor 'allreduce.scale.list': rank 1 passed an invalid argument: "
                              "prescale_factor must be a number, got [0.5]",
        "a scale past float's range": "allreduce tensor 'allreduce.scale.big': rank 0 passed an invalid argument: "
                                      f"prescale_factor must be a number, got {10**400}",
        "reducescatter, a scale that is no number": "reducescatter tensor 'reducescatter.rs.scale': rank 2 passed an "
                                                    "invalid argument: prescale_factor must be a number, got 'x'",
        "not a compression": "allreduce tensor 'allreduce.compress.not': rank 1 could not compress its tensor with "
                             "compression object: AttributeError: 'object' object has no attribute 'compress'",
        "a compression that raises, grouped": "allreduce tensor 'grouped_allreduce.compress.g.0': rank 2 could not "
                                              "compress its tensor with compression Failing: ValueError: no room",
        "reducescatter, a compression that raises": "reducescatter tensor 'reducescatter.compress.rs': rank 0 could "
                                                    "not compress its tensor with compression Failing: ValueError: "
                                                    "no room",
    }
    for rank, out in enumerate(horo_runner.run(refused_input_job, num_proc=N)):
        assert list(out) == list(expected), f"rank {rank}"
        for case, message in expected.items():
            entry = out[case]
            if message is None:
                assert entry["value"] == [1.0] * 3, f"rank {rank} {case}: {entry}"
            else:
                assert (entry.get("error"), entry.get("message")) == ("HoroInvalidArgument", message), \
                    f"rank {rank} {case}: {entry}"
            assert entry["after"] == [6.0, 6.0], f"rank {rank} {case}"


# Lost ranks ---------------------------------------------------------------------------------------

LOST_RANK_WORKER = REPORT + """
    hvd.init()
    rank, victim, mode = hvd.rank(), int(sys.argv[1]), sys.argv[2]
    big = torch.ones(1 << 22)
    report("warmup", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum, name="warmup"))
    if rank == victim:
        if mode == "forked":  # a child that outlives the rank holds copies of its sockets
            child = os.fork()
            if child == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # let the test's pipes reach end of file
                    os.dup2(null, fd)
                signal.alarm(300)  # ends it if the test cannot (SIGALRM's default action)
                signal.pause()  # until the test's SIGTERM
                os._exit(0)
            print(f"CHILD {child}", flush=True)
        if mode not in ("before", "forked", "frozen-idle"):
            hvd.allreduce_async(big, name="big")
        os.kill(os.getpid(), signal.SIGSTOP if mode.startswith("frozen") else signal.SIGKILL)
    report("collective", lambda: hvd.allreduce(big, name="big"))
    report("next", lambda: hvd.allreduce(torch.ones(4), name="next"))
"""


@pytest.mark.parametrize("victim,mode", [(1, "before"), (1, "during"), (2, "during"), (0, "during"), (1, "forked")],
                         ids=["before-collective", "during-collective", "last-rank-during-collective",
                              "coordinator-during-collective", "with-a-forked-child-alive"])
def test_killed_rank_fails_every_other_rank(tmp_path, victim, mode):
    script = write_script(tmp_path, LOST_RANK_WORKER)
    procs = spawn_ranks(script, N, (victim, mode), HORO_PEER_TIMEOUT_SECONDS=3)
    outcomes = {victim: finish(procs[victim])}
    child = re.search(r"^CHILD (\d+)$", outcomes[victim][1], re.M)
    assert (child is not None) == (mode == "forked"), outcomes[victim]
    try:
        outcomes.update((rank, finish(p)) for rank, p in enumerate(procs) if rank != victim)
    finally:
        if child:  # it waits for SIGTERM, however the others ended
            os.kill(int(child.group(1)), signal.SIGTERM)
    outcomes = [outcomes[rank] for rank in range(N)]
    assert outcomes[victim][0] == -signal.SIGKILL
    for rank, (code, out, err) in enumerate(outcomes):
        if rank == victim:
            continue
        assert code == 0, err
        got = reports(out)
        assert [g["what"] for g in got] == ["warmup", "collective", "next"], out
        assert got[0]["value"] == [3.0] * 4
        for g in got[1:]:
            assert "HoroPeerLostError" in g.get("error", []) and INTERNAL <= set(g["error"]), (rank, g)
            assert "lost" in g["message"] and "rank" in g["message"], (rank, g)
            # The dead rank is named, not rank 0 that closed after telling everyone (a worker that
            # waited on rank 0 used to report rank 0's closed connection).
            assert f"rank {victim}" in g["message"], (rank, g)
        if rank == 0:  # the coordinator sees the loss first and names the rank
            assert f"rank {victim} exited or lost its connection without calling shutdown()" in got[1]["message"]


FORKING_WORKER = REPORT + """
    hvd.init()
    rank = hvd.rank()
    report("before", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum, name="before"))
    if rank == 1:
        pending = hvd.allreduce_async(torch.ones(4), op=hvd.Sum, name="pending")
        child = os.fork()
        if child == 0:  # one bit per wrong outcome; exits the normal way (atexit's hvd.shutdown() runs)
            def refused(call):
                try:
                    call()
                except hvd.HoroShutdownError as exc:
                    return "forked from rank 1" in str(exc)
                return False
            wrong = (hvd.rank(), hvd.size(), hvd.is_initialized()) != (1, 3, True)
            wrong |= (not refused(lambda: hvd.synchronize(pending))) << 1
            wrong |= (not refused(lambda: hvd.allreduce(torch.ones(1), name="in_child"))) << 2
            # "before" ran in the rank: its run, bound to the rank's runtime, is refused too.
            wrong |= (not refused(lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum, name="before"))) << 3
            hvd.init()  # does nothing in a forked child
            sys.exit(int(wrong))
        report("child", lambda: torch.tensor([os.waitpid(child, 0)[1]]))
        report("pending", lambda: hvd.synchronize(pending))
    else:
        report("pending", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum, name="pending"))
    report("after", lambda: hvd.allreduce(torch.ones(1 << 16), op=hvd.Sum, name="after")[:4])
"""


def test_a_forked_child_keeps_the_rank_s_topology_and_leaves_the_job_running(tmp_path):
    # A child forked from a rank is not part of the job. As in Horovod it keeps the rank's topology
    # (a DataLoader worker may shard by hvd.rank()) and init() does nothing; its collectives, and the
    # handles it inherited, raise at once instead of driving the rank's runtime; its exit (atexit's
    # shutdown) must not close the shared-memory rings its parent still uses.
    script = write_script(tmp_path, FORKING_WORKER)
    outcomes = [finish(p) for p in spawn_ranks(script, N)]
    for rank, (code, out, err) in enumerate(outcomes):
        assert code == 0, err
        got = {g["what"]: g for g in reports(out)}
        for what in ("before", "pending", "after"):
            assert got[what].get("value") == [3.0] * 4, (rank, what, got)
        if rank == 1:
            assert got["child"].get("value") == [0], got  # exit status 0: every check in the child held


def test_frozen_rank_fails_every_other_rank(tmp_path):
    # A stopped rank keeps its connections open: the others must give up on their own, through
    # the peer timeout (if the collective started) or the stall shutdown (if it never did).
    script = write_script(tmp_path, LOST_RANK_WORKER)
    procs = spawn_ranks(script, N, (1, "frozen"), HORO_PEER_TIMEOUT_SECONDS=2, HORO_STALL_CHECK_TIME_SECONDS=1,
                        HORO_STALL_SHUTDOWN_TIME_SECONDS=2)
    try:
        outcomes = {rank: finish(procs[rank]) for rank in (0, 2)}
    finally:
        procs[1].kill()
        procs[1].communicate()
    # Which mechanism fires depends on how far rank 1 got before it stopped; a rank that sees
    # no progress names it, the others see that rank's connections close.
    stalled = re.compile(r"stalled for [\d.]+ seconds \(HORO_STALL_SHUTDOWN_TIME_SECONDS=2\)\. "
                         r"Missing ranks: rank 1: \[allreduce\.big\]")
    messages = []
    for rank, (code, out, err) in outcomes.items():
        assert code == 0, err
        got = reports(out)
        assert [g["what"] for g in got] == ["warmup", "collective", "next"], out
        for g in got[1:]:
            assert INTERNAL <= set(g.get("error", [])), (rank, g)
        messages.append(got[1]["message"])
    assert any(stalled.search(m) or "no progress for 2 s" in m for m in messages), messages


FROZEN_IN_A_LOOP_WORKER = REPORT + """
    import time
    hvd.init()
    victim, tensors = int(sys.argv[1]), sys.argv[2]

    def loop():
        for step in range(10 ** 9):  # until the stall shutdown
            if hvd.rank() == victim and step == 50:
                os.kill(os.getpid(), signal.SIGSTOP)
            if tensors == "one":
                out = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="steady")
                continue
            first = hvd.allreduce_async(torch.ones(4), op=hvd.Sum, name="first")
            if step >= 50:
                time.sleep(0.05)  # "first" is announced, and its round open, before "second" comes
            second = hvd.allreduce_async(torch.ones(4), op=hvd.Sum, name="second")
            out = hvd.synchronize(first) + hvd.synchronize(second)
        return out

    report("loop", loop)
"""


def stall_shutdowns_beside_a_frozen_rank(tmp_path, victim, tensors):
    """Runs FROZEN_IN_A_LOOP_WORKER on N ranks, victim stopping itself; returns {rank: (its one
    report, stderr)} of the others, each of which must have failed in the stall shutdown (3 s)."""
    script = write_script(tmp_path, FROZEN_IN_A_LOOP_WORKER)
    procs = spawn_ranks(script, N, (victim, tensors), HORO_PEER_TIMEOUT_SECONDS=60, HORO_STALL_CHECK_TIME_SECONDS=1,
                        HORO_STALL_SHUTDOWN_TIME_SECONDS=3)
    try:
        outcomes = {rank: finish(procs[rank]) for rank in range(N) if rank != victim}
    finally:
        procs[victim].kill()
        procs[victim].communicate()
    failures = {}
    for rank, (code, out, err) in outcomes.items():
        assert code == 0, err
        (got,) = reports(out)
        assert INTERNAL <= set(got.get("error", [])), (rank, got)
        assert re.search(r"stalled for [\d.]+ seconds \(HORO_STALL_SHUTDOWN_TIME_SECONDS=3\)\. ", got["message"]), \
            (rank, got)
        failures[rank] = (got, err)
    return failures


def test_a_rank_frozen_in_a_loop_is_the_one_named(tmp_path):
    # In a loop of one repeated collective the ranks agree among themselves, a round of messages
    # per step. A rank stopped between two steps leaves the others' round open for ever; the stall
    # report looked only at completed rounds, so it named live ranks (rank 0, which answers a round
    # late, most often) or none, and the workers' warning blamed rank 0.
    outcomes = stall_shutdowns_beside_a_frozen_rank(tmp_path, victim=2, tensors="one")
    for rank, (got, _) in outcomes.items():
        assert got["message"].endswith("Missing ranks: rank 2: [allreduce.steady]"), (rank, got)
    assert "Missing ranks: rank 2: [allreduce.steady]" in outcomes[0][1], outcomes[0][1]
    assert "rank 0: [" not in outcomes[0][1], outcomes[0][1]
    assert ("the ranks' round of agreement waits for the message of rank 2 (rank 0's is in)"
            in outcomes[1][1]), outcomes[1][1]


def test_every_tensor_waiting_for_a_frozen_rank_is_named(tmp_path):
    # A tensor submitted while the round of an earlier one is open waits in this rank's next
    # message, unsent; the stall report left it out and named only the earlier tensor.
    for rank, (got, _) in stall_shutdowns_beside_a_frozen_rank(tmp_path, victim=2, tensors="two").items():
        assert got["message"].endswith("Missing ranks: rank 2: [allreduce.first, allreduce.second]"), (rank, got)


def outcomes_beside_a_frozen_rank_0(procs, before=lambda: None):
    """finish() of every rank but rank 0, after before(); rank 0, stopped, is killed afterwards."""
    try:
        before()
        return {rank: finish(procs[rank]) for rank in range(1, len(procs))}
    finally:
        procs[0].kill()
        procs[0].communicate()


def test_frozen_coordinator_is_noticed_by_the_workers(tmp_path):
    # A stopped rank 0 sends nothing and closes nothing, and its stall inspector is stopped with
    # it: the workers waited for ever without a word. They now warn, and with a stall shutdown
    # set they end the job once rank 0 could have done so itself.
    script = write_script(tmp_path, LOST_RANK_WORKER)
    procs = spawn_ranks(script, N, (0, "frozen-idle"), HORO_PEER_TIMEOUT_SECONDS=2, HORO_STALL_CHECK_TIME_SECONDS=1,
                        HORO_STALL_SHUTDOWN_TIME_SECONDS=1)
    outcomes = outcomes_beside_a_frozen_rank_0(procs)
    for rank, (code, out, err) in outcomes.items():
        assert code == 0, err
        got = reports(out)
        assert [g["what"] for g in got] == ["warmup", "collective", "next"], out
        assert "rank 0 (the coordinator) sent this rank nothing for" in got[1]["message"], (rank, got[1])
        assert "and rank 0 (the coordinator) has sent this rank nothing meanwhile" in err, (rank, err)


FROZEN_AT_SHUTDOWN_WORKER = REPORT + """
    hvd.init()
    report("warmup", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum, name="warmup"))
    if hvd.rank() == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
    sys.stdin.readline()  # the test's word that rank 0 is stopped
    hvd.shutdown()
    report("shut down", lambda: torch.tensor([hvd.is_initialized()]))
"""


def wait_until_stopped(proc):
    """Returns once proc is in the stopped state (the third field of /proc/<pid>/stat is "T")."""
    while True:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        assert proc.poll() is None, finish(proc)
        time.sleep(0.01)


def test_frozen_coordinator_is_noticed_in_shutdown(tmp_path):
    # shutdown() waits for rank 0's answer; a stopped rank 0 never gives it, and the workers
    # waited for ever without a word (also in the shutdown that atexit runs). They now treat it
    # as a collective waiting for rank 0.
    script = write_script(tmp_path, FROZEN_AT_SHUTDOWN_WORKER)
    procs = spawn_ranks(script, N, HORO_PEER_TIMEOUT_SECONDS=2, HORO_STALL_CHECK_TIME_SECONDS=1,
                        HORO_STALL_SHUTDOWN_TIME_SECONDS=1)
    def once_rank_0_is_stopped():
        wait_until_stopped(procs[0])
        for rank in range(1, N):
            procs[rank].stdin.write("go\n")
            procs[rank].stdin.flush()

    outcomes = outcomes_beside_a_frozen_rank_0(procs, once_rank_0_is_stopped)
    for rank, (code, out, err) in outcomes.items():
        assert code == 0, err
        assert [g.get("value") for g in reports(out)] == [[3.0] * 4, [False]], out
        # The watch looks every 250 ms, so a loaded machine may see a second more.
        assert re.search(r"shutdown\(\) has waited \d+ s, and rank 0 \(the coordinator\) has sent this rank nothing "
                         r"meanwhile", err), (rank, err)
        assert re.search(r"rank 0 \(the coordinator\) sent this rank nothing for \d+ s while shutdown\(\) "
                         r"waited", err), (rank, err)


def test_hororun_exits_nonzero_naming_the_killed_rank(tmp_path):
    script = write_script(tmp_path, LOST_RANK_WORKER)
    proc = hororun("-np", str(N), sys.executable, script, "1", "before")
    assert proc.returncode != 0
    assert "hororun: rank 1 was killed by signal 9 (SIGKILL)" in proc.stderr, proc.stderr
    # Output of the ranks carries their prefix; the warm-up completed everywhere before the kill.
    for rank in range(N):
        assert f'[{rank}]<stdout>:REPORT {{"what": "warmup", "value": [3.0, 3.0, 3.0, 3.0]}}\n' in proc.stdout


# A control frame that no rank sent ------------------------------------------------------------------

FORGED_FRAME_WORKER = REPORT + """
    import struct

    def socket_with_port(port, field):
        # The descriptor of this process's TCP socket whose local (field 1) or remote (field 2) port
        # is port, from /proc: no psutil here.
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if int(fields[field].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return int(fd)
        raise SystemExit(f"no socket on port {port}")

    hvd.init()
    report("before", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum, name="before"))
    if hvd.rank() == int(sys.argv[1]):
        # As someone on the path would: a well-formed frame (length, payload, 32 bytes where the MAC
        # goes) written into the control connection between ranks 0 and 1. Rank 0 logged rank 1's
        # port of it, which is rank 0's remote port (rank 0's own port is that of the data one too).
        fd = socket_with_port(int(sys.stdin.readline()), 2 if hvd.rank() == 0 else 1)
        os.write(fd, struct.pack("<Q", 4) + b"evil" + bytes(32))
    report("after", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum, name="after"))
"""


@pytest.mark.parametrize("writer", [1, 0], ids=["towards-rank-0", "towards-rank-1"])
def test_a_forged_control_frame_fails_every_rank_naming_the_cause(tmp_path, writer):
    # Over TCP (no shared memory), bytes that no rank sent appear in an authenticated control
    # connection: the receiver refuses the frame, and every rank raises, naming the cause, instead
    # of acting on it or hanging.
    script = write_script(tmp_path, FORGED_FRAME_WORKER)
    procs = spawn_ranks(script, 2, (writer,), HORO_SHM_DISABLE=1, HORO_LOG_LEVEL="DEBUG", HORO_PEER_TIMEOUT_SECONDS=3)
    port_found = threading.Event()
    lines = []

    def read_rank0_log():
        for line in procs[0].stderr:
            lines.append(line)
            found = re.search(r"authenticated control connection with rank 1 at 127\.0\.0\.1:(\d+)", line)
            if found and not port_found.is_set():
                procs[writer].stdin.write(found.group(1) + "\n")
                procs[writer].stdin.flush()
                port_found.set()

    reader = threading.Thread(target=read_rank0_log, daemon=True)
    reader.start()
    try:
        port_found.wait(timeout=CHILD_TIMEOUT)  # before finish(), which closes the writer's stdin
        code1, out1, err1 = finish(procs[1])
        out0 = procs[0].stdout.read()
        code0 = procs[0].wait(timeout=CHILD_TIMEOUT)
    finally:
        for proc in procs:
            proc.kill()
    reader.join(timeout=CHILD_TIMEOUT)
    err0 = "".join(lines)
    assert port_found.is_set(), err0
    assert (code0, code1) == (0, 0), (err0, err1)
    reader, other = (0, 1) if writer == 1 else (1, 0)
    cause = (rf"rank {reader} stopped reading its control connection with rank {other} \(127\.0\.0\.1:\d+\): a control "
             r"frame failed authentication \(forged, altered, replayed or out of order\)")
    for rank, out in enumerate((out0, out1)):
        got = reports(out)
        assert [g["what"] for g in got] == ["before", "after"], out
        assert got[0]["value"] == [2.0] * 4
        assert "HoroPeerLostError" in got[1].get("error", []) and INTERNAL <= set(got[1]["error"]), (rank, got)
        # Every rank gives the cause: rank 1's connection is closed for reading only, so rank 0
        # can still tell it why the job stops.
        assert re.search(cause, got[1]["message"]), (rank, got[1]["message"])


REINIT_WORKER = REPORT + """
    import time
    for generation in range(3):
        hvd.init()
        report(f"generation {generation}", lambda: hvd.allreduce(torch.ones(2), name="x", op=hvd.Sum))
        if hvd.rank() == 0:
            time.sleep(0.5)  # the others are back at the rendezvous before rank 0 has shut down
        hvd.shutdown()
"""


def test_init_again_after_shutdown_without_hororun(tmp_path):
    # Launched as torchrun does, rank 0 hosts the rendezvous. It used to stop it at shutdown while
    # the others were already registering for the next init(), which then failed or timed out.
    script = write_script(tmp_path, REINIT_WORKER)
    for rank, (code, out, err) in enumerate(finish(p) for p in spawn_ranks(script, N, HORO_START_TIMEOUT=20)):
        assert code == 0, err
        assert reports(out) == [{"what": f"generation {g}", "value": [float(N)] * 2} for g in range(3)], (rank, out)


# Stalls -------------------------------------------------------------------------------------------

STALL_WORKER = REPORT + """
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    report("warmup", lambda: hvd.allreduce(torch.ones(1), op=hvd.Sum, name="warmup"))
    if rank == n - 1:
        sys.stdin.readline()  # the last rank submits only when the test says so
    report("stalled", lambda: hvd.allreduce(torch.full((2,), rank + 1.0), op=hvd.Sum, name="stall.x"))
"""

STALL_WARNING = ("Stall: one or more tensors were submitted by some ranks and have waited more than 1 seconds for "
                 "the others. Different ranks may be submitting different tensors, or some ranks none at all, which "
                 "will deadlock. Missing ranks: ")
# Rank 1 submits right after the warm-up; on a loaded machine it may still be missing too when the
# coordinator looks, and the one warning then names both ranks.
MISSING = re.compile(r"(rank 1: \[allreduce\.stall\.x\]; )?rank 2: \[allreduce\.stall\.x\]")


def stalled_job(tmp_path, worker, watched, marker):
    """Runs worker on N ranks with a 1 s stall time; once rank watched has logged a line with marker
    (EOF ends the wait), lets the last rank go on. Returns the lines watched logged up to it, and
    every rank's finish()."""
    script = write_script(tmp_path, worker)
    procs = spawn_ranks(script, N, HORO_STALL_CHECK_TIME_SECONDS=1, HORO_LOG_HIDE_TIME=1)
    seen = []
    for line in procs[watched].stderr:
        seen.append(line)
        if marker in line:
            break
    procs[-1].stdin.write("go\n")
    procs[-1].stdin.flush()
    return seen, [finish(p) for p in procs]


def test_stall_warning_names_the_missing_rank_and_tensor(tmp_path):
    seen, outcomes = stalled_job(tmp_path, STALL_WORKER, 0, "Stall")  # the coordinator logs the warning
    assert seen and STALL_WARNING in seen[-1], "".join(seen)
    assert MISSING.fullmatch(seen[-1].rstrip("\n").split(STALL_WARNING, 1)[1]), seen[-1]
    assert "[horo WARNING rank 0]" in seen[-1]
    for rank, (code, out, err) in enumerate(outcomes):
        assert code == 0, err
        assert reports(out) == [{"what": "warmup", "value": [3.0]}, {"what": "stalled", "value": [6.0, 6.0]}]


LOOP_STALL_WORKER = REPORT + """
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    for _ in range(20):
        hvd.allreduce(torch.ones(2), op=hvd.Sum, name="steady")
    if rank == n - 1:
        sys.stdin.readline()  # the last rank submits its next step only when the test says so
    report("stalled", lambda: hvd.allreduce(torch.ones(2), op=hvd.Sum, name="steady"))
"""


def test_a_worker_names_the_rank_that_has_not_submitted_a_repeated_tensor(tmp_path):
    # In a loop of one repeated collective the ranks agree among themselves, and every rank sees
    # which ranks announced the tensor. A worker whose wait left rank 0 silent said only that rank
    # 0 had sent nothing and might be stopped.
    seen, outcomes = stalled_job(tmp_path, LOOP_STALL_WORKER, 1, "has waited")
    assert seen and re.search(r"\[horo WARNING rank 1\] tensor 'allreduce\.steady' has waited \d+ s for rank 2, "
                              r"which the ranks' announcements show has not submitted it$", seen[-1]), seen
    for rank, (code, out, err) in enumerate(outcomes):
        assert code == 0, err
        assert reports(out) == [{"what": "stalled", "value": [3.0, 3.0]}]


@pytest.mark.parametrize("variable, seconds, settings", [
    ("HORO_STALL_SHUTDOWN_TIME_SECONDS", "2", {"HORO_STALL_CHECK_TIME_SECONDS": "1"}),
    # The shutdown applies below the warning time and with warnings off too: Horovod ignored it
    # there, and the job waited for ever (the default warning time is 60 s).
    ("HORO_STALL_SHUTDOWN_TIME_SECONDS", "2", {}),
    ("HORO_STALL_SHUTDOWN_TIME_SECONDS", "2", {"HORO_STALL_CHECK_DISABLE": "1"}),
    # Set under Horovod's name, the message names that variable (and its value as set).
    ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "2.5", {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"}),
], ids=["warning first", "before the warning", "warnings disabled", "HOROVOD_ names"])
def test_stall_shutdown_errors_instead_of_hanging(tmp_path, variable, seconds, settings):
    script = write_script(tmp_path, STALL_WORKER)
    procs = spawn_ranks(script, N, **{variable: seconds}, **settings)
    waiting = [finish(p) for p in procs[:-1]]  # these fail while the last rank still holds back
    procs[-1].stdin.write("go\n")
    procs[-1].stdin.flush()
    late = finish(procs[-1])
    message = re.compile(r"shutting down after tensors stalled for ([\d.]+) seconds "
                         rf"\({variable}={re.escape(seconds)}\)\. Missing ranks: (.*)")
    for rank, (code, out, err) in enumerate(waiting):
        assert code == 0, err
        got = reports(out)
        assert got[0] == {"what": "warmup", "value": [3.0]}
        match = message.match(got[1]["message"])
        assert match and 2 <= float(match[1]) < 10, (rank, got[1])
        assert MISSING.fullmatch(match[2]), (rank, got[1])
        assert "HoroShutdownError" in got[1]["error"] and INTERNAL <= set(got[1]["error"])
    code, out, err = late
    assert code == 0, err
    got = reports(out)
    assert "HoroShutdownError" in got[1]["error"] and INTERNAL <= set(got[1]["error"]), got
    assert "shut down" in got[1]["message"], got


# hororun and torch jobs -----------------------------------------------------------------------------

def test_hororun_prefixes_the_output_of_a_torch_job(tmp_path):
    script = write_script(tmp_path, """
        import sys, torch
        import horo_torch as hvd
        hvd.init()
        total = hvd.allreduce(torch.tensor([hvd.rank() + 1]), op=hvd.Sum)
        print(f"rank {hvd.rank()} sum {total.item()}", flush=True)
        print(f"rank {hvd.rank()} says hi", file=sys.stderr, flush=True)
        hvd.shutdown()
    """)
    proc = hororun("-np", "2", sys.executable, script)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0]<stdout>:rank 0 sum 3", "[1]<stdout>:rank 1 sum 3"]
    for rank in range(2):
        assert f"[{rank}]<stderr>:rank {rank} says hi\n" in proc.stderr
