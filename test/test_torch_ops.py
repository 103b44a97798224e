"""horo_torch's collectives as users see them: real processes over TCP, world sizes 1 to 5.

One ``horo_runner.run`` per world size runs every check on every rank (process start-up dominates
the cost on small machines) and returns a report: per group of checks, how many ran and which
failed. A rank contributes values derived from its rank, so every expected value is exact.
"""
import os
import warnings

import pytest
import torch

import horo_runner
import rank_checks
from torch_repeated_checks import (check_repeated_allgathers, check_repeated_named_calls,
                                   check_repeated_reducescatters_and_alltoalls, rows_of, sent_rows)

SIZES = [1, 2, 3, 4, 5]
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
INTEGER = {torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.int64}
COUNTS = [0, 1, 7]
LARGE = 65537
OPS = ["Average", "Sum", "Min", "Max", "Product"]


class Checks(rank_checks.Checks):
    """rank_checks.Checks plus exact comparison of torch tensors."""

    def equal(self, what, got, want):
        """got must be a tensor of want's dtype and shape with exactly want's values."""
        self.count += 1
        if not isinstance(got, torch.Tensor):
            self.fail(f"{what}: got {type(got).__name__} {got!r}, want a tensor")
        elif got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            self.fail(f"{what}: got {got.dtype}{list(got.shape)} {got.flatten()[:8].tolist()}, "
                      f"want {want.dtype}{list(want.shape)} {want.flatten()[:8].tolist()}")


# Exact values ------------------------------------------------------------------------------------

def contribution(op, rank, count, dtype):
    """What rank puts into an allreduce: small integers, so every dtype holds every result."""
    i = torch.arange(count, dtype=torch.float64)
    if dtype == torch.bool:
        return ((rank + i) % 3 != 0).to(torch.float64)
    if op == "Product":
        return 1.0 + (rank + i) % 2
    return (rank + 1.0) * (1 + i % 3)


def expected_allreduce(op, dtype, ranks, count):
    stack = torch.stack([contribution(op, r, count, dtype) for r in ranks])
    if dtype == torch.bool:
        bits = stack != 0
        return (bits.all(0) if op in ("Min", "Product") else bits.any(0)).to(dtype)
    if op in ("Sum", "Average"):
        total = stack.sum(0)
        if op == "Average":
            total = torch.trunc(total / len(ranks)) if dtype in INTEGER else total / len(ranks)
        return total.to(dtype)
    return {"Min": stack.min(0).values, "Max": stack.max(0).values, "Product": stack.prod(0)}[op].to(dtype)


def alltoall_block(src, dst, dtype=torch.int64):
    k = sent_rows(src, dst)
    return torch.tensor([[src, dst, j] for j in range(k)], dtype=torch.float64).reshape(k, 3).to(dtype)


# Groups of checks, each run on every rank --------------------------------------------------------

def check_before_init(hvd, c, env):
    c.same("is_initialized before init", hvd.is_initialized(), False)
    for fn_name, call in [("rank", lambda: hvd.rank()), ("size", lambda: hvd.size()),
                          ("local_rank", lambda: hvd.local_rank()),
                          ("allreduce", lambda: hvd.allreduce(torch.ones(2))),
                          ("allreduce_async_", lambda: hvd.allreduce_async_(torch.ones(2))),
                          ("allgather", lambda: hvd.allgather(torch.ones(2))),
                          ("broadcast", lambda: hvd.broadcast(torch.ones(2), 0)),
                          ("barrier", lambda: hvd.barrier()), ("join", lambda: hvd.join())]:
        c.raises(f"{fn_name} before init", [ValueError, hvd.HoroError], "init", call)


def check_topology(hvd, c, env):
    n = hvd.size()
    c.same("is_initialized", hvd.is_initialized(), True)
    c.same("rank", hvd.rank(), int(env["HORO_RANK"]))
    c.same("size", n, int(env["HORO_SIZE"]))
    c.same("local_rank", hvd.local_rank(), int(env["HORO_LOCAL_RANK"]))
    c.same("local_size", hvd.local_size(), int(env["HORO_LOCAL_SIZE"]))
    c.same("cross_rank", hvd.cross_rank(), int(env["HORO_CROSS_RANK"]))
    c.same("cross_size", hvd.cross_size(), int(env["HORO_CROSS_SIZE"]))
    # Everything runs on this host: one host with every rank.
    c.same("single host", (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()),
           (hvd.rank(), n, 0, 1))
    c.same("is_homogeneous", hvd.is_homogeneous(), True)
    for name in ["mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "ddl_built",
                 "ccl_built", "cuda_built", "rocm_built", "sycl_built"]:
        c.same(f"{name}() is a bool", type(getattr(hvd, name)()), bool)
    c.same("nccl_built() is an int", type(hvd.nccl_built()), int)
    c.same("gpu_available('torch')", hvd.gpu_available("torch"), torch.cuda.is_available())
    c.same("global set as Horovod prints it", str(hvd.global_process_set),
           f"ProcessSet(process_set_id=0, ranks={list(range(n))}, mpi_comm=None)")
    c.same("reduce op constants", (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product),
           (0, 1, 2, 3, 4, 5))
    c.same("global set", (hvd.global_process_set.process_set_id, hvd.global_process_set.size(),
                          hvd.global_process_set.rank(), hvd.global_process_set.included()),
           (0, n, hvd.rank(), True))
    c.raises("add_process_set without dynamic mode", [ValueError], "dynamic",
             lambda: hvd.add_process_set([0]))


def check_allreduce_matrix(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    ranks = range(n)
    pending = []
    for dtype in DTYPES:
        for op in OPS:
            if dtype == torch.bool and op == "Average":
                continue
            counts = COUNTS + ([LARGE] if op in ("Sum", "Max") else [])
            for count in counts:
                for in_place in (False, True):
                    x = contribution(op, r, count, dtype).to(dtype)
                    tag = f"m.{dtype}.{op}.{count}.{in_place}"
                    fn = hvd.allreduce_async_ if in_place else hvd.allreduce_async
                    before = x.clone()
                    pending.append((tag, x, before, in_place, fn(x, name=tag, op=getattr(hvd, op)),
                                    expected_allreduce(op, dtype, ranks, count)))
    for tag, x, before, in_place, handle, want in pending:
        got = hvd.synchronize(handle)
        c.equal(tag, got, want)
        if in_place:
            c.same(f"{tag} returns the input", got is x, True)
        else:
            c.equal(f"{tag} leaves the input", x, before)
    # The synchronous (autograd) form, the default op and the deprecated average flag.
    for dtype in DTYPES:
        op = "Sum" if dtype == torch.bool else "Average"
        x = contribution(op, r, 7, dtype).to(dtype)
        c.equal(f"allreduce {dtype} default op", hvd.allreduce(x) if dtype != torch.bool
                else hvd.allreduce(x, op=hvd.Sum), expected_allreduce(op, dtype, ranks, 7))
        c.equal(f"allreduce_ {dtype}", hvd.allreduce_(x.clone(), op=hvd.Max),
                expected_allreduce("Max", dtype, ranks, 7))
    x = contribution("Sum", r, 5, torch.float32).float()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c.equal("average=True", hvd.allreduce(x, average=True),
                expected_allreduce("Average", torch.float32, ranks, 5))
    c.same("average= is deprecated, as in Horovod", [(w.category, str(w.message)) for w in caught],
           [(DeprecationWarning, "Parameter `average` has been replaced with `op` and will be removed in v1.0")])
    c.equal("average=False", hvd.allreduce(x, average=False), expected_allreduce("Sum", torch.float32, ranks, 5))
    c.equal("allreduce_ average=False", hvd.allreduce_(x.clone(), average=False),
            expected_allreduce("Sum", torch.float32, ranks, 5))
    for fn in (hvd.allreduce, hvd.allreduce_, hvd.allreduce_async, hvd.allreduce_async_):
        c.raises(f"{fn.__name__} with average and op", [ValueError], "op",
                 lambda: fn(x.clone(), average=True, op=hvd.Sum))
    c.raises("Average of bool", [ValueError], "bool", lambda: hvd.allreduce(torch.ones(3, dtype=torch.bool)))
    # Arguments of the wrong type are named (cffi's own error named neither the argument nor the value).
    c.raises("op given as a string", [hvd.HoroInvalidArgument, ValueError],
             "op must be one of hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max and hvd.Product, got 'sum'",
             lambda: hvd.allreduce(x, op="sum"))
    c.raises("root_rank given as a float", [ValueError], "root_rank must be an integer rank, got 0.0",
             lambda: hvd.broadcast(x, 0.0))
    c.raises("prescale_factor given as a string", [ValueError], "prescale_factor must be a number, got 'x'",
             lambda: hvd.allreduce_async(x, prescale_factor="x"))
    c.equal("Adasum of equal vectors is their average", hvd.allreduce(torch.full((3,), 2.0), op=hvd.Adasum),
            torch.full((3,), 2.0))
    basis = torch.zeros(n)
    basis[r] = r + 1.0
    c.equal("Adasum of orthogonal vectors is their sum", hvd.allreduce(basis, op=hvd.Adasum),
            torch.arange(1.0, n + 1))
    c.raises("Adasum of integers", [ValueError], "Adasum is defined for float16, bfloat16, float32 and float64",
             lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum))
    c.raises("unsupported dtype", [ValueError], "complex64",
             lambda: hvd.allreduce(torch.ones(3, dtype=torch.complex64)))
    # A 0-d tensor and a multi-dimensional one keep their shape.
    c.equal("0-d tensor", hvd.allreduce(torch.tensor(float(r + 1)), op=hvd.Sum),
            torch.tensor(n * (n + 1) / 2))
    c.equal("3-d tensor", hvd.allreduce(torch.full((2, 3, 4), r + 1, dtype=torch.int32), op=hvd.Sum),
            torch.full((2, 3, 4), n * (n + 1) // 2, dtype=torch.int32))


def check_noncontiguous(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    total = n * (n + 1) // 2
    base = (torch.arange(15, dtype=torch.float64).reshape(5, 3) + 1) * (r + 1)
    want = (torch.arange(15, dtype=torch.float64).reshape(5, 3) + 1) * total
    t = base.clone().t()
    c.same("input is non-contiguous", t.is_contiguous(), False)
    c.equal("allreduce of a transposed tensor", hvd.allreduce(t, op=hvd.Sum), want.t())
    c.equal("... input unchanged", t, base.t())
    got = hvd.allreduce_(t, op=hvd.Sum)
    c.same("allreduce_ of a transposed tensor returns it", got is t, True)
    c.equal("allreduce_ of a transposed tensor", t, want.t())
    holder = base.clone()
    h = hvd.allreduce_async_(holder.t(), op=hvd.Sum, name="nc.async")
    hvd.synchronize(h)
    c.equal("allreduce_async_ of a transposed view writes the storage", holder, want)
    strided = base.clone()
    hvd.allreduce_(strided[::2], op=hvd.Sum)
    expect = base.clone()
    expect[::2] = want[::2]
    c.equal("allreduce_ of a strided slice writes only its rows", strided, expect)
    c.equal("allreduce_async out-of-place of a column", hvd.synchronize(hvd.allreduce_async(base[:, 1], op=hvd.Sum)),
            want[:, 1].contiguous())
    b = (torch.arange(6.).reshape(2, 3) + 10 * r).t()
    hvd.broadcast_(b, root_rank=n - 1)
    c.equal("broadcast_ of a transposed tensor", b, (torch.arange(6.).reshape(2, 3) + 10 * (n - 1)).t())
    g = hvd.allgather((torch.arange(6.).reshape(2, 3) + 10 * r).t())
    c.equal("allgather of a transposed tensor", g,
            torch.cat([(torch.arange(6.).reshape(2, 3) + 10 * s).t() for s in range(n)]))


def check_scales_and_compression(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    total = n * (n + 1) / 2
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = torch.full((9,), float(r + 1), dtype=dtype)
        c.equal(f"prescale/postscale {dtype}", hvd.allreduce(x, op=hvd.Sum, prescale_factor=4.0, postscale_factor=0.5),
                torch.full((9,), total * 2.0, dtype=dtype))
        c.equal(f"postscale with Average {dtype}", hvd.allreduce(x, postscale_factor=2.0),
                torch.full((9,), total / n * 2.0, dtype=dtype))
        y = x.clone()
        hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum, prescale_factor=0.5, name=f"sc.{dtype}"))
        c.equal(f"allreduce_async_ prescale {dtype}", y, torch.full((9,), total / 2, dtype=dtype))
    c.equal("int prescale", hvd.allreduce(torch.full((3,), r + 1, dtype=torch.int64), op=hvd.Sum, prescale_factor=2.0),
            torch.full((3,), int(total) * 2, dtype=torch.int64))
    # An integer Average with a postscale scales once by postscale / size, as Horovod does: 25 on
    # every rank times 3 is 75 (the sum, 25n, fits int8 up to 5 ranks; times 3 it would saturate).
    for count in (3, 70001):  # agreed with the announcements, and through the ring
        c.equal(f"int8 Average with a postscale ({count})",
                hvd.allreduce(torch.full((count,), 25, dtype=torch.int8), postscale_factor=3.0),
                torch.full((count,), 75, dtype=torch.int8))
    c.equal("int8 Average with a postscale, reducescatter",
            hvd.reducescatter(torch.full((2 * n,), 25, dtype=torch.int8), op=hvd.Average, postscale_factor=3.0),
            torch.full((2,), 75, dtype=torch.int8))
    c.equal("int32 Average with a postscale, truncated", hvd.allreduce(torch.full((2,), -7, dtype=torch.int32),
                                                                        postscale_factor=0.5),
            torch.full((2,), -3, dtype=torch.int32))
    for comp in ("fp16", "bf16"):
        compression = getattr(hvd.Compression, comp)
        for dtype in (torch.float32, torch.float64):
            x = torch.full((5,), r + 1.5, dtype=dtype)
            c.equal(f"compression {comp} {dtype}", hvd.allreduce(x, op=hvd.Sum, compression=compression),
                    torch.full((5,), total + 0.5 * n, dtype=dtype))
        xi = torch.full((5,), r + 1, dtype=torch.int32)
        c.equal(f"compression {comp} leaves int32", hvd.allreduce(xi, op=hvd.Sum, compression=compression),
                torch.full((5,), int(total), dtype=torch.int32))
        rs = hvd.reducescatter(torch.full((2 * n,), float(r + 1)), op=hvd.Sum, compression=compression)
        c.equal(f"reducescatter compression {comp}", rs, torch.full((2,), total))
        ga = hvd.grouped_allreduce([torch.full((2,), float(r + 1)), torch.full((3,), r + 1.0, dtype=torch.float64)],
                                   op=hvd.Sum, compression=compression)
        c.equal(f"grouped_allreduce compression {comp} [0]", ga[0], torch.full((2,), total))
        c.equal(f"grouped_allreduce compression {comp} [1]", ga[1], torch.full((3,), total, dtype=torch.float64))
    compressed, ctx = hvd.Compression.fp16.compress(torch.ones(2, dtype=torch.float64))
    c.same("fp16 compress", (compressed.dtype, ctx), (torch.float16, torch.float64))
    c.equal("fp16 decompress", hvd.Compression.fp16.decompress(compressed, ctx), torch.ones(2, dtype=torch.float64))


def check_grouped_allreduce(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    ranks = range(n)
    specs = [(torch.float32, 7), (torch.int64, 0), (torch.float64, 1000), (torch.int8, 3), (torch.bfloat16, 5)]
    inputs = [contribution("Sum", r, k, d).to(d) for d, k in specs]
    sums = [expected_allreduce("Sum", d, ranks, k) for d, k in specs]
    avgs = [expected_allreduce("Average", d, ranks, k) for d, k in specs]
    for i, got in enumerate(hvd.grouped_allreduce(inputs, op=hvd.Sum)):
        c.equal(f"grouped_allreduce[{i}]", got, sums[i])
    for i, got in enumerate(hvd.grouped_allreduce(inputs)):
        c.equal(f"grouped_allreduce Average[{i}]", got, avgs[i])
    for i, got in enumerate(hvd.synchronize(hvd.grouped_allreduce_async(inputs, op=hvd.Sum, name="ga"))):
        c.equal(f"grouped_allreduce_async[{i}]", got, sums[i])
    copies = [t.clone() for t in inputs]
    outs = hvd.grouped_allreduce_(copies, op=hvd.Sum)
    c.same("grouped_allreduce_ returns the inputs", all(o is t for o, t in zip(outs, copies)), True)
    for i, got in enumerate(copies):
        c.equal(f"grouped_allreduce_[{i}]", got, sums[i])
    copies = [t.clone() for t in inputs]
    outs = hvd.synchronize(hvd.grouped_allreduce_async_(copies, op=hvd.Max, name="ga_"))
    for i, (got, (d, k)) in enumerate(zip(copies, specs)):
        c.equal(f"grouped_allreduce_async_[{i}]", got, expected_allreduce("Max", d, ranks, k))
    c.same("grouped_allreduce_async_ result is the inputs", all(o is t for o, t in zip(outs, copies)), True)
    c.raises("grouped_allreduce with average and op", [ValueError], "op",
             lambda: hvd.grouped_allreduce(inputs, average=False, op=hvd.Sum))


def check_allgather(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    for dtype in DTYPES:
        rows = r % 3  # rank 0 (and 3) contribute no rows
        x = (torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2) + 10 * r).to(dtype)
        want = torch.cat([(torch.arange((s % 3) * 2, dtype=torch.float64).reshape(s % 3, 2) + 10 * s).to(dtype)
                          for s in range(n)])
        c.equal(f"allgather {dtype}", hvd.allgather(x), want)
        c.equal(f"allgather_async {dtype}", hvd.synchronize(hvd.allgather_async(x, name=f"ag.{dtype}")), want)
    big = torch.full((LARGE,), r, dtype=torch.int32)
    c.equal("allgather large", hvd.allgather(big), torch.arange(n, dtype=torch.int32).repeat_interleave(LARGE))
    ones = [torch.full((r + 1,), r, dtype=torch.int16), torch.full((2, 1, 2), float(r))]
    wants = [torch.cat([torch.full((s + 1,), s, dtype=torch.int16) for s in range(n)]),
             torch.cat([torch.full((2, 1, 2), float(s)) for s in range(n)])]
    for label, outs in [("grouped_allgather", hvd.grouped_allgather(ones)),
                        ("grouped_allgather_async", hvd.synchronize(hvd.grouped_allgather_async(ones, name="gag")))]:
        c.same(f"{label} length", len(outs), 2)
        for i, (got, want) in enumerate(zip(outs, wants)):
            c.equal(f"{label}[{i}]", got, want)
    c.raises("allgather of a 0-d tensor", [ValueError], "scalar", lambda: hvd.allgather(torch.tensor(1.0)))


def check_broadcast(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        for dtype in (torch.uint8, torch.int64, torch.bfloat16, torch.float64, torch.bool):
            x = ((torch.arange(6, dtype=torch.float64) + r) % 2 if dtype == torch.bool
                 else torch.arange(6, dtype=torch.float64) + 10 * r).to(dtype)
            want = ((torch.arange(6, dtype=torch.float64) + root) % 2 if dtype == torch.bool
                    else torch.arange(6, dtype=torch.float64) + 10 * root).to(dtype)
            before = x.clone()
            c.equal(f"broadcast root {root} {dtype}", hvd.broadcast(x, root_rank=root), want)
            c.equal(f"broadcast root {root} {dtype} leaves the input", x, before)
            c.equal(f"broadcast_async root {root} {dtype}",
                    hvd.synchronize(hvd.broadcast_async(x, root, name=f"bc.{root}.{dtype}")), want)
            y = x.clone()
            c.same(f"broadcast_ root {root} returns the input", hvd.broadcast_(y, root) is y, True)
            c.equal(f"broadcast_ root {root} {dtype}", y, want)
            y = x.clone()
            hvd.synchronize(hvd.broadcast_async_(y, root, name=f"bc_.{root}.{dtype}"))
            c.equal(f"broadcast_async_ root {root} {dtype}", y, want)
        c.equal(f"broadcast large root {root}", hvd.broadcast(torch.full((LARGE,), r, dtype=torch.int32), root),
                torch.full((LARGE,), root, dtype=torch.int32))
        c.equal(f"broadcast 0 elements root {root}", hvd.broadcast(torch.empty(0, 3), root), torch.empty(0, 3))
    c.raises("broadcast from a rank outside the job", [ValueError], str(n), lambda: hvd.broadcast(torch.ones(1), n))


def check_alltoall(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    # Equal splits: rank r sends row block [2j, 2j+2) of its tensor to rank j.
    x = torch.arange(2 * n, dtype=torch.int64) + 100 * r
    want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.int64) + 100 * s for s in range(n)])
    c.equal("alltoall without splits", hvd.alltoall(x), want)
    out, received = hvd.synchronize(hvd.alltoall_async(x, name="a2a.eq"))
    c.equal("alltoall_async without splits", out, want)
    c.equal("alltoall_async without splits: received splits", received, torch.full((n,), 2, dtype=torch.int32))
    for dtype in (torch.float32, torch.int8, torch.bool):
        send = torch.cat([alltoall_block(r, j, dtype) for j in range(n)])
        splits = [sent_rows(r, j) for j in range(n)]
        want = torch.cat([alltoall_block(s, r, dtype) for s in range(n)])
        want_received = torch.tensor([sent_rows(s, r) for s in range(n)], dtype=torch.int32)
        for label, sp in [("list", splits), ("int32 tensor", torch.tensor(splits, dtype=torch.int32)),
                          ("int64 tensor", torch.tensor(splits, dtype=torch.int64))]:
            result = hvd.alltoall(send, splits=sp)
            c.same(f"alltoall {label} splits {dtype} returns a pair", isinstance(result, tuple) and len(result), 2)
            c.equal(f"alltoall {label} splits {dtype}", result[0], want)
            c.equal(f"alltoall {label} splits {dtype}: received", result[1], want_received)
        out, received = hvd.synchronize(hvd.alltoall_async(send, splits=splits, name=f"a2a.{dtype}"))
        c.equal(f"alltoall_async splits {dtype}", out, want)
        c.equal(f"alltoall_async splits {dtype}: received", received, want_received)
    if n > 1:
        c.raises("alltoall of rows not divisible by size", [ValueError], "divisible",
                 lambda: hvd.alltoall(torch.ones(n + 1)))
    c.raises("alltoall with splits not summing to the rows", [ValueError], "split",
             lambda: hvd.alltoall(torch.ones(n + 1), splits=[1] * n))
    # Fractional splits are refused, not truncated ([1.5, ...] once sent 1 row).
    for form, splits in (("list", [1.5] + [1.0] * (n - 1)), ("tensor", torch.tensor([1.5] + [1.0] * (n - 1)))):
        c.raises(f"alltoall with fractional splits ({form})", [ValueError], "alltoall splits must be whole numbers",
                 lambda: hvd.alltoall(torch.ones(n + 1), splits=splits))


def check_reducescatter(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    total = n * (n + 1) // 2
    for rows in (n, 2 * n + 1, 1, 0):
        for dtype in (torch.int32, torch.float32, torch.float64, torch.bfloat16):
            pattern = torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2) % 4 + 1
            x = (pattern * (r + 1)).to(dtype)
            full = pattern * total
            off, k = rows_of(rows, n, r)
            mine = full[off:off + k]
            c.equal(f"reducescatter Sum {rows} rows {dtype}", hvd.reducescatter(x, op=hvd.Sum), mine.to(dtype))
            avg = torch.trunc(mine / n) if dtype == torch.int32 else mine / n
            c.equal(f"reducescatter Average {rows} rows {dtype}", hvd.reducescatter(x), avg.to(dtype))
            c.equal(f"reducescatter_async {rows} rows {dtype}",
                    hvd.synchronize(hvd.reducescatter_async(x, name=f"rs.{rows}.{dtype}", op=hvd.Sum)),
                    mine.to(dtype))
            if dtype.is_floating_point:
                c.equal(f"reducescatter scaled {rows} rows {dtype}",
                        hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
                        (mine / 2).to(dtype))
    x = torch.full((LARGE,), float(r + 1))
    off, k = rows_of(LARGE, n, r)
    c.equal("reducescatter large", hvd.reducescatter(x, op=hvd.Max), torch.full((k,), float(n)))
    inputs = [torch.full((n + 1, 3), float(r + 1)), torch.full((2 * n,), r + 1, dtype=torch.int64)]
    wants = [torch.full((rows_of(n + 1, n, r)[1], 3), float(total)), torch.full((2,), total, dtype=torch.int64)]
    for label, outs in [("grouped_reducescatter", hvd.grouped_reducescatter(inputs, op=hvd.Sum)),
                        ("grouped_reducescatter_async",
                         hvd.synchronize(hvd.grouped_reducescatter_async(inputs, name="grs", op=hvd.Sum)))]:
        for i, (got, want) in enumerate(zip(outs, wants)):
            c.equal(f"{label}[{i}]", got, want)
    avg = hvd.grouped_reducescatter([torch.full((n,), float(r + 1) * n)])
    c.equal("grouped_reducescatter Average", avg[0], torch.full((1,), float(total)))


def check_sync_and_names(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    total = n * (n + 1) // 2
    hvd.barrier()
    c.same("barrier returns None", hvd.barrier(), None)
    h = hvd.allreduce_async(torch.full((4,), float(r + 1)), op=hvd.Sum, name="polled")
    polls = 0
    while not hvd.poll(h):  # spins until complete; the pytest timeout bounds it
        polls += 1
        os.sched_yield()
    c.same("poll after completion", hvd.poll(h), True)
    c.equal("synchronize after poll", hvd.synchronize(h), torch.full((4,), float(total)))
    c.same("synchronize of a consumed handle", hvd.synchronize(h), None)
    c.same("synchronize of an unknown handle", hvd.synchronize(987654321), None)
    c.raises("poll of an unknown handle", [ValueError], "987654321", lambda: hvd.poll(987654321))
    # Unnamed asynchronous operations are named in call order, so they match across ranks.
    handles = [hvd.allreduce_async(torch.full((3,), float((r + 1) * i)), op=hvd.Sum) for i in range(1, 9)]
    handles.append(hvd.allgather_async(torch.full((1,), r)))
    handles.append(hvd.broadcast_async(torch.full((2,), r), root_rank=n - 1))
    handles += [hvd.allreduce_async(torch.full((2,), r + 1), op=hvd.Max) for _ in range(3)]
    results = [hvd.synchronize(h) for h in reversed(handles)][::-1]
    for i in range(8):
        c.equal(f"unnamed async allreduce {i}", results[i], torch.full((3,), float(total * (i + 1))))
    c.equal("unnamed async allgather", results[8], torch.arange(n))
    c.equal("unnamed async broadcast", results[9], torch.full((2,), n - 1))
    for i in range(10, 13):
        c.equal(f"unnamed async Max {i}", results[i], torch.full((2,), n))
    # A name in flight cannot be reused. Rank k checks in round k while the others hold their
    # copy of "dup.k" back until rank k has passed a sync point, so "dup.k" cannot complete early
    # (with one rank nothing can hold it back: it may complete before the second call).
    for k in range(n if n > 1 else 0):
        if r == k:
            first = hvd.allreduce_async(torch.full((2,), float(r + 1)), name=f"dup.{k}", op=hvd.Sum)
            c.raises("duplicate name in flight", [ValueError], f"dup.{k}",
                     lambda: hvd.allreduce_async(torch.ones(2), name=f"dup.{k}"))
            hvd.allreduce(torch.ones(1), name=f"dup.sync.{k}")
            c.equal("first of the duplicates completes", hvd.synchronize(first), torch.full((2,), float(total)))
        else:
            hvd.allreduce(torch.ones(1), name=f"dup.sync.{k}")
            hvd.allreduce(torch.full((2,), float(r + 1)), name=f"dup.{k}", op=hvd.Sum)
    c.equal("a name can be reused once complete", hvd.allreduce(torch.full((2,), float(r + 1)), name="dup.0",
                                                                op=hvd.Sum), torch.full((2,), float(total)))


def check_join(hvd, c, env):
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        c.same("join on one rank", hvd.join(), 0)
        return
    # Rank n-1 joins first; ranks 0..n-2 keep reducing; then ranks 0..n-3 join and rank n-2 reduces
    # alone (it can only complete once every other rank joined), so rank n-2 joins last.
    active = list(range(n - 1))
    values = {s: float(s + 1) for s in range(n)}
    if r == n - 1:
        c.same("early joiner: join returns the last rank", hvd.join(), n - 2)
        return
    for i in range(3):
        for op, want in [("Sum", sum(values[s] for s in active)), ("Average", sum(values[s] for s in active) / n),
                         ("Min", min(values[s] for s in active)), ("Max", max(values[s] for s in active)),
                         ("Product", float(torch.tensor([values[s] for s in active]).prod()))]:
            got = hvd.allreduce(torch.full((5,), values[r]), op=getattr(hvd, op), name=f"join.{op}.{i}")
            c.equal(f"allreduce {op} while rank {n - 1} joined (round {i})", got,
                    torch.full((5,), float(want)))
    # The joined rank's neutral values are not scaled: a prescale factor applies to real inputs only.
    mine = torch.tensor([values[r], -2.0 * values[r]])
    scaled = torch.stack([torch.tensor([values[s], -2.0 * values[s]]) * -1.5 for s in active])
    for op, want in [("Product", scaled.prod(0)), ("Max", scaled.max(0).values), ("Min", scaled.min(0).values)]:
        got = hvd.allreduce(mine, op=getattr(hvd, op), prescale_factor=-1.5, name=f"join.scaled.{op}")
        c.equal(f"allreduce {op} with prescale_factor while rank {n - 1} joined", got, want)
    ints = torch.tensor([100 * (r + 1), -7], dtype=torch.int32)
    c.equal("int32 Min with prescale_factor while joined",
            hvd.allreduce(ints, op=hvd.Min, prescale_factor=-1.0, name="join.scaled.int"),
            torch.tensor([-100 * (n - 1), 7], dtype=torch.int32))
    group = [torch.full((3,), values[r]), torch.full((2,), values[r] + 1)]  # fused: the members are small
    want = [torch.full((3,), float(torch.tensor([2 * values[s] for s in active]).prod())),
            torch.full((2,), float(torch.tensor([2 * (values[s] + 1) for s in active]).prod()))]
    for i, (g, w) in enumerate(zip(hvd.grouped_allreduce(group, op=hvd.Product, prescale_factor=2.0,
                                                         name="join.scaled.group"), want)):
        c.equal(f"grouped Product with prescale_factor while joined, member {i}", g, w)
    h = hvd.allreduce_async_(torch.full((3,), r + 1, dtype=torch.int32), op=hvd.Sum, name="join.async")
    c.equal("allreduce_async_ while joined", hvd.synchronize(h),
            torch.full((3,), sum(s + 1 for s in active), dtype=torch.int32))
    if r == n - 2:
        c.equal("allreduce with every other rank joined", hvd.allreduce(torch.full((2,), 7.0), op=hvd.Sum,
                                                                         name="join.alone"), torch.full((2,), 7.0))
    c.same("join returns the last rank", hvd.join(), n - 2)


def static_sets(n):
    """Static process sets for world size n (n >= 2): {0, n-1} (or {0}) and the odd ranks."""
    return [[0, n - 1] if n > 2 else [0], [s for s in range(n) if s % 2 == 1]]


def check_process_set_ops(hvd, c, ps, label):
    """Collectives restricted to ps, on every rank (non-members only check membership)."""
    r = hvd.rank()
    members = ps.ranks
    c.same(f"{label}: size", ps.size(), len(members))
    if r in members:
        c.same(f"{label}: rank", ps.rank(), members.index(r))
    else:
        c.raises(f"{label}: rank of a non-member", [ValueError], f"rank {r} is not part of process set",
                 ps.rank)
    c.same(f"{label}: included", ps.included(), r in members)
    if r not in members:
        c.raises(f"{label}: allreduce by a non-member", [ValueError], "not", lambda: hvd.allreduce(
            torch.ones(1), process_set=ps, name=f"{label}.outsider"))
        return
    m = len(members)
    c.equal(f"{label}: allreduce Sum", hvd.allreduce(torch.full((3,), r + 1), op=hvd.Sum, process_set=ps),
            torch.full((3,), sum(s + 1 for s in members)))
    c.equal(f"{label}: allreduce Average", hvd.allreduce(torch.full((3,), float(r + 1)), process_set=ps),
            torch.full((3,), sum(s + 1.0 for s in members) / m))
    c.equal(f"{label}: allgather", hvd.allgather(torch.full((r % 2 + 1,), r), process_set=ps),
            torch.cat([torch.full((s % 2 + 1,), s) for s in members]))
    c.equal(f"{label}: broadcast from global rank {members[-1]}",
            hvd.broadcast(torch.full((2,), r), root_rank=members[-1], process_set=ps),
            torch.full((2,), members[-1]))
    c.equal(f"{label}: alltoall", hvd.alltoall(torch.full((m,), r), process_set=ps), torch.tensor(members))
    c.equal(f"{label}: reducescatter", hvd.reducescatter(torch.full((m,), r + 1), op=hvd.Sum, process_set=ps),
            torch.full((1,), sum(s + 1 for s in members)))
    c.equal(f"{label}: grouped_allreduce", hvd.grouped_allreduce([torch.full((1,), r)], op=hvd.Max,
                                                                  process_set=ps)[0], torch.full((1,), members[-1]))
    c.same(f"{label}: barrier", hvd.barrier(process_set=ps), None)


def check_static_process_sets(hvd, c, env):
    n = int(env["HORO_SIZE"])
    sets = [hvd.ProcessSet(ranks) for ranks in static_sets(n)] if n > 1 else []
    hvd.init(process_sets=sets)
    c.same("static sets registered", [ps.process_set_id is not None for ps in sets], [True] * len(sets))
    for ps in sets:
        check_process_set_ops(hvd, c, ps, f"static set {ps.ranks}")
    c.raises("op on an unregistered set", [ValueError], "not registered",
             lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet(list(range(n)))))
    c.raises("barrier on an unregistered set", [ValueError], "not registered",
             lambda: hvd.barrier(process_set=hvd.ProcessSet([0])))
    c.equal("global op after set ops", hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after.sets"),
            torch.full((1,), float(n)))


def check_dynamic_process_sets(hvd, c, env):
    before_init = {hvd.global_process_set: "global"}
    hvd.init(process_sets="dynamic")
    r, n = hvd.rank(), hvd.size()
    c.same("a set made a dict key before init is found after (hashed by identity, as Horovod's)",
           before_init.get(hvd.global_process_set), "global")
    if n == 1:
        c.raises("adding a set equal to the global set", [ValueError], "exists", lambda: hvd.add_process_set([0]))
        return
    first_ranks, second_ranks = static_sets(n)
    first = hvd.add_process_set(first_ranks[::-1])
    c.same("add_process_set(list) returns a registered set", (first.process_set_id is not None, first.ranks),
           (True, first_ranks))
    check_process_set_ops(hvd, c, first, "dynamic set")
    second = hvd.ProcessSet(second_ranks)
    keyed = {second: "second", first: "first"}
    c.same("add_process_set(ProcessSet) returns it", hvd.add_process_set(second) is second, True)
    c.same("a set stays a dict key when registered", keyed.get(second), "second")
    c.same("another set of the same ranks is another set", hvd.ProcessSet(second_ranks) in keyed, False)
    check_process_set_ops(hvd, c, second, "second dynamic set")
    c.raises("adding the same ranks twice", [ValueError], "exists", lambda: hvd.add_process_set(list(first.ranks)))
    c.same("remove_process_set", hvd.remove_process_set(first), True)
    c.same("removed set is unregistered", (first.process_set_id, first.size()), (None, None))
    c.same("... and still a dict key", keyed.get(first), "first")
    c.same("removing it again", hvd.remove_process_set(first), False)
    c.same("removing the global set", hvd.remove_process_set(hvd.global_process_set), False)
    c.raises("op on a removed set", [ValueError], "not registered",
             lambda: hvd.allreduce(torch.ones(1), process_set=first))
    check_process_set_ops(hvd, c, second, "remaining dynamic set")
    c.equal("global op after dynamic sets", hvd.allreduce(torch.full((1,), r), op=hvd.Sum, name="after.dyn"),
            torch.full((1,), n * (n - 1) // 2))


def check_autograd(hvd, c, env):
    r, n = hvd.rank(), hvd.size()

    def weight(s, shape):  # rank s's upstream gradient; the mean over ranks is an integer
        return (torch.arange(1.0, 1.0 + torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
                * (2 * s + 1))

    def grad_of(fn, x):
        x = x.clone().requires_grad_(True)
        y = fn(x)
        y = y[0] if isinstance(y, tuple) else y
        (y * weight(r, y.shape)).sum().backward()
        return x.grad

    shape = (2, 3)
    x = torch.full(shape, float(r + 1), dtype=torch.float64)
    sum_w = sum(weight(s, shape) for s in range(n))
    c.equal("allreduce Sum grad", grad_of(lambda t: hvd.allreduce(t, op=hvd.Sum), x), sum_w)
    c.equal("allreduce Average grad", grad_of(lambda t: hvd.allreduce(t), x), sum_w / n)
    c.equal("allreduce scaled grad", grad_of(lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0,
                                                                     postscale_factor=0.5 ** 4), x),
            sum_w / 8)
    # Min, Max and Product: Horovod would reduce the incoming gradient with the op, which is not
    # their gradient; every rank raises instead (no collective is issued, so none waits).
    for op in (hvd.Min, hvd.Max, hvd.Product):
        c.raises(f"allreduce op {op} grad", [NotImplementedError], "defined for Sum, Average and Adasum only",
                 lambda: grad_of(lambda t: hvd.allreduce(t, op=op), x))
        c.raises(f"grouped_allreduce op {op} grad", [NotImplementedError], "defined for Sum, Average and Adasum",
                 lambda: grad_of(lambda t: hvd.grouped_allreduce([t], op=op)[0], x))
    xs = [x.clone().requires_grad_(True), torch.full((4,), 1.0, dtype=torch.float64, requires_grad=True)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    sum(((y * weight(r, y.shape)).sum() for y in ys)).backward()
    c.equal("grouped_allreduce grad [0]", xs[0].grad, sum_w)
    c.equal("grouped_allreduce grad [1]", xs[1].grad, sum(weight(s, (4,)) for s in range(n)))
    # allgather: the averaged allreduce of the gradient, this rank's rows.
    rows = [s % 2 + 1 for s in range(n)]
    xg = torch.full((rows[r], 2), float(r), dtype=torch.float64)
    gathered = (sum(rows), 2)
    mean_w = sum(weight(s, gathered) for s in range(n)) / n
    c.equal("allgather grad", grad_of(lambda t: hvd.allgather(t), xg),
            mean_w[sum(rows[:r]):sum(rows[:r + 1])])
    # grouped_allgather: each member as allgather alone, with its own rows per rank.
    rows2 = [(n - s) % 3 + 1 for s in range(n)]  # offsets unlike rows' from 2 ranks on
    xgs = [xg.clone().requires_grad_(True), torch.full((rows2[r],), float(r), dtype=torch.float64, requires_grad=True)]
    ygs = hvd.grouped_allgather(xgs)
    sum(((y * weight(r, y.shape)).sum() for y in ygs)).backward()
    c.equal("grouped_allgather grad [0]", xgs[0].grad, mean_w[sum(rows[:r]):sum(rows[:r + 1])])
    mean_w2 = sum(weight(s, (sum(rows2),)) for s in range(n)) / n
    c.equal("grouped_allgather grad [1]", xgs[1].grad, mean_w2[sum(rows2[:r]):sum(rows2[:r + 1])])
    # broadcast: the root gets the averaged gradient, the others zeros.
    for root in sorted({0, n - 1}):
        want = sum_w / n if r == root else torch.zeros(shape, dtype=torch.float64)
        c.equal(f"broadcast grad root {root}", grad_of(lambda t: hvd.broadcast(t, root), x), want)
    # alltoall: the reverse alltoall. Rank r sends rows[j]=(r+j)%3 rows to j and receives (s+r)%3 from s.
    splits = [sent_rows(r, j) for j in range(n)]
    xa = torch.zeros(sum(splits), 2, dtype=torch.float64)
    got = grad_of(lambda t: hvd.alltoall(t, splits=splits), xa)
    # The rows rank r sent to j are one block of j's output; their gradient is j's upstream gradient there.
    want = []
    for j in range(n):
        received_j = [sent_rows(s, j) for s in range(n)]
        w = weight(j, (sum(received_j), 2))
        start = sum(received_j[:r])
        want.append(w[start:start + splits[j]])
    c.equal("alltoall grad", got, torch.cat(want))
    got = grad_of(lambda t: hvd.alltoall(t), torch.zeros(2 * n, dtype=torch.float64))
    c.equal("alltoall without splits grad", got, torch.cat([weight(j, (2 * n,))[2 * r:2 * r + 2] for j in range(n)]))
    # reducescatter: the allgather of the gradients times the scales, and times the set's size for Sum
    # (Horovod's factors: its test_horovod_reducescatter_grad wants size for Sum, 1 for Average).
    for rows_total in (n, 2 * n + 1):
        xr = torch.ones(rows_total, 2, dtype=torch.float64)
        parts = [rows_of(rows_total, n, s)[1] for s in range(n)]
        cat_w = torch.cat([weight(s, (parts[s], 2)) for s in range(n)])
        c.equal(f"reducescatter Sum grad {rows_total}", grad_of(lambda t: hvd.reducescatter(t, op=hvd.Sum), xr),
                cat_w * n)
        c.equal(f"reducescatter scaled grad {rows_total}",
                grad_of(lambda t: hvd.reducescatter(t, op=hvd.Sum, prescale_factor=4.0, postscale_factor=0.5), xr),
                cat_w * (2 * n))
        got = grad_of(lambda t: hvd.reducescatter(t), xr * n)
        c.equal(f"reducescatter Average grad {rows_total}", got, cat_w)
    # Min, Max and Product: the allgathered gradient would reach every rank, also those whose values
    # lost; every rank raises (as for the allreduce above).
    for op in (hvd.Min, hvd.Max, hvd.Product):
        c.raises(f"reducescatter op {op} grad", [NotImplementedError], "defined for Sum and Average only",
                 lambda: grad_of(lambda t: hvd.reducescatter(t, op=op), torch.ones(n, 2, dtype=torch.float64)))
        c.raises(f"grouped_reducescatter op {op} grad", [NotImplementedError], "defined for Sum and Average only",
                 lambda: grad_of(lambda t: hvd.grouped_reducescatter([t], op=op)[0],
                                 torch.ones(n, 2, dtype=torch.float64)))
    # grouped_reducescatter: each member as reducescatter alone.
    xrs = [torch.ones(n, 2, dtype=torch.float64, requires_grad=True),
           torch.ones(2 * n + 1, dtype=torch.float64, requires_grad=True)]
    yrs = hvd.grouped_reducescatter(xrs, prescale_factor=4.0, postscale_factor=0.5)
    sum(((y * weight(r, y.shape)).sum() for y in yrs)).backward()
    parts = [rows_of(2 * n + 1, n, s)[1] for s in range(n)]
    c.equal("grouped_reducescatter Average scaled grad [0]", xrs[0].grad,
            torch.cat([weight(s, (1, 2)) for s in range(n)]) * 2.0)
    c.equal("grouped_reducescatter Average scaled grad [1]", xrs[1].grad,
            torch.cat([weight(s, (parts[s],)) for s in range(n)]) * 2.0)
    xs_sum = torch.ones(2 * n, dtype=torch.float64, requires_grad=True)
    hvd.grouped_reducescatter([xs_sum], op=hvd.Sum)[0].backward(torch.ones(2, dtype=torch.float64))
    c.equal("grouped_reducescatter Sum grad", xs_sum.grad, torch.full((2 * n,), float(n), dtype=torch.float64))


GROUPS = [check_topology, check_allreduce_matrix, check_noncontiguous, check_scales_and_compression,
          check_grouped_allreduce, check_allgather, check_broadcast, check_alltoall, check_reducescatter,
          check_sync_and_names, check_repeated_named_calls, check_repeated_allgathers,
          check_repeated_reducescatters_and_alltoalls, check_join,
          check_autograd]


def start_handles_left_at_shutdown(hvd):
    """Asynchronous operations that shutdown() finds unsynchronized: four that completed, and (on
    more than one rank) one that cannot, its name being this rank's own."""
    r, n = hvd.rank(), hvd.size()
    x = torch.full((3,), float(r + 1))
    done = {
        "allreduce_async": hvd.allreduce_async(x, name="left.copy", op=hvd.Sum),
        "allreduce_async_": hvd.allreduce_async_(x.clone(), name="left.in_place", op=hvd.Sum),
        "allgather_async": hvd.allgather_async(x[:1], name="left.gather"),
        "grouped_allreduce_async": hvd.grouped_allreduce_async([x, 2 * x], name="left.group", op=hvd.Sum),
    }
    while not all(hvd.poll(h) for h in done.values()):
        pass
    cut_short = hvd.allreduce_async(x, name=f"left.rank{r}") if n > 1 else None
    return done, cut_short


def check_handles_left_at_shutdown(hvd, c, pending):
    """After shutdown(), as in Horovod, synchronize() of a completed operation returns its result
    (poll() says it is done), and that of one shutdown cut short raises a HorovodInternalError."""
    done, cut_short = pending
    c.same("poll(allgather_async) after shutdown", hvd.poll(done["allgather_async"]), True)
    gathered = hvd.synchronize(done["allgather_async"]).tolist()  # every rank's r + 1
    c.same("synchronize(allgather_async) after shutdown", gathered, [float(i + 1) for i in range(len(gathered))])
    total = sum(gathered)
    for label in ("allreduce_async", "allreduce_async_"):
        c.same(f"poll({label}) after shutdown", hvd.poll(done[label]), True)
        c.same(f"synchronize({label}) after shutdown", hvd.synchronize(done[label]).tolist(), [total] * 3)
    group = hvd.synchronize(done["grouped_allreduce_async"])
    c.same("synchronize(grouped_allreduce_async) after shutdown", [g.tolist() for g in group],
           [[total] * 3, [2 * total] * 3])
    c.same("synchronize of a handle already synchronized", hvd.synchronize(done["allreduce_async"]), None)
    if cut_short is not None:
        c.raises("synchronize of an operation shutdown cut short", [hvd.HorovodInternalError], "shut down",
                 lambda: hvd.synchronize(cut_short))


def run_all_checks():
    """Runs on every rank; returns {group: (checks, failures)}."""
    import traceback

    import horo_torch as hvd

    env = dict(os.environ)
    report = {}

    def run_group(fn):
        c = Checks()
        try:
            fn(hvd, c, env)
        except Exception:  # noqa: BLE001 - reported, and the run goes on with the next group
            c.fail(f"raised:\n{traceback.format_exc()}")
        report[fn.__name__] = (c.count, c.failures)

    run_group(check_before_init)
    hvd.init()
    for fn in GROUPS:
        run_group(fn)
    pending = start_handles_left_at_shutdown(hvd)
    hvd.barrier()
    hvd.shutdown()

    def handles_left_at_shutdown(hvd, c, env):
        check_handles_left_at_shutdown(hvd, c, pending)

    run_group(handles_left_at_shutdown)
    for fn in (check_static_process_sets, check_dynamic_process_sets):
        run_group(fn)
        if hvd.is_initialized():
            hvd.barrier()
            hvd.shutdown()

    def after_shutdown(hvd, c, env):
        c.same("is_initialized after shutdown", hvd.is_initialized(), False)
        c.raises("allreduce after shutdown", [ValueError, hvd.HoroError], "init",
                 lambda: hvd.allreduce(torch.ones(1)))
        c.raises("rank after shutdown", [ValueError], "init", lambda: hvd.rank())

    run_group(after_shutdown)
    return report


@pytest.mark.parametrize("size", SIZES, ids=[f"np{n}" for n in SIZES])
def test_torch_collectives(size):
    reports = horo_runner.run(run_all_checks, num_proc=size, env={"HORO_PEER_TIMEOUT_SECONDS": "60"})
    assert len(reports) == size
    groups = ["check_before_init", *[g.__name__ for g in GROUPS], "handles_left_at_shutdown",
              "check_static_process_sets", "check_dynamic_process_sets", "after_shutdown"]
    problems = []
    for rank, report in enumerate(reports):
        assert list(report) == groups
        for group, (count, failures) in report.items():
            problems += [f"rank {rank} {group}: {f}" for f in failures]
            expect_checks = size > 1 or group != "check_dynamic_process_sets"
            if expect_checks and count == 0:
                problems.append(f"rank {rank} {group}: no check ran")
    assert not problems, "\n".join(problems[:60])


def test_mpi_ops_carries_horovods_basics_too():
    """horovod.torch.mpi_ops also exports the basics; scripts import them from there."""
    import horo_torch
    import horo_torch.mpi_ops as mpi_ops
    for name in ("init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
                 "cross_size", "start_timeline", "stop_timeline", "ProcessSet", "global_process_set",
                 "add_process_set", "remove_process_set", "HorovodInternalError", "allreduce", "synchronize",
                 "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built",
                 "ddl_built", "ccl_built", "cuda_built", "rocm_built", "sycl_built", "is_homogeneous",
                 "sparse_allreduce_async"):
        assert getattr(mpi_ops, name) is getattr(horo_torch, name), name
    from horo_torch.mpi_ops import sparse_allreduce_async  # noqa: F401 (the from-import form works too)
    assert mpi_ops.handle_average_backwards_compatibility(None, None) is mpi_ops.Average
    with pytest.warns(DeprecationWarning, match="replaced with `op`"):
        assert mpi_ops.handle_average_backwards_compatibility(None, False) is mpi_ops.Sum
    assert mpi_ops.handle_average_backwards_compatibility(mpi_ops.Max, None) is mpi_ops.Max
    with pytest.raises(ValueError, match="supersedes average"):
        mpi_ops.handle_average_backwards_compatibility(mpi_ops.Sum, True)


def test_elastic_is_refused_by_name():
    """Horovod's hvd.elastic (not implemented here) fails with a message that says so, not a bare miss."""
    import horo_torch
    with pytest.raises(AttributeError, match=r"horo_torch\.elastic: elastic training .* is not implemented"):
        horo_torch.elastic.run
    for statement in ("import horo_torch.elastic", "from horo_torch import elastic", "from horo_torch.elastic import run"):
        with pytest.raises(ImportError, match=r"horo_torch\.elastic: elastic training .* is not implemented"):
            exec(statement, {})
    with pytest.raises(AttributeError, match="module 'horo_torch' has no attribute 'no_such_name'"):
        horo_torch.no_such_name
